"""Tuning a learning rate so that a second seed cannot overturn it (docs/experiments.md, "How
configurations are compared").

A configuration's LR is the one with the lowest *mean* final loss over its tuning seeds (at least
two), searched in rounds:

  1. the half-decade grid (..., 3e-4, 1e-3, 3e-3, 1e-2, ...);
  2. while the best LR is at an edge of what was tried, one more half-decade step beyond that edge
     (at most MAX_EXTENSIONS per side), so the loss is seen to rise, or the runs to diverge or
     collapse, on both sides of the best: a best LR at the edge of its grid is not a tuned LR;
  3. one refinement: the quarter-decade points between the best and its two neighbours.

The search is a pure function of the losses it has seen, so every process of a sharded sweep
computes the same next round from the same records. An LR whose tuning seeds did not all finish
(one diverged) has mean loss +inf: it is never chosen and always counts as "the loss rose".
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

HALF_DECADE = math.sqrt(10.0)
MAX_EXTENSIONS = 3  # per side: 1.5 decades beyond the grid before the search gives up (censored)


def round_sig(value: float, digits: int = 2) -> float:
    """``value`` to ``digits`` significant figures (run names and tables show LRs this way)."""
    return float(f"{value:.{digits - 1}e}")


def snap_half_decade(lr: float) -> float:
    """The point of the half-decade lattice {1, 3} x 10^k nearest to ``lr`` in log scale."""
    exponent = math.floor(math.log10(lr))
    candidates = [m * 10.0 ** e for e in (exponent - 1, exponent, exponent + 1) for m in (1, 3)]
    return round_sig(min(candidates, key=lambda c: abs(math.log(c / lr))))


def mean_loss(losses: list[float]) -> float:
    """The mean over tuning seeds; +inf if any seed has no finite loss (it diverged)."""
    return statistics.fmean(losses) if losses and all(math.isfinite(v) for v in losses) else math.inf


@dataclass
class LRSearch:
    """One configuration's search. ``next_round(means)`` gives the LRs to train next (each on every
    tuning seed), from the mean loss of every LR tried so far; an empty list means the search is over."""

    grid: list[float]
    max_extensions: int = MAX_EXTENSIONS
    refine: bool = True  # False: a coarse search, on the half-decade lattice only (no step 3)
    extended: dict = field(default_factory=lambda: {"low": 0, "high": 0})
    refined: bool = False

    def next_round(self, means: dict[float, float]) -> list[float]:
        if not means:
            return sorted(self.grid)
        side = self.edge(means)
        if side is not None and self.extended[side] < self.max_extensions:
            self.extended[side] += 1
            edge = min(means) if side == "low" else max(means)
            step = HALF_DECADE if side == "high" else 1 / HALF_DECADE
            return [snap_half_decade(edge * step)]
        if self.refine and not self.refined and best(means) is not None:
            self.refined = True
            return refinement(means)
        return []

    def edge(self, means: dict[float, float]) -> str | None:
        """"low" or "high" if the best LR is the smallest or largest tried (every LR diverging counts
        as "low": smaller LRs are the way out), else None."""
        top = best(means)
        if top is None:
            return "low"
        if top == min(means):
            return "low"
        if top == max(means):
            return "high"
        return None

    def censored(self, means: dict[float, float]) -> bool:
        """True if the search stopped with the best LR still at an edge (MAX_EXTENSIONS reached)."""
        return self.edge(means) is not None


def best(means: dict[float, float]) -> float | None:
    """The LR of the lowest finite mean loss (the smaller LR on a tie); None if none is finite."""
    return (ranked(means) or [None])[0]


def ranked(means: dict[float, float]) -> list[float]:
    """The LRs with a finite mean loss, best first: [tuned, second best, ...]."""
    return sorted((lr for lr in means if math.isfinite(means[lr])), key=lambda lr: (means[lr], lr))


def refinement(means: dict[float, float]) -> list[float]:
    """The quarter-decade points: the geometric midpoints (2 significant figures) between the best LR
    and its nearest tried neighbours on each side, unless already tried."""
    top = best(means)
    lrs = sorted(means)
    i = lrs.index(top)
    neighbours = [lrs[j] for j in (i - 1, i + 1) if 0 <= j < len(lrs)]
    points = [round_sig(math.sqrt(top * n)) for n in neighbours]
    return [p for p in points if all(not math.isclose(p, lr, rel_tol=1e-9) for lr in lrs)]


def search_all(grids: dict[str, list[float]], train_round, max_extensions: int = MAX_EXTENSIONS,
               refine: bool = True) -> dict:
    """Run every configuration's search together, a round at a time: ``train_round({name: [lrs]})``
    trains those LRs (on every tuning seed) and returns {name: {lr: [losses by tuning seed]}} for
    *every* LR tried so far. Returns {name: (LRSearch, {lr: mean loss})} once every search is over;
    ``refine`` False leaves out the quarter-decade round (a coarse search)."""
    searches = {name: LRSearch(list(grid), max_extensions, refine) for name, grid in grids.items()}
    means: dict[str, dict[float, float]] = {name: {} for name in grids}
    wanted = {name: s.next_round({}) for name, s in searches.items()}
    while any(wanted.values()):
        losses = train_round(wanted)
        means = {name: {lr: mean_loss(v) for lr, v in losses[name].items()} for name in grids}
        wanted = {name: s.next_round(means[name]) for name, s in searches.items()}
    return {name: (searches[name], means[name]) for name in grids}
