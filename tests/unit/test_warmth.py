"""A session's warmth on this server (block_store.warmth: what a router scores), in the
reader's stats and in /metrics' bounded per-session series, on sessions of known sizes: the
tiny model on the CPU at G = 64 holds 65,536 bytes a page (one attention layer, K and V,
2 x 64 x 64 float32 rows) and 61,440 bytes a GDN entry (three GDN layers, conv [256, 4] and
recurrent [4, 32, 32] float32 each)."""
import random

import pytest
from helpers import rand_ids

from block_store.disk.store import DiskStore
from shadow_plugin import Reader
from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.metrics import session_metrics, warmest
from shadow_plugin.server.service import check_config, check_limits

G = 64
PAGE_BYTES = 1 * 2 * G * 2 * 64 * 4               # attention layers x (K, V) x rows x Hkv x D x 4
ENTRY_BYTES = 3 * (256 * 4 * 4 + 4 * 32 * 32 * 4)  # GDN layers x (conv + recurrent) float32


def _session(reader: Reader, sid: str, num_pages: int, seed: int) -> None:
    """A prompt of num_pages whole pages and 10 ids more, read up."""
    reader.feed(sid, rand_ids(num_pages * G + 10, seed), "prompt")
    reader.read(sid)


def test_page_and_entry_bytes_are_the_tiny_models(tiny):
    st = Reader(tiny, grid=G).stats()
    assert st["page_bytes"] == PAGE_BYTES == 65_536
    r = Reader(tiny, grid=G)
    _session(r, "a", 1, 0)
    assert r.stats()["sessions"]["a"]["gdn_bytes"] == 2 * ENTRY_BYTES == 122_880  # C + a tip


def test_a_resident_session_is_warm_at_c_with_its_pages_entries_and_bytes(tiny):
    r = Reader(tiny, grid=G)
    _session(r, "a", 5, 1)
    _session(r, "b", 2, 2)
    s = r.stats()["sessions"]
    # a: C = 320; its tip ring holds the last 4 lines C stood at (128, 192, 256, 320), the
    # prompt's checkpoint at 320 is the ring's newest entry: 4 entries, and its states at C
    assert s["a"]["committed"] == 320 and s["a"]["checkpoints"] == [320]
    assert {k: s["a"][k] for k in ("warm_tokens", "held_tokens", "num_pages_memory",
                                   "num_pages_disk", "kv_bytes", "num_gdn_entries",
                                   "gdn_bytes")} == {
        "warm_tokens": 320, "held_tokens": 320, "num_pages_memory": 5, "num_pages_disk": 0,
        "kv_bytes": 5 * PAGE_BYTES, "num_gdn_entries": 4, "gdn_bytes": 5 * ENTRY_BYTES}
    assert s["a"]["bytes"] == s["a"]["kv_bytes"] + s["a"]["gdn_bytes"] == 634_880
    # b: C = 128, its ring at 64 and 128
    assert (s["b"]["warm_tokens"], s["b"]["num_pages_memory"], s["b"]["num_gdn_entries"],
            s["b"]["gdn_bytes"]) == (128, 2, 2, 3 * ENTRY_BYTES)


def test_a_parked_session_is_warm_while_memory_holds_its_pages_then_held_on_disk(tiny,
                                                                                  tmp_path):
    r = Reader(tiny, grid=G, disk_dir=tmp_path)
    _session(r, "a", 5, 1)
    r.table.park("a")
    s = r.stats()["sessions"]["a"]
    # its pages cached by key, its ring's entries loose in the table (the newest now its
    # states at C), every page written: a turn resumes at C from memory
    assert s["residency"] == "disk" and s["bytes"] == 0
    assert (s["warm_tokens"], s["held_tokens"], s["num_pages_memory"], s["num_pages_disk"],
            s["kv_bytes"], s["num_gdn_entries"], s["gdn_bytes"]) == (
        320, 320, 5, 5, 5 * PAGE_BYTES, 4, 4 * ENTRY_BYTES)
    r.table.forget_memory()                  # memory reused by others: only the disk holds it
    s = r.stats()["sessions"]["a"]
    assert (s["warm_tokens"], s["held_tokens"], s["num_pages_memory"], s["num_pages_disk"],
            s["kv_bytes"], s["num_gdn_entries"], s["gdn_bytes"]) == (0, 320, 0, 5, 0, 0, 0)
    r.feed("a", r.ids("a"), "prompt")        # the hint held: the restore read nothing
    st = r.stats()
    assert r.committed("a") == 320 and st["read_tokens"] == 320
    assert st["restores"] == 1 and st["restore_ms"] > 0 and st["sessions"]["a"]["verified"]


