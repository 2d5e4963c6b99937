"""Spill and restore: the exactness property with sessions parked between any two steps,
restores in a new process, writers killed mid-write, refused files, byte accounting."""
import os
import random
import time

import pytest
import torch
from helpers import output_session, parking_reader, vocab_ids
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from adapters.model.qwen35 import ModelInfo
from block_store.session import state_bytes
from shadow_plugin.reader.reader import Reader

G = 64
SIZES = st.one_of(st.sampled_from([1, G - 1, G, G + 1, 2 * G + 3]), st.integers(0, 150))
op = st.tuples(st.sampled_from(["a", "b", "c"]),
               st.sampled_from(["prompt", "rewrite", "output", "read", "ask"]), SIZES)


def _check_accounting(reader, in_use):
    """Resident bytes: each referenced page once, the GDN table's entries, the sessions' GDN
    states; within the cap unless only the session in use is left; a session's own figure
    counts its pages in full."""
    s = reader.stats()
    resident = list(reader.table.resident.values())
    held = resident + [sc.state for sc in reader._scratch.values()]
    pages = {p.index for st in held for p in st.pages}
    live = sum(c.nbytes + r.nbytes for st in resident for c, r in st.gdn)
    assert s["pages"]["pinned"] == len(pages)
    assert s["resident_bytes"] == len(pages) * s["page_bytes"] + s["gdn_entry_bytes"] + live
    assert s["resident_bytes"] <= s["resident_cap_bytes"] or len(resident) <= 1
    for sid, state in reader.table.resident.items():
        assert s["sessions"][sid]["bytes"] == state_bytes(state, s["page_bytes"])


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(ops=st.lists(op, min_size=1, max_size=10), seed=st.integers(0, 2**32 - 1),
       cap=st.sampled_from([0, 1, 300_000]), disk=st.booleans())
def test_any_history_with_spills_equals_fresh_prefill(tiny, tmp_path_factory, ops, seed, cap,
                                                      disk):
    rng = random.Random(seed)
    disk_dir = tmp_path_factory.mktemp("disk") if disk else None
    reader = Reader(tiny, grid=G, max_checkpoints=3, resident_bytes=cap,
                    disk_dir=disk_dir)
    for sid in "abc":
        reader.feed(sid, vocab_ids(rng, rng.randrange(1, 200)), "prompt")
    for sid, kind, n in ops:
        if kind == "prompt":
            reader.feed(sid, reader.ids(sid) + vocab_ids(rng, n), "prompt")
        elif kind == "rewrite":
            ids = reader.ids(sid)
            cut = rng.randrange(0, len(ids) + 1)
            reader.feed(sid, ids[:cut] + vocab_ids(rng, max(n, 1)), "prompt")
        elif kind == "output":
            reader.feed(sid, vocab_ids(rng, n), "output")
        elif kind == "read":
            reader.read(sid, max_chunks=n % 4 or None)
        else:
            reader.ask(sid, "Which?", ["x", "y"], at=rng.randrange(1, len(reader.ids(sid)) + 1))
        _check_accounting(reader, sid)
        assert reader.check_exact(sid)
    stats = reader.stats()
    if cap == 0:
        assert stats["spills"] + stats["drops"] > 0
    for sid in "abc":                        # every session, wherever it is, is still exact
        assert reader.check_exact(sid)
    assert stats["refusals"] == 0


def test_spill_and_restore_is_bitwise(tiny, tmp_path):
    r = parking_reader(tiny, tmp_path)
    output_session(r, "a")
    before = {k: v.clone() for k, v in r.state_tensors("a").items()}
    cps = r.checkpoint_positions("a")
    output_session(r, "b", seed=1)                  # cap 0: "a" is parked when "b" is used
    assert r.stats()["sessions"]["a"]["residency"] == "disk"
    after = r.state_tensors("a")              # restored
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert r.checkpoint_positions("a") == cps and r.stats()["restores"] == 1


def test_without_disk_a_session_is_read_again_from_zero(tiny):
    r = parking_reader(tiny, None)
    output_session(r, "a")
    ids = r.ids("a")
    output_session(r, "b", seed=1)
    assert r.stats()["sessions"]["a"]["residency"] == "dropped"
    assert r.committed("a") == 0 and r.ids("a") == ids
    r.read("a")
    assert r.committed("a") == 320 and r.check_exact("a")


def _parked_file(tiny, tmp_path, sid="s"):
    """The manifest of a session parked at a planned stop."""
    r = parking_reader(tiny, tmp_path)
    output_session(r, sid)
    r.close()
    return r.table.store.disk.manifest_path(sid)


def _refused(reader, reason):
    s = reader.stats()
    assert s["refusals"] == 1 and s["refusal_reasons"] == {reason: 1}
    aside = list((reader.store_config.disk_dir / "refused").glob(f"*.{reason}.*"))
    assert len(aside) == 1


