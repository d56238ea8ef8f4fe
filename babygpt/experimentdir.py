"""An experiment's output directory: checked in full before a byte of it changes, and replaced by
``--overwrite`` only once the new results are complete.

The directory holds ``settings.json``, the options that made its results. Claiming it for a
command (``OutputDir.claim``) first decides, touching nothing, whether it is new, holds results of
the same settings (they are continued or regenerated in place), or holds other results, which are
refused unless ``--overwrite`` is given. The caller runs every other check of its own between
``check`` and ``claim``, so an error exit leaves every file's bytes and mtime as they were.

``--overwrite`` writes aside, then swaps: the old directory is renamed to a hidden sibling
(``.NAME.replaced``, nothing deleted), the new results are made in its place, and the old ones are
deleted only when the new ones are complete (``commit``, once the report is written). A command
that fails or is stopped part-way leaves both: the new, resumable results at the path and the old
ones beside it, until the same command, run again, completes.
"""

from __future__ import annotations

import os
import shutil

from .errors import BabyGPTError
from .files import user_error
from .rundir import read_json, write_json

SETTINGS_FILE = "settings.json"

_PENDING: dict[str, "OutputDir"] = {}  # claimed directories whose old results await commit, by path


def made_by(path: str) -> str | None:
    """The experiment whose results ``path`` holds: the name its settings.json records (one that names
    no experiment is someone else's file); else None. Only ``path`` itself counts: sweeps of their
    own may live below an experiment's results, as experiment 14 reads them."""
    name = (read_json(os.path.join(path, SETTINGS_FILE)) or {}).get("experiment")
    return None if name is None else str(name)


def aside_path(path: str) -> str:
    """Where ``--overwrite`` keeps the old results of ``path`` until the new ones are complete."""
    parent, name = os.path.split(os.path.abspath(path))
    return os.path.join(parent, f".{name}.replaced")


class OutputDir:
    """``path`` as the output directory of a command whose results are made with ``settings``."""

    def __init__(self, path: str, settings: dict, overwrite: bool = False, collect: bool = False,
                 defaults: dict | None = None):
        self.path, self.settings, self.overwrite, self.collect = path, settings, overwrite, collect
        # Each option's default: a settings.json written before an option existed lacks its key, and
        # still says these settings when the option is at its default now.
        self.defaults = defaults or {}
        self.aside = aside_path(path)
        self.replace = False

    def says_these(self, had: dict | None) -> bool:
        """Whether settings ``had`` (read from settings.json) are this command's."""
        return had is not None and {**self.defaults, **had} == {**self.defaults, **self.settings}

    def check(self) -> None:
        """Refuse, writing nothing, a directory this command must not use; decide whether it
        replaces the results there (``self.replace``)."""
        path = self.path
        if os.path.exists(path) and not os.path.isdir(path):
            raise BabyGPTError(f"--out '{path}' is a file, not a directory; choose another --out")
        had = read_json(os.path.join(path, SETTINGS_FILE))
        # (another shard may be writing settings.json right now: its temporary file does not count)
        taken = os.path.isdir(path) and any(not n.startswith(".tmp-") for n in os.listdir(path))
        if self.collect and had is None:
            raise BabyGPTError(f"nothing to collect in '{path}' (no {SETTINGS_FILE}); run the shards first "
                               f"(--shard K/N), or give the --out they wrote to")
        self.replace = taken and not self.says_these(had)
        if os.path.lexists(self.aside) and not os.path.isdir(self.aside):
            raise BabyGPTError(f"'{self.aside}' is where --overwrite keeps the results it replaces, but it is not a "
                               f"directory; move it out of the way (nothing was changed)")
        # (an --overwrite that failed before it wrote anything new, e.g. right after moving the old
        # results aside, is continued by any command: nothing of its own is there to keep)
        if os.path.exists(self.aside) and taken and not self.says_these(had):
            raise BabyGPTError(f"an earlier --overwrite of '{path}' did not complete: the results it replaces are "
                               f"in '{self.aside}'; run that command again to complete it, or move them back "
                               f"(delete '{path}', then rename '{self.aside}' to it)")
        if self.replace and self.collect:  # the runs --collect reads are the ones --overwrite would move away
            raise BabyGPTError(f"--collect reads the runs in {path}, but it {self._describe(had)}: it holds no "
                               f"runs of these settings to read (--overwrite would only move those aside); collect "
                               f"with the settings they were made with, or drop --collect to train these (nothing "
                               f"was changed)")
        if self.replace and not self.overwrite:
            raise BabyGPTError(f"{path} {self._describe(had)}; write these results elsewhere with --out DIR, or "
                               f"pass --overwrite to replace them (nothing was changed)")
        if self.replace and os.path.join(os.getcwd(), "").startswith(os.path.join(os.path.abspath(path), "")):
            raise BabyGPTError(f"--overwrite would replace '{path}', which holds the current directory; "
                               f"give --out a directory of its own")

    def _describe(self, had: dict | None) -> str:
        if had is None:
            return f"holds files without a {SETTINGS_FILE} saying how they were made"
        wanted = self.settings
        diffs = [k for k in sorted({*had, *wanted}) if had.get(k) != wanted.get(k)]
        return "was made with other settings (" + ", ".join(
            f"{k}={had.get(k)!r} there, {wanted.get(k)!r} now" for k in diffs[:4]) + ")"

    def claim(self) -> str:
        """Make the directory this command's (after ``check`` and every other check passed): the
        old results moved aside if they are replaced, settings.json written unless it already
        says these settings (so a re-run leaves its bytes and mtime alone). Returns the path."""
        try:
            if self.replace:
                os.rename(self.path, self.aside)
            os.makedirs(self.path, exist_ok=True)
        except OSError as e:
            raise user_error(e, self.path) from None
        settings_file = os.path.join(self.path, SETTINGS_FILE)
        if not self.says_these(read_json(settings_file)):
            write_json(settings_file, self.settings)
        if os.path.exists(self.aside):
            _PENDING[os.path.abspath(self.path)] = self
        return self.path

    def commit(self) -> None:
        """The new results are complete: delete the old ones kept aside, if any."""
        _PENDING.pop(os.path.abspath(self.path), None)
        if os.path.exists(self.aside):
            shutil.rmtree(self.aside)


def commit(path: str) -> None:
    """``OutputDir.commit`` of the directory claimed at ``path`` (nothing if none awaits it)."""
    pending = _PENDING.get(os.path.abspath(path))
    if pending is not None:
        pending.commit()


def pending_note() -> str | None:
    """What a command that stops early says about the old results it was replacing, if any."""
    if not _PENDING:
        return None
    kept = ", ".join(f"'{d.aside}'" for d in _PENDING.values())
    return (f"the results --overwrite replaces are kept in {kept} until the new ones are complete; "
            f"run the same command again to complete them")