def test_a_parked_session_is_warm_only_up_to_its_deepest_state_with_every_page_below(
        tiny, tmp_path):
    r = Reader(tiny, grid=G, disk_dir=tmp_path, max_checkpoints=2)
    _session(r, "a", 6, 3)
    r.table.park("a")
    store = r.store
    keys = r.table.residency.parked["a"].keys
    store.gdn.evict(0)                       # no entry in memory: warm nowhere
    assert r.stats()["sessions"]["a"]["warm_tokens"] == 0
    r.table.forget_memory()
    # one state on disk lost: held at the deepest line below it with its entry on disk
    entry = store.disk.entry_path(keys[-1])
    entry.unlink()
    store.disk.sweep(48 * 3600, None)        # lists the folder again
    s = r.stats()["sessions"]["a"]
    assert s["held_tokens"] == 5 * G and s["num_pages_disk"] == 6


def test_a_session_adopted_from_another_servers_manifest_is_held_on_disk(tiny, tmp_path):
    a = Reader(tiny, grid=G, disk_dir=tmp_path, disk_shared=True)
    _session(a, "s", 4, 4)
    assert a.table.save("s")                 # shared: pages, states and manifest written
    b = Reader(tiny, grid=G, disk_dir=tmp_path, disk_shared=True)     # adopts it at start
    s = b.stats()["sessions"]["s"]
    assert (s["residency"], s["warm_tokens"], s["held_tokens"], s["num_pages_memory"],
            s["num_pages_disk"], s["gdn_bytes"]) == ("disk", 0, 256, 0, 4, 0)


def test_the_server_is_named_by_its_manifests_writer_and_page_key_identity(tiny, tmp_path):
    r = Reader(tiny, grid=G, disk_dir=tmp_path)
    _session(r, "a", 1, 0)
    assert r.table.save("a")
    server = r.stats()["server"]
    mark = r.store.disk.read_manifest("a").mark
    assert server["writer"] == mark[0] == r.store.disk.writer and mark[1] == 2  # feed, save
    assert server["identity"] == r.store.disk.manifest_dir.name
    assert (server["disk"], server["disk_shared"]) == (True, False)
    other = Reader(tiny, grid=G).stats()["server"]           # no disk: a token all the same
    assert other["identity"] == server["identity"] and other["disk"] is False
    host, pid, token = other["writer"].split(":")
    assert host == server["writer"].split(":")[0] and int(pid) > 0 and len(token) == 8
    assert other["writer"] != server["writer"]


def test_the_disk_listing_names_another_stores_pages(tmp_path):
    from helpers import DISK_IDENT, disk_page
    one = DiskStore(tmp_path, DISK_IDENT)
    key = bytes(range(16))
    assert one.write_page(key, list(range(G)), disk_page(0))
    two = DiskStore(tmp_path, DISK_IDENT)    # lists the folder on its first look
    assert two.page_listed(key) and one.page_listed(key)
    assert not two.page_listed(bytes(16))


def test_a_page_written_while_the_folder_is_listed_stays_listed(tmp_path, monkeypatch):
    from helpers import DISK_IDENT, disk_page

    from block_store.disk import upkeep
    store, key = DiskStore(tmp_path, DISK_IDENT), bytes(range(16))
    real = upkeep.listing

    def listing_then_a_write(root):            # a spill thread writes after the scan
        listed = real(root)
        assert store.write_page(key, list(range(G)), disk_page(1))
        return listed

    monkeypatch.setattr(upkeep, "listing", listing_then_a_write)
    store.refresh()                          # the first listing
    monkeypatch.setattr(upkeep, "listing", real)
    assert store.page_listed(key)


def _stats(sessions: dict) -> dict:
    return {"server": {"writer": "h:1:abcd0123", "identity": "00" * 16, "disk": True,
                       "disk_shared": True}, "sessions": sessions}


def _one(warm: int, held: int, num_ids: int, backlog: int = 0,
         residency: str = "resident") -> dict:
    return {"warm_tokens": warm, "held_tokens": held, "num_ids": num_ids, "backlog": backlog,
            "residency": residency, "num_pages_memory": warm // G,
            "num_pages_disk": held // G, "kv_bytes": warm // G * PAGE_BYTES,
            "num_gdn_entries": 1, "gdn_bytes": ENTRY_BYTES}


