"""Comparing configurations fairly: each at its own tuned learning rate, then over paired seeds.

The experiments' results rows (one per run, as babygpt.sweep writes them) are read here into
the figures a comparison table shows: a run's final loss, its seeds' mean with a 95% t-interval,
and its paired difference to a baseline with the verdict that difference supports
(babygpt.stats has the statistics, babygpt.tuning the LR search).

The verdicts of one table are drawn together (GUIDE §6), k comparisons with the baseline:
  better / worse   the two-sided paired t-test rejects "no difference" after Holm-Bonferroni over the
                   k comparisons (family-wise error 5%); the interval shown is the one at the
                   hypothesis' Holm step, 1 - 0.05 / (k - rank), so it excludes zero where it rejects;
  equivalent within ±m   both one-sided tests (TOST) reject "|difference| >= m", again after Holm
                   over the k comparisons; m is stated with the table (equivalence_margin);
  inconclusive     neither: the data cannot tell, which is not the same as "no difference".
"""

from __future__ import annotations

import math

import statistics
from dataclasses import dataclass

from .state import COMPLETED
from .stats import PairedTest, holm, holm_levels, mean_ci

OUTCOMES = ("finished", "collapsed", "skipped_out", "diverged")  # state.ENDED, in the order tables count them
# A verdict other than "inconclusive" needs at least this many seed pairs (GUIDE §6: >= 3 seeds);
# with fewer the interval is still shown.
MIN_PAIRS_FOR_VERDICT = 3
ALPHA = 0.05  # the family-wise error rate of a table's verdicts


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


def floor_interval(losses: list[float], floor: float) -> str:
    """The regime of a configuration's runs: the mean of the finite losses minus ``floor`` (the
    data's strongest n-gram loss), and "above" or "below" where the mean's 95% interval lies wholly
    on one side of it ("at" where it holds the floor, "—" without losses). Below the floor, a
    transformer has learned more than counting contexts does; above it, a verdict is about how a
    configuration starts to learn."""
    finite = [v for v in losses if math.isfinite(v)]
    if not finite:
        return "—"
    mean, half = mean_ci(finite)
    gap = mean - floor
    if not math.isfinite(half):  # one run: no interval, so no side is claimed
        return f"{gap:+.3f}"
    side = "above" if gap - half > 0 else "below" if gap + half < 0 else "at"
    return f"{gap:+.3f} ({side})"


def pairs_of(losses: list[float], baseline: list[float]) -> list[float]:
    """The paired differences losses[i] - baseline[i] over the seeds where both runs have a loss
    (a seed where either diverged has no pair)."""
    return [a - b for a, b in zip(losses, baseline) if math.isfinite(a) and math.isfinite(b)]


def equivalence_margin(baseline: list[float]) -> float:
    """The seed-to-seed standard deviation of the baseline's runs (finite losses; nan with fewer than
    two): a difference smaller than what re-seeding the reference configuration does to its own loss
    is what "equivalent" means in a table. The baseline's, not one pooled over the table, so that a
    noisy configuration cannot widen the margin it is judged by."""
    finite = [v for v in baseline if math.isfinite(v)]
    return statistics.stdev(finite) if len(finite) >= 2 else math.nan


@dataclass
class Comparison:
    """One configuration against the baseline: its pairs, the test, and the table-wide verdict."""

    pairs: int
    test: PairedTest | None = None
    p_adjusted: float = math.nan  # Holm-adjusted p of "no difference"
    p_equivalence: float = math.nan  # Holm-adjusted TOST p of "|difference| >= margin"
    level: float = math.nan  # the confidence of the interval at this hypothesis' Holm step
    verdict: str = "inconclusive"

    def delta(self) -> str:
        """The paired difference ± its plain (unadjusted) 95% half-width."""
        if self.test is None:
            return "—"
        return f"{self.test.mean:+.3f} ± {self.test.half_width(0.95):.3f}"

    def adjusted(self) -> str:
        """The Holm-step interval, e.g. "+0.012 ± 0.031 (99.5%)"."""
        if self.test is None:
            return "—"
        return f"{self.test.mean:+.3f} ± {self.test.half_width(self.level):.3f} ({100 * self.level:.4g}%)"

    def call(self) -> str:
        """The verdict as a table shows it."""
        if self.test is None:
            return f"inconclusive ({self.pairs} pair{'s' if self.pairs != 1 else ''})"
        if self.verdict == "equivalent":
            return f"equivalent within ±{self.test.margin:.3f}"
        if self.verdict == "inconclusive" and self.pairs < MIN_PAIRS_FOR_VERDICT:
            return f"inconclusive ({self.pairs} pairs)"
        return self.verdict


def compare_table(losses: dict[str, list[float]], baseline: str, margin: float,
                  alpha: float = ALPHA) -> dict[str, Comparison]:
    """Every configuration but ``baseline`` against it ({name: [loss by seed]}, all in one seed
    order): tests on the paired differences, then Holm over the comparisons with at least
    MIN_PAIRS_FOR_VERDICT pairs, for the difference and for equivalence within ``margin``."""
    out = {}
    for name, values in losses.items():
        if name == baseline:
            continue
        diffs = pairs_of(values, losses[baseline])
        out[name] = Comparison(len(diffs), PairedTest.of(diffs, margin) if len(diffs) >= 2 else None)
    family = [c for c in out.values() if c.test is not None and c.pairs >= MIN_PAIRS_FOR_VERDICT]
    p_diff = [c.test.p_difference() for c in family]
    for c, p_adj, p_eq, level in zip(family, holm(p_diff), holm([c.test.p_equivalence() for c in family]),
                                     holm_levels(p_diff, alpha)):
        c.p_adjusted, c.p_equivalence, c.level = p_adj, p_eq, level
        if p_adj <= alpha:  # a measured difference, even one smaller than the margin, is reported as such
            c.verdict = "better" if c.test.mean < 0 else "worse"
        elif math.isfinite(margin) and p_eq <= alpha:
            c.verdict = "equivalent"
    for c in out.values():  # outside the family (too few pairs): the plain 95% interval, no verdict
        if c.test is not None and not math.isfinite(c.level):
            c.level = 0.95
    return out
