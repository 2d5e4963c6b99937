"""Where the shared data set lives: recorded agent sessions (`sessions/`), request timelines
(`timelines/`) and agent prefixes (`prefixes/`). It is not part of the repository (never commit
it); tests and benchmarks that use it look in $SHADOW_DATA_DIR, by default `shared/data` beside
the checkout, and skip (tests) or ask for files (benchmarks) when it is absent."""
from __future__ import annotations

import os
from pathlib import Path

ENV = "SHADOW_DATA_DIR"


def data_dir() -> Path:
    """$SHADOW_DATA_DIR, else ../shared/data relative to the repository's root."""
    given = os.environ.get(ENV)
    return Path(given).expanduser() if given else \
        Path(__file__).resolve().parents[2] / "shared" / "data"
