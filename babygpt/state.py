"""TrainState: where a run stands, besides its weights, optimizer and loss scaler."""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass, field

import torch

from .checkpoint import capture_rng
from .data import BatchSampler
from .signals import signal_name

# How a run ended (summary.json's "status"), each defined once here; docs/reliability.md lists them.
STATUSES = {
    "finished": "reached max_iters (or an evaluation at or below target_val_loss) with finite losses; its "
                "loss over the whole validation split is better than the data's unigram model by more than the "
                "collapse margin (ngram.py)",
    "collapsed": "reached max_iters, but its whole-split loss is within the collapse margin of the "
                 "unigram loss, or above it: it learned no more than character frequencies",
    "skipped_out": "reached max_iters, but more than half of its steps were skipped (nonfinite=skip, or "
                   "float16's loss scaler) or its losses at the end are not finite: it has no result",
    "diverged": "stopped at its first non-finite loss (nonfinite=stop); the checkpoints keep the last good state",
    "interrupted": "stopped by SIGINT or SIGTERM after saving a checkpoint; resume it",
}
COMPLETED = ("finished", "collapsed")  # runs with a result: a final loss over the whole validation split
AT_END = (*COMPLETED, "skipped_out")  # runs that reached max_iters
ENDED = (*AT_END, "diverged")  # runs that are over: a sweep does not train them again
MAX_SKIPPED_FRACTION = 0.5  # a run with more of its steps skipped than this is skipped_out
COUNTERS = ("first_nonfinite", "skipped_steps", "scaler_skipped_steps")  # nested under "counters" in a checkpoint
PER_RANK = ("sampler", "pending_rng")  # each process's own; see TrainState.rank_state


def finite_or_none(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def is_finite_number(value) -> bool:
    """An int or float a float can hold (a JSON integer can be too large for one: 10**400)."""
    if type(value) is int:
        return abs(value) <= sys.float_info.max
    return type(value) is float and math.isfinite(value)


def _is_number(value, finite: bool = True) -> bool:
    return is_finite_number(value) if finite else type(value) in (int, float)


def summary_problems(summary: dict) -> list[str]:
    """What makes ``summary`` (a summary.json object) not one a run writes: an unknown status, or a
    field its status needs missing or of the wrong type (e.g. a "finished" run without a finite
    loss over the whole validation split). Readers refuse such a file instead of reading blanks."""
    status = summary.get("status")
    if status not in STATUSES:
        return [f"its status {status!r} is none of {', '.join(STATUSES)}"]
    needed = {"iter": lambda v: type(v) is int and v >= 0}
    if status in COMPLETED:
        needed.update(val_loss_full=_is_number, final_val_loss=_is_number, best_val_loss=_is_number)
    if status == "diverged":
        needed["diverged_at"] = lambda v: type(v) is int
    return [f"its status is {status!r} but its {key} is {summary.get(key)!r}"
            for key, ok in needed.items() if not ok(summary.get(key))]


@dataclass
class TrainState:
    """Everything about a run's progress that a resume restores and summary.json reports, besides
    the model, optimizer and scaler. Each field is declared here once; the checkpoint's fields
    are read off this declaration.

    The batch sampler's and the random generators' states belong to one process (under torchrun
    each rank draws its own batches and dropout masks): ``rank_state`` / ``load_rank_state``."""

    sampler: BatchSampler
    iter: int = 0  # optimizer steps taken
    best_val_loss: float = math.inf
    last_eval: dict = field(default_factory=dict)  # {"iter", "train_loss", "val_loss"} of the last finite eval
    elapsed_s: float = 0.0  # training time over every start of the run, as of the last update
    first_nonfinite: int | None = None  # the first iteration whose loss was not finite
    skipped_steps: int = 0  # steps dropped by nonfinite=skip
    scaler_skipped_steps: int = 0  # steps the float16 GradScaler dropped (inf/NaN gradients)
    pending_rng: dict | None = None  # generator states loaded from a checkpoint, applied when training starts

    def check_types(self) -> None:
        """TypeError/ValueError if a restored field cannot be what it claims (a damaged checkpoint)."""
        if type(self.iter) is not int or self.iter < 0:
            raise ValueError(f"iter {self.iter!r}")
        for name in ("best_val_loss", "elapsed_s"):
            if type(getattr(self, name)) not in (int, float):
                raise TypeError(f"{name} {getattr(self, name)!r}")
        if not isinstance(self.last_eval, dict):
            raise TypeError("last_eval")

    def _shared(self) -> list[str]:
        return [f.name for f in dataclasses.fields(self) if f.name not in PER_RANK]

    def state_dict(self) -> dict:
        """The fields every rank shares (rank 0's, in a checkpoint)."""
        values = {name: getattr(self, name) for name in self._shared()}
        return {**{k: v for k, v in values.items() if k not in COUNTERS},
                "counters": {k: values[k] for k in COUNTERS}}

    def load_state_dict(self, state: dict) -> None:
        """Restore from ``state`` (e.g. a whole checkpoint; other keys are ignored). KeyError if a field is missing."""
        flat = {**state, **state["counters"]}
        for name in self._shared():
            setattr(self, name, flat[name])

    def rank_state(self, device: torch.device) -> dict:
        return {"sampler": self.sampler.state_dict(), "rng": capture_rng(device)}

    def load_rank_state(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])
        self.pending_rng = state["rng"]

    def skipped_out(self, final_val_loss: float | None) -> bool:
        """Whether a run that reached its end has no result: most of its steps skipped, or its
        last evaluation (``final_val_loss``, over the whole validation split) not finite, or its
        last periodic evaluation not at its last step (the ones after it were not finite)."""
        skipped = self.skipped_steps + self.scaler_skipped_steps
        return (skipped > MAX_SKIPPED_FRACTION * max(self.iter, 1) or finite_or_none(final_val_loss) is None
                or self.last_eval.get("iter") != self.iter)

    def summary(self, status: str, max_iters: int, signum: int | None) -> dict:
        """summary.json: how the run ended (one of STATUSES) and where it stands."""
        return {
            "status": status,
            "iter": self.iter,
            "max_iters": max_iters,
            "diverged_at": self.first_nonfinite if status == "diverged" else None,
            "first_nonfinite_at": self.first_nonfinite,
            "skipped_steps": self.skipped_steps,
            "scaler_skipped_steps": self.scaler_skipped_steps,
            "final_train_loss": self.last_eval.get("train_loss"),
            "final_val_loss": self.last_eval.get("val_loss"),
            "final_eval_iter": self.last_eval.get("iter"),
            "best_val_loss": finite_or_none(self.best_val_loss),
            "wall_time_s": round(self.elapsed_s, 3),
            "signal": signal_name(signum) if status == "interrupted" else None,
        }
