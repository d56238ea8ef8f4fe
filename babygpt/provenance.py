"""Which code made a record: the git commit of this checkout and whether its tracked files had
uncommitted changes, written into every run's config.json (and each resume's entry in it) beside
the record's format version, so that a result found later can be traced to the code that made it."""

from __future__ import annotations

import functools
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_RECORD_FORMAT = 2  # config.json's layout; 1 (no "format" key): the records made before it was named


def _git(*args: str) -> str | None:
    """git's output in ROOT, or None where git or the repository is missing or refuses."""
    try:
        done = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


@functools.lru_cache(maxsize=None)
def source() -> dict:
    """{"commit": the checkout's HEAD or None, "dirty": True if a tracked file differs from it, None if
    unknown}. Untracked files (run outputs, data) do not count. Read once per process."""
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status)}
