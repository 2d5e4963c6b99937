"""What a benchmark's JSON says about the code it ran: the commit."""
from __future__ import annotations

import subprocess


def git_commit(cwd=None) -> str:
    """The short commit (git rev-parse) of the checkout at `cwd` (default: the current
    folder's), "unknown" outside a git checkout or without git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=cwd).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
