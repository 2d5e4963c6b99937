"""fla's pinned kernel picks as another process loads them."""
import json
import os
import subprocess
import sys

import pytest

fla_cache = pytest.importorskip("fla.ops.utils.cache")   # where fla-core imports (not the CPU CI)
triton = pytest.importorskip("triton")

from helpers import FLA_KEY, fla_tuner  # noqa: E402

from adapters.model import autotune  # noqa: E402


def test_exported_picks_are_what_a_pinned_process_loads(tmp_path):
    tuner = fla_tuner()
    tuner.cache[FLA_KEY] = triton.Config({"BK": 32, "BV": 64}, num_warps=4, num_stages=2)
    try:
        assert autotune.export(tmp_path) >= 1
    finally:
        tuner.cache.pop(FLA_KEY)
    doc = json.loads((tmp_path / "chunk_fwd_kernel_o.json").read_text())
    assert doc["kernel_name"] == "chunk_fwd_kernel_o"
    assert doc["triton_version"] == triton.__version__
    code = ("import json, fla.ops.utils.cache as c; print(json.dumps(c.load_cached_config("
            f"'chunk_fwd_kernel_o', c.AutotuneKey({FLA_KEY!r}))))")
    env = {**os.environ, "FLA_CONFIG_DIR": str(tmp_path), "FLA_CACHE_MODE": "strict"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    loaded = json.loads(out)
    assert loaded["kwargs"] == {"BK": 32, "BV": 64}
    assert (loaded["num_warps"], loaded["num_stages"], loaded["num_ctas"]) == (4, 2, 1)


def test_pin_before_import_sets_fla_to_strict_on_that_directory(tmp_path):
    """In a fresh process: pin, then import fla: strict mode on the pinned directory, and
    pinning again to the same place is accepted."""
    code = ("from adapters.model import autotune; p = autotune.pin(%r);"
            "import fla.ops.utils.cache as c; autotune.pin(%r);"
            "print(c.FLA_CACHE_MODE.value, c.get_fla_config_dir() == p, autotune.pinned_dir() == p)"
            % (str(tmp_path / "picks"), str(tmp_path / "picks")))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLA_")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()[-1]
    assert out == "strict True True"
