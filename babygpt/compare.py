"""Comparing configurations fairly: each at its own tuned learning rate, then over paired seeds.

The experiments' results rows (one per run, as babygpt.sweep writes them) are read here into
the figures a comparison table shows: a run's final loss, a configuration's tuned LR, its seeds'
mean with a 95% t-interval, and its paired difference to a baseline with the verdict that
difference supports (babygpt.stats has the statistics).
"""

from __future__ import annotations

import math

from .state import COMPLETED
from .stats import excludes_zero, mean_ci, paired_difference

OUTCOMES = ("finished", "collapsed", "diverged")
# A verdict (better / worse) needs at least this many seed pairs (GUIDE §6: >= 3 seeds); with fewer
# the interval is still shown, and the verdict is "no difference measured".
MIN_PAIRS_FOR_VERDICT = 3


def run_loss(row: dict) -> float:
    """A run's final loss over the whole validation split; inf for a run that diverged or has none."""
    value = row.get("val_loss_full")
    return float(value) if row["status"] in COMPLETED and value is not None else math.inf


def best_lr(rows_by_lr: dict) -> float | None:
    """The learning rate whose run has the lowest finite loss; None if every run diverged."""
    finite = {lr: run_loss(row) for lr, row in rows_by_lr.items() if math.isfinite(run_loss(row))}
    return min(finite, key=finite.get) if finite else None


def outcome_counts(rows: list[dict]) -> str:
    """e.g. "2 finished, 1 collapsed"."""
    counts = {s: sum(r["status"] == s for r in rows) for s in OUTCOMES}
    return ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "—"


def mean_interval(losses: list[float]) -> str:
    """The mean of the finite losses ± the half-width of its 95% t-interval ("—" if none)."""
    finite = [v for v in losses if math.isfinite(v)]
    if not finite:
        return "—"
    mean, half = mean_ci(finite)
    return f"{mean:.3f} ± {half:.3f}" if math.isfinite(half) else f"{mean:.3f}"


def verdict(mean: float, half: float) -> str:
    """better / worse (lower / higher loss) only where the interval excludes zero."""
    if not excludes_zero(mean, half):
        return "no difference measured"
    return "better" if mean < 0 else "worse"


def paired_against(losses: list[float], baseline: list[float]) -> tuple[str, str]:
    """(paired difference ± 95% half-width, verdict) of ``losses`` minus ``baseline``, two lists in
    the same seed order; a seed where either run diverged has no pair. Fewer than
    MIN_PAIRS_FOR_VERDICT pairs give no verdict, whatever the interval."""
    pairs = [(a, b) for a, b in zip(losses, baseline) if math.isfinite(a) and math.isfinite(b)]
    if len(pairs) < 2:
        return "—", "fewer than 2 pairs"
    mean, half = paired_difference([a for a, _ in pairs], [b for _, b in pairs])
    if len(pairs) < MIN_PAIRS_FOR_VERDICT:
        return f"{mean:+.3f} ± {half:.3f}", f"no difference measured ({len(pairs)} pairs)"
    return f"{mean:+.3f} ± {half:.3f}", verdict(mean, half)
