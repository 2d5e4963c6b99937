"""What a benchmark's JSON says about the code it ran: the commit."""
from __future__ import annotations

import subprocess


def git_commit() -> str:
    """The checkout's short commit (git rev-parse), "unknown" outside a git checkout or
    without git."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