def test_only_the_warmest_sessions_get_series_of_their_own():
    sessions = {"cold": _one(0, 0, 900, backlog=900), "disk": _one(0, 512, 600, 0, "disk"),
                "big": _one(512, 512, 700), "small": _one(128, 512, 200, backlog=72),
                "tie": _one(128, 512, 200, residency="dropped")}
    assert warmest(sessions, 3) == ["big", "small", "tie"]
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in session_metrics(_stats(sessions), 3) for s in fam.samples}
    warm = {dict(k[1])["session"]: v for k, v in samples.items()
            if k[0] == "shadow_session_warm_tokens"}
    assert warm == {"big": 512, "small": 128, "tie": 128}
    assert samples[("shadow_session_pages", (("session", "big"), ("tier", "memory")))] == 8
    assert samples[("shadow_session_bytes", (("kind", "kv"), ("session", "big")))] == \
        8 * PAGE_BYTES
    assert samples[("shadow_session_bytes", (("kind", "gdn"), ("session", "tie")))] == \
        ENTRY_BYTES
    assert samples[("shadow_session_series_omitted", ())] == 2
    backlog = {dict(k[1])["session"]: v for k, v in samples.items()
               if k[0] == "shadow_backlog_ids"}
    assert backlog == {"cold": 900, "small": 72, "big": 0}        # the largest backlogs
    assert {dict(k[1])["residency"]: v for k, v in samples.items()
            if k[0] == "shadow_sessions"} == {"resident": 3, "disk": 1, "dropped": 1}
    info = [k for k in samples if k[0] == "shadow_server_info"]
    assert dict(info[0][1]) == {"writer": "h:1:abcd0123", "identity": "00" * 16,
                                "disk": "true", "disk_shared": "true"}
    none = {k[0] for fam in session_metrics(_stats(sessions), 0) for k in
            [(s.name,) for s in fam.samples]}
    assert not any(n.startswith("shadow_session_") and n != "shadow_session_series_omitted"
                   for n in none) and "shadow_backlog_ids" not in none


def test_the_number_of_sessions_with_series_is_a_setting():
    assert ServiceConfig.from_env({"SHADOW_METRICS_SESSIONS": "5"}).metrics_sessions == 5
    assert ServiceConfig.from_env({}).metrics_sessions == 32
    with pytest.raises(ValueError, match="SHADOW_METRICS_SESSIONS"):
        check_config(ServiceConfig(model="random:tiny", metrics_sessions=-1))
    with pytest.raises(ValueError, match="SHADOW_METRICS_SESSIONS"):
        ServiceConfig.from_env({"SHADOW_METRICS_SESSIONS": "many"})


def test_warmth_is_a_lookup_that_changes_no_lru_order(tiny, tmp_path):
    r = Reader(tiny, grid=G, disk_dir=tmp_path)
    rng = random.Random(5)
    for i in range(3):
        r.feed(f"s{i}", rand_ids(2 * G + 5, rng), "prompt")
        r.read(f"s{i}")
        r.table.park(f"s{i}")
    order = list(r.store.gdn.entries)
    free = list(r.store.manager.free)
    r.stats()
    assert list(r.store.gdn.entries) == order and list(r.store.manager.free) == free


def test_the_attention_is_one_the_cuda_runners_take_and_never_set_on_the_cpu():
    """SHADOW_ATTENTION: fa4 or table (the CUDA runners' graphs; sdpa they refuse at load, so
    it is refused before), lower-cased, unset by default; on the CPU any value is refused."""
    assert ServiceConfig.from_env({"SHADOW_ATTENTION": " Table "}).attention == "table"
    assert ServiceConfig.from_env({"SHADOW_ATTENTION": ""}).attention is None
    for ok in ("fa4", "table"):
        check_limits(ServiceConfig(model="random:tiny", device="cuda", attention=ok))
    for bad in ("sdpa", "fa5", "flash"):
        with pytest.raises(ValueError, match=f"SHADOW_ATTENTION='{bad}': one of fa4, table "):
            check_limits(ServiceConfig(model="random:tiny", device="cuda", attention=bad))
    with pytest.raises(ValueError, match="SHADOW_ATTENTION='table' chooses the CUDA runners'"):
        check_config(ServiceConfig(model="random:tiny", device="cpu", attention="table"))
    check_config(ServiceConfig(model="random:tiny", device="cpu"))


def test_the_questions_tails_kept_are_a_setting():
    assert ServiceConfig.from_env({"SHADOW_TAILS": "2"}).max_tails == 2
    assert ServiceConfig.from_env({}).max_tails == 8
    with pytest.raises(ValueError, match="SHADOW_TAILS"):
        check_config(ServiceConfig(model="random:tiny", max_tails=-1))
    with pytest.raises(ValueError, match="SHADOW_TAILS"):
        ServiceConfig.from_env({"SHADOW_TAILS": "some"})
