"""What a benchmark's JSON says about the code it ran: the commit."""
from __future__ import annotations

import subprocess


def git_commit(cwd=None) -> str:
    """The short commit (git rev-parse) of the checkout at `cwd` (default: the current
    folder's), with "+dirty" when tracked files differ from it (the code that ran is not that
    commit's: a device copy of a working tree, an A/B arm); "unknown" outside a git checkout
    or without git."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True, cwd=cwd).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], capture_output=True,
                               cwd=cwd).returncode == 1
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")
