"""Start-up and the smaller points of issue 19: every bad setting refused before the server
binds, in one line naming the variable or flag and the value, exit code 2; `serve --help` lists
every setting; the start-up lines; 401 with WWW-Authenticate; outputs of a turn that was not
followed; bad ids named by their field; 400 and 422 both with a line in `detail`."""
import time
from pathlib import Path

import pytest

from shadow_plugin.server.config import ServiceConfig
from shadow_plugin.server.startup import startup_lines

ROOT = Path(__file__).resolve().parents[2]


def test_the_startup_lines_name_what_is_in_use(tmp_path):
    cfg = ServiceConfig(model="random:tiny", device="cpu", state_dir=tmp_path, threads=3)
    first, dashboard = startup_lines(cfg, "127.0.0.1", 8765)
    for part in ("random:tiny (seeded random weights) on cpu", "grid 512", "cap 4.0 GiB",
                 "disk off (SHADOW_DISK: a restart remembers nothing)",
                 str(tmp_path / "shadow.jsonl"), "threads 3", "questions 2 at once + 32",
                 "idle reads of up to 1 session(s) a forward"):
        assert part in first, part
    assert dashboard == "dashboard at http://127.0.0.1:8765/v1/shadow/dashboard"
    lines = startup_lines(cfg, "0.0.0.0", 8765)
    assert lines[-1].startswith("WARNING: bound to 0.0.0.0 without an API key")
    keyed = ServiceConfig(model="random:tiny", api_key="k", disk_dir=tmp_path / "d")
    assert len(startup_lines(keyed, "0.0.0.0", 1)) == 2
    assert f"disk {tmp_path / 'd'}" in startup_lines(keyed, "0.0.0.0", 1)[0]


def test_small_points_over_http(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from shadow_plugin.scheduling.scheduler import SchedulerConfig
    from shadow_plugin.server.app import create_app
    profiles = tmp_path / "p.yaml"
    profiles.write_text("quiet:\n  shadow:\n    mode: off\n")
    cfg = ServiceConfig(model="random:tiny", device="cpu", grid=64, api_key="k",
                        state_dir=tmp_path, profiles_path=profiles,
                        scheduler=SchedulerConfig(grid=64, poll_s=0.02))
    key = {"Authorization": "Bearer k"}
    with TestClient(create_app(cfg), base_url="http://127.0.0.1") as c:
        deadline = time.monotonic() + 60
        while c.get("/healthz").json()["state"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.05)
        r = c.get("/v1/shadow/status")
        assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer")
        r = c.post("/v1/shadow/sessions/q/turn", headers=key,
                   json={"prompt_ids": [1, 2], "profile": "quiet"})
        assert r.json()["followed"] is False
        r = c.post("/v1/shadow/sessions/q/output", headers=key, json={"ids": [3]})
        assert r.status_code == 200 and r.json()["followed"] is False
        r = c.post("/v1/shadow/sessions/q/end", headers=key)
        assert r.status_code == 200 and r.json() == {"ended": "q", "followed": False}
        assert c.delete("/v1/shadow/sessions/q", headers=key).status_code == 200
        r = c.post("/v1/shadow/sessions/b/turn", headers=key, json={"prompt_ids": [1, -5]})
        assert r.status_code == 400 and "prompt_ids[1]" in r.json()["detail"]
        r = c.post("/v1/shadow/sessions/b/turn", headers=key, json={"prompt_ids": "x"})
        assert r.status_code == 422 and isinstance(r.json()["detail"], str)
        assert "prompt_ids" in r.json()["detail"] and r.json()["errors"]


@pytest.mark.parametrize("device, named", [
    ("cuda:x", "cpu, cuda or cuda:N"), ("cpu:1", "cpu, cuda or cuda:N"),
    ("gpu", "cpu, cuda or cuda:N")])
def test_a_device_is_cpu_cuda_or_a_numbered_cuda_device(tmp_path, device, named):
    """What vLLM's worker half sets (cuda:<its GPU>) passes the check; a malformed name is
    refused by name (in process: startup.check_paths)."""
    from shadow_plugin.server.config import ServiceConfig
    from shadow_plugin.server.startup import check_paths
    base = {"SHADOW_MODEL": "random:tiny", "SHADOW_DIR": str(tmp_path)}
    with pytest.raises(ValueError, match=named):
        check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": device}))
    check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": "cpu"}))
    import torch
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="'cuda:0': no CUDA device"):
            check_paths(ServiceConfig.from_env({**base, "SHADOW_DEVICE": "cuda:0"}))


@pytest.mark.parametrize("text, named", [
    ("a:\n  shadow: {router_min_tokens: [1]}\n", "shadow.router_min_tokens"),
    ("a:\n  shadow: {router_min_tokens: -5}\n", "shadow.router_min_tokens"),
    ("a:\n  shadow: {router_min_tokens: true}\n", "shadow.router_min_tokens"),
    ("a:\n  shadow: {mdoe: off}\n", "shadow.mdoe: unknown key"),
    ("a:\n  shadow: {mode: off}\n  mode: off\n", "mode: unknown key (known: shadow)"),
    ("a:\n  shadow: {mode: maybe}\n", "shadow.mode: expected on or off"),
    ("a:\n  shadow: {router: on}\n", "shadow.router: expected off or shadow"),
    ("a:\n  shadow: [1]\n", "shadow"),
    ("a: 5\n", "expected a mapping")])
def test_every_profile_key_is_checked_by_name_and_type(tmp_path, text, named):
    """Issue 34: one line naming the file, the profile and the key; `serve` exits 2 on it."""
    from shadow_plugin.server.router_journal import load_profiles
    path = tmp_path / "p.yaml"
    path.write_text(text)
    with pytest.raises(ValueError) as e:
        load_profiles(path)
    assert str(path) in str(e.value) and "profile 'a'" in str(e.value)
    assert named in str(e.value) and "\n" not in str(e.value)


def test_good_profiles_load_with_their_defaults(tmp_path):
    from shadow_plugin.server.router_journal import Profile, load_profiles
    path = tmp_path / "p.yaml"
    path.write_text("a:\n  shadow: {mode: off, narrator: on, router: shadow, "
                    "router_min_tokens: 100}\nb:\nc:\n  shadow:\n")
    assert load_profiles(path) == {"a": Profile(False, True, True, 100), "b": Profile(),
                                   "c": Profile()}