def test_another_identity_neither_sees_nor_sets_aside_a_sessions_manifest(tiny, tmp_path):
    """Manifests live under their reader identity's folder: a reader of other weights or
    another grid on the same folder does not know the session (and refuses nothing of it);
    the owner still restores it."""
    path = _parked_file(tiny, tmp_path)
    other = type(tiny).__new__(type(tiny))
    other.__dict__.update(tiny.__dict__)
    other.info = ModelInfo("other", "0" * 32, True)
    for r in (parking_reader(other, tmp_path), Reader(tiny, grid=128, resident_bytes=0,
                                                disk_dir=tmp_path)):
        assert not r.knows("s")
        with pytest.raises(KeyError):
            r.ids("s")
        assert r.stats()["refusals"] == 0 and path.is_file()
    owner = parking_reader(tiny, tmp_path)
    assert owner.committed("s") == 256 and owner.check_exact("s")


def test_a_reader_on_another_path_starts_the_session_again_and_leaves_the_owners(tiny,
                                                                                tmp_path):
    """A reader on another path (here the runners' eager body instead of Qwen35.forward; on a
    GPU, another attention or its version) has another identity: the host's prompt starts
    the session from 0 in it, and the first reader's manifest stays."""
    path = _parked_file(tiny, tmp_path)
    r = parking_reader(tiny, tmp_path, cuda_graphs=True)
    ids = list(range(5, 205))
    got = r.feed("s", ids, "prompt")
    assert got.backlog == len(ids) and r.ids("s") == ids and r.stats()["refusals"] == 0
    r.read("s")
    assert r.check_exact("s") and path.is_file()


@pytest.mark.parametrize("damage,reason", [("truncate", "unreadable"), ("flip_data", "checksum"),
                                           ("flip_header", "unreadable")])
