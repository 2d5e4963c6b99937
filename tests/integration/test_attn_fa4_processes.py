"""FA4's compiled kernels kept in the pin folder for the next process."""
from __future__ import annotations

import os


def test_the_pin_folder_keeps_fa4s_compiled_kernels(tmp_path):
    """autotune.pin turns FA4's on-disk kernel cache on, in path/fa4, unless the user set
    either variable (read when flash_attn.cute is imported, after the pin)."""
    import subprocess
    import sys
    code = ("import os; from adapters.model import autotune; autotune.pin(%r);"
            "print(os.environ[autotune.FA4_CACHE_ENABLED], os.environ[autotune.FA4_CACHE_DIR])"
            % str(tmp_path / "picks"))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLA_", "FLASH_ATTENTION_", "TORCHINDUCTOR_"))}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", str(tmp_path.resolve() / "picks" / "fa4")]
    env["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] = str(tmp_path / "mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["1", str(tmp_path / "mine")]
