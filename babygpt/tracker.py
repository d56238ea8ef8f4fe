"""Optional TensorBoard logging (``tensorboard = True``): every row a run writes to metrics.jsonl,
also as TensorBoard scalars in ``out_dir/tensorboard/``. metrics.jsonl stays the record that
everything else reads; the event files are a view of it for ``tensorboard --logdir out``.

Scalars are named by the row's keys: ``loss``, ``val_loss``, ``train_loss``, ``lr``,
``tokens_per_s``, ...; a per-layer list (the diagnostics, ``diag_interval`` > 0) becomes one
scalar per layer, ``resid_rms/layer_3``. On a resume, the steps after the checkpoint are purged
from the view, as they are dropped from metrics.jsonl, and logged again.
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile

from .signals import no_process_exit

LOG_DIR = "tensorboard"
INSTALL = "pip install tensorboard (or pip install -e '.[tensorboard]')"


def missing_problem() -> str | None:
    """Why ``tensorboard = True`` cannot work here, or None: the package is not installed, or it is
    found but does not work (a broken install, or a stray directory named ``tensorboard`` on the
    path). Checked by writing one scalar into a temporary directory, before the run writes anything."""
    if importlib.util.find_spec("tensorboard") is None:
        return f"tensorboard = True needs the tensorboard package, which is not installed: {INSTALL}"
    try:
        with no_process_exit():  # a package that calls os._exit() would end train.py without a word
            from torch.utils.tensorboard import SummaryWriter

            with tempfile.TemporaryDirectory() as scratch:
                writer = SummaryWriter(scratch)
                writer.add_scalar("check", 1.0, global_step=0)
                writer.close()
    except BaseException as e:  # noqa: BLE001  (whatever a broken install raises or exits with, the fix is the same)
        where = getattr(importlib.util.find_spec("tensorboard"), "origin", None) or \
            ", ".join(getattr(importlib.util.find_spec("tensorboard"), "submodule_search_locations", None) or [])
        reason = (str(e).splitlines() or [""])[0][:120]
        return (f"tensorboard = True, but the tensorboard package found ({where}) does not work "
                f"({type(e).__name__}: {reason}); reinstall it ({INSTALL}), or move aside what shadows it")
    return None


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
    iteration of a resume, after which earlier events are purged."""

    def __init__(self, run_dir: str, resumed_at: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        purge = None if resumed_at is None else resumed_at + 1
        self.writer = SummaryWriter(os.path.join(run_dir, LOG_DIR), purge_step=purge)

    def log(self, row: dict) -> None:
        for name, value in scalars(row).items():
            self.writer.add_scalar(name, value, global_step=row["iter"])

    def close(self) -> None:
        self.writer.close()
