"""adapters.model.autotune: the picks fla's autotuners hold, written in fla's own format, are
what fla's loader returns in another process pinned to the same directory (strict mode). Runs where
fla-core imports (skipped otherwise: the CPU CI installs no fla); the kernels themselves need
a GPU, so the picks here are set by hand, as an autotune run would leave them."""
import json

import pytest

fla_cache = pytest.importorskip("fla.ops.utils.cache")
triton = pytest.importorskip("triton")

from helpers import FLA_KEY, fla_tuner  # noqa: E402

from adapters.model import autotune  # noqa: E402


def test_export_merges_with_the_file_and_skips_nothing_loaded(tmp_path):
    tuner = fla_tuner()
    other = (64,) + FLA_KEY[1:]
    for key, bk in ((FLA_KEY, 32), (other, 64)):
        tuner.cache[key] = triton.Config({"BK": bk, "BV": 64}, num_warps=4, num_stages=2)
        try:
            autotune.export(tmp_path)
        finally:
            tuner.cache.pop(key)
    entries = json.loads((tmp_path / "chunk_fwd_kernel_o.json").read_text())["autotune_entries"]
    keys = {tuple(e["autotune_key"]): e["config"]["kwargs"]["BK"] for e in entries.values()}
    assert keys == {FLA_KEY: 32, other: 64}


def test_pin_refuses_once_fla_is_imported_with_other_settings(tmp_path, monkeypatch):
    """This process imported fla unpinned: pinning now would not take (fla reads its mode at
    import), so it says so instead of pretending."""
    monkeypatch.delenv(autotune.ENV_DIR, raising=False)
    monkeypatch.delenv(autotune.ENV_MODE, raising=False)
    assert autotune.pinned_dir() is None
    with pytest.raises(RuntimeError, match="fla was imported before its configs were pinned"):
        autotune.pin(tmp_path / "picks")
    assert autotune.pinned_dir() is None