def test_refuses_damaged_files(tiny, tmp_path, damage, reason):
    path = _parked_file(tiny, tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    elif damage == "flip_data":
        data[-100] ^= 0x01
    else:
        data[20] ^= 0xFF
    path.write_bytes(bytes(data))
    r = parking_reader(tiny, tmp_path)
    try:                                  # ids intact (checksummed): known, read again from 0
        assert r.committed("s") == 0
    except KeyError:                      # ids damaged or unreadable: an unknown session
        pass
    _refused(r, reason)


def test_a_refused_manifest_of_a_known_session_keeps_its_ids_and_finds_its_pages(tiny,
                                                                                tmp_path):
    """The reader still holds the parked session's ids: with its manifest refused, the
    session resumes through the pages and states its keys find on disk."""
    r = parking_reader(tiny, tmp_path)
    output_session(r, "a")
    ids, c = r.ids("a"), r.committed("a")
    output_session(r, "b", seed=1)                  # "a" parked on disk
    path = r.table.store.disk.manifest_path("a")
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01
    path.write_bytes(bytes(data))
    assert r.ids("a") == ids and r.committed("a") == c
    _refused(r, "checksum")
    r.read("a")
    assert r.check_exact("a")


@pytest.mark.parametrize("damage,reason", [("flip_data", "checksum"), ("truncate", "unreadable")])
def test_a_damaged_page_file_is_refused_and_the_session_resumes_below_it(tiny, tmp_path,
                                                                         damage, reason):
    """A page file that fails its check is set aside; the session resumes at the deepest line
    below it with a state (here 0: no checkpoint below the damaged page) and reads on
    exactly."""
    path = _parked_file(tiny, tmp_path)
    r = parking_reader(tiny, tmp_path)
    disk = r.table.store.disk
    page = disk.page_path(bytes.fromhex(disk.read_manifest("s").page_keys[1]))
    data = bytearray(page.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:
        data[-100] ^= 0x01
    page.write_bytes(bytes(data))
    ids = r.ids("s")
    assert path.is_file() and r.committed("s") < 2 * G
    _refused(r, reason)
    assert r.stats()["pages"]["disk"] == len(list((tmp_path / "pages").iterdir()))
    r.read("s")
    assert r.committed("s") == len(ids) // G * G and r.check_exact("s")


def test_hostile_session_ids_stay_inside_disk_dir(tiny, tmp_path):
    disk = tmp_path / "disk"
    r = parking_reader(tiny, disk)
    hostile = ["../x", "/etc/passwd", "a" * 256, "ü🙂\u202e", "..", "a\x00b"]
    for i, sid in enumerate(hostile):
        output_session(r, sid, n=100, seed=i)
    r.close()
    names = sorted(p.name for p in r.table.store.disk.manifest_dir.iterdir())
    assert names == sorted([r.table.store.disk.manifest_path(s).name for s in hostile] +
                           [".lock"])            # the manifests' lock (DiskStore.write_manifest)
    assert sorted(p.name for p in disk.iterdir()) == ["gdn", "pages", "sessions"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["disk"]
    for sid in hostile:
        assert r.check_exact(sid)


def test_ttl_and_disk_cap(tiny, tmp_path):
    """Files past the TTL go (a session whose every file expired is unknown to a new reader);
    past the byte cap the oldest pages and entries go before any manifest, and a session that
    lost pages resumes below them, exactly."""
    r = parking_reader(tiny, tmp_path)
    for i, sid in enumerate("abc"):
        output_session(r, sid, seed=i)
    r.close()
    disk = r.table.store.disk
    old = time.time() - 49 * 3600
    m = disk.read_manifest("a")
    a_files = [disk.manifest_path("a"), disk.entry_path(bytes.fromhex(m.state_key))] + \
        [disk.page_path(bytes.fromhex(k)) for k in m.page_keys]
    a_files = set(a_files + [disk.entry_path(bytes.fromhex(k)) for _, k, _, _ in m.checkpoints])
    for p in a_files:
        os.utime(p, (old, old))
    b = disk.read_manifest("b")
    os.utime(disk.page_path(bytes.fromhex(b.page_keys[0])), (old + 3600, old + 3600))
    before = disk.counts()
    cap = before["bytes"] - sum(p.stat().st_size for p in a_files) - 1     # one file more
    r2 = parking_reader(tiny, tmp_path, disk_bytes=cap, disk_ttl_s=48 * 3600)
    after = r2.table.store.disk.counts()
    assert not r2.knows("a") and not any(p.exists() for p in a_files)
    assert after["manifests"] == 2 and after["bytes"] <= cap
    assert r2.stats()["deleted_files"] == sum(before[k] - after[k]
                                              for k in ("pages", "gdn_entries", "manifests"))
    assert r2.committed("b") == 0            # its first page went: read again from 0
    r2.read("b")
    assert r2.check_exact("b") and r2.check_exact("c")


def test_a_new_reader_lists_the_sessions_parked_on_disk(tiny, tmp_path):
    r = parking_reader(tiny, tmp_path)
    output_session(r, "a")
    ids = r.ids("a")
    r.close()
    fresh = parking_reader(tiny, tmp_path)
    s = fresh.stats()["sessions"]["a"]
    assert s["residency"] == "disk" and s["committed"] == 256 and s["num_ids"] == len(ids)
    assert fresh.ids("a") == ids and fresh.check_exact("a") and fresh.stats()["restores"] == 1


def test_a_session_below_one_chunk_outlives_a_restart(tiny, tmp_path):
    """A session never read (C = 0, fewer ids than a chunk) is written at a planned stop too:
    a new reader knows its ids and reads on from them exactly."""
    r = parking_reader(tiny, tmp_path)
    r.feed("short", list(range(1000, 1010)), "prompt")
    r_bytes = r.state_bytes("short")
    r.close()
    fresh = parking_reader(tiny, tmp_path)
    assert fresh.ids("short") == list(range(1000, 1010)) and fresh.committed("short") == 0
    assert fresh.state_bytes("short") == r_bytes          # no KV rows at C = 0, as before
    fresh.feed("short", list(range(1000, 1010)) + list(range(2000, 2300)), "prompt")
    fresh.read("short")
    assert fresh.committed("short") > 0 and fresh.check_exact("short")


def test_position_and_the_scheduler_do_not_restore_parked_sessions(tiny, tmp_path):
    """Reader.position reads a parked session's (ids, C) from its record; the host's scheduler
    looks through it on every round, so a round never restores (or spills) anything."""
    from shadow_plugin.scheduling.host import Host
    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    r = parking_reader(tiny, tmp_path)        # resident cap 0: all but the one in use parked
    output_session(r, "a")
    output_session(r, "b", seed=1)
    assert r.stats()["sessions"]["a"]["residency"] == "disk"
    rec = r.stats()["sessions"]["a"]
    before = r.stats()["restores"]
    assert r.position("a") == (rec["num_ids"], rec["committed"])
    host = Host(r, host_busy=lambda: True, cfg=SchedulerConfig(grid=G, idle_trust=0.5))
    host.turn_started("b", r.ids("b"))
    host.output("b", [5])
    for _ in range(3):
        host.between_rounds("b")
    port = host.scheduler.port                   # what pick() and leave_to_idle() look at
    assert (port.backlog("a"), port.committed("a")) == (rec["num_ids"] - rec["committed"],
                                                        rec["committed"])
    assert r.stats()["restores"] == before and r.stats()["sessions"]["a"]["residency"] == "disk"
    with pytest.raises(KeyError):
        r.position("nope")
