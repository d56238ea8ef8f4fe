"""Optional TensorBoard logging (``tensorboard = True``): every row a run writes to metrics.jsonl,
also as TensorBoard scalars in ``out_dir/tensorboard/``. metrics.jsonl stays the record that
everything else reads; the event files are a view of it for ``tensorboard --logdir out``.

Scalars are named by the row's keys: ``loss``, ``val_loss``, ``train_loss``, ``lr``,
``tokens_per_s``, ...; a per-layer list (the diagnostics, ``diag_interval`` > 0) becomes one
scalar per layer, ``resid_rms/layer_3``. On a resume, the steps after the checkpoint are purged
from the view, as they are dropped from metrics.jsonl, and logged again.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import tempfile

from .files import os_error_message, user_error
from .foreign import foreign_code

LOG_DIR = "tensorboard"
INSTALL = "pip install tensorboard (or pip install -e '.[tensorboard]')"


def missing_problem() -> str | None:
    """Why ``tensorboard = True`` cannot work here, or None: the package is not installed, or it is
    found but does not work (a broken install, or a stray directory named ``tensorboard`` on the
    path), or the check could not write (a full disk). Checked by writing one scalar into a temporary
    directory, before the run writes anything."""
    if importlib.util.find_spec("tensorboard") is None:
        return f"tensorboard = True needs the tensorboard package, which is not installed: {INSTALL}"
    scratch = tempfile.gettempdir()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            # foreign code: a package that calls os._exit() or os.kill() would end train.py without a word,
            # one that replaces sys.stderr or a builtin would break what follows (its writer thread is allowed)
            with foreign_code(threads=True):
                from torch.utils.tensorboard import SummaryWriter

                held: list[_HeldErrors] = []
                with _errors_held(held):
                    writer = SummaryWriter(scratch)
                writer.add_scalar("check", 1.0, global_step=0)
                writer.close()
                _raise_first(held)
    except OSError as e:
        message = os_error_message(e, scratch)
        if message is not None:  # the disk, not the package
            return f"tensorboard = True checks its writer in a temporary directory first, and {message}"
        return _broken(e)
    except BaseException as e:  # noqa: BLE001  (whatever a broken install raises or exits with, the fix is the same)
        return _broken(e)
    return None


def _broken(e: BaseException) -> str:
    spec = importlib.util.find_spec("tensorboard")
    where = getattr(spec, "origin", None) or ", ".join(getattr(spec, "submodule_search_locations", None) or [])
    reason = (str(e).splitlines() or [""])[0][:120]
    return (f"tensorboard = True, but the tensorboard package found ({where}) does not work "
            f"({type(e).__name__}: {reason}); reinstall it ({INSTALL}), or move aside what shadows it")


def scalars(row: dict) -> dict[str, float]:
    """The TensorBoard scalars of a metrics row: its finite numbers, per-layer lists spread out."""
    out = {}
    for key, value in row.items():
        if key == "iter":
            continue
        if isinstance(value, list):
            out.update({f"{key}/layer_{i}": v for i, v in enumerate(value) if _finite(v)})
        elif _finite(value):
            out[key] = float(value)
    return out


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class TensorBoardTracker:
    """Writes metrics rows as scalars into ``run_dir/tensorboard``; ``resumed_at``: the checkpoint's
    iteration of a resume, after which earlier events are purged. A write that fails for a reason the
    user can fix (a full disk) raises a BabyGPTError naming the event file and the fix, at the next
    row or at ``close``."""

    def __init__(self, run_dir: str, resumed_at: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.path = os.path.join(run_dir, LOG_DIR)  # then the event file, once tensorboard has named it
        self._reported = False
        self._held: list[_HeldErrors] = []
        purge = None if resumed_at is None else resumed_at + 1
        try:
            with _errors_held(self._held):
                self.writer = SummaryWriter(self.path, purge_step=purge)
        except OSError as e:
            raise self._error(e) from None
        event_writer = getattr(getattr(self.writer, "file_writer", None), "event_writer", None)
        self.path = getattr(event_writer, "_file_name", self.path)
        self._check()

    def log(self, row: dict) -> None:
        try:
            for name, value in scalars(row).items():
                self.writer.add_scalar(name, value, global_step=row["iter"])
        except OSError as e:
            raise self._error(e) from None
        self._check()

    def close(self) -> None:
        """Flush and close the event file; a write error not yet reported is raised here (one already
        raised, by ``log``, is not raised again by the close that follows it)."""
        try:
            self.writer.close()
        except OSError as e:
            if not self._reported:
                raise self._error(e) from None
        if not self._reported:
            self._check()

    def _check(self) -> None:
        try:
            _raise_first(self._held)
        except OSError as e:
            raise self._error(e) from None

    def _error(self, e: OSError) -> BaseException:
        self._reported = True
        return user_error(e, self.path, ", or run without tensorboard = True")


class _HeldErrors:
    """The event file's record writer, as tensorboard's writer thread and its flushes use it: an
    OSError (a full disk) is kept, for the tracker to raise with the file's name and the fix, instead
    of ending that thread with a traceback on stderr; the records after it are dropped."""

    def __init__(self, records):
        self._records = records
        self.error: OSError | None = None

    def write(self, data) -> None:
        self._call(self._records.write, data)

    def flush(self) -> None:
        self._call(self._records.flush)

    def close(self) -> None:
        self._call(self._records.close, always=True)

    def _call(self, method, *args, always: bool = False) -> None:
        if self.error is None or always:
            try:
                method(*args)
            except OSError as e:
                self.error = self.error or e

    def __getattr__(self, name):
        return getattr(self._records, name)


@contextlib.contextmanager
def _errors_held(held: list):
    """While SummaryWriters are made, each event file's record writer is a _HeldErrors, added to
    ``held`` (where this tensorboard is built otherwise, nothing changes: its OSErrors surface as they
    are, and are named all the same)."""
    try:
        from tensorboard.summary.writer import event_file_writer
    except ImportError:
        yield
        return
    original = getattr(event_file_writer, "RecordWriter", None)
    if original is None:
        yield
        return

    def holding(file):
        records = _HeldErrors(original(file))
        held.append(records)
        return records

    event_file_writer.RecordWriter = holding
    try:
        yield
    finally:
        event_file_writer.RecordWriter = original


def _raise_first(held: list) -> None:
    for records in held:
        if records.error is not None:
            raise records.error
