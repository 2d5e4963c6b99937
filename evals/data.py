"""Where the shared data set lives: recorded agent sessions (`sessions/`), request timelines
(`timelines/`) and agent prefixes (`prefixes/`); and which model the commands use by default
(`default_model`: a real 0.8B in the Hugging Face cache, else a random one). It is not part of
the repository (never commit it); tests and benchmarks that use it look in $SHADOW_DATA_DIR,
by default `../shared/data` (a `shared` folder next to the checkout's folder), and skip
(tests) or ask for files (benchmarks) when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

ENV = "SHADOW_DATA_DIR"


def data_dir() -> Path:
    """$SHADOW_DATA_DIR, else ../shared/data relative to the repository's root."""
    given = os.environ.get(ENV)
    return Path(given).expanduser() if given else \
        Path(__file__).resolve().parents[2] / "shared" / "data"


HF_NAME = "models--Qwen--Qwen3.5-0.8B"


def find_local_model() -> str | None:
    """A real Qwen3.5-0.8B in the Hugging Face cache ($HF_HOME or ~/.cache/huggingface), if any."""
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    for snap in sorted((home / "hub" / HF_NAME / "snapshots").glob("*")):
        if (snap / "config.json").is_file():
            return str(snap)
    return None


def default_model(device: str) -> str:
    """A local real 0.8B, else random:qwen3.5-0.8b on CUDA and random:tiny on the CPU."""
    return find_local_model() or ("random:qwen3.5-0.8b" if device == "cuda" else "random:tiny")
