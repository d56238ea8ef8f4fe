"""Comparing configurations fairly: each at its own tuned learning rate, then over paired seeds.

The experiments' results rows (one per run, as babygpt.sweep writes them) are read here into
the figures a comparison table shows: a run's final loss, its seeds' mean with a 95% t-interval,
and its paired difference to a baseline with the verdict that difference supports
(babygpt.stats has the statistics, babygpt.tuning the LR search). The protocol is
docs/experiments.md's.

The verdicts of one table are drawn together, k comparisons with the baseline:
  better / worse   the two-sided paired t-test rejects "no difference" after Holm-Bonferroni (Holm
                   1979) over the k comparisons (family-wise error 5%). The interval shown is the one
                   at the hypothesis' Holm step, 1 - 0.05 / (k - rank), up to the step where Holm
                   stopped and at that step's level after it (stats.holm_levels), so an interval
                   excludes zero exactly where the verdict is better or worse;
  equivalent within ±m   both one-sided tests (TOST, Schuirmann 1987) reject "|difference| >= m",
                   again after Holm over the k comparisons; m is stated before the runs from the
                   question (EQUIVALENCE_MARGIN), never estimated from them;
  inconclusive     neither: the data cannot tell, which is not the same as "no difference"; the
                   table says how many pairs would decide (Comparison.to_decide).
A run that diverged (or was skipped out) counts at the data's unigram loss, as a collapsed run in
effect does: it learned nothing a model of character frequencies does not (verdict_loss).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import BabyGPTError
from .state import COMPLETED
from .stats import PairedTest, holm, holm_levels, mean_ci, pairs_for_difference, pairs_for_equivalence

OUTCOMES = ("finished", "collapsed", "skipped_out", "diverged")  # state.ENDED, in the order tables count them
FAILED = ("skipped_out", "diverged")  # runs that ended without a result
# A verdict other than "inconclusive" needs at least this many seed pairs (>= 3 seeds); with fewer
# the interval is still shown.
MIN_PAIRS_FOR_VERDICT = 3
ALPHA = 0.05  # the family-wise error rate of a table's verdicts
# The equivalence margin m, in nats, stated before any run from the question: a difference in final
# loss that would matter at this scale. Estimating m from the runs themselves (e.g. the baseline's
# seed-to-seed SD) makes it as noisy as the data it judges: at a true difference of 0, TOST with five
# pairs then passes about 6% of the time.
EQUIVALENCE_MARGIN = 0.01


# ---------------------------------------------------------------- which loss a run is judged by

def run_loss(row: dict) -> float:
    """A run's final loss over the whole validation split; inf for a run that diverged or has none."""
    value = row.get("val_loss_full")
    return float(value) if row["status"] in COMPLETED and value is not None else math.inf


def recorded(row: dict, key: str) -> float | None:
    """The number a results row holds under ``key``; None where it holds none (a row read back from
    results.csv has "" there, one written before the field existed lacks the key)."""
    value = row.get(key)
    return None if value is None or value == "" else float(value)


def has_test_split(row: dict) -> bool:
    """Whether a run recorded both parts of the validation split: tune_loss (the first half, what
    LRs are tuned on) and test_loss (the second half, what is reported)."""
    return recorded(row, "tune_loss") is not None and recorded(row, "test_loss") is not None


def loss_split(rows) -> str:
    """"test" where every run with a result recorded both parts of the validation split, else
    "validation" (runs from before the test split: tuned and reported on the whole split). A table
    that mixes the two would pair losses measured on different text, so it is refused."""
    scored = [r for r in rows if r["status"] in COMPLETED]
    split = sum(has_test_split(r) for r in scored)
    if 0 < split < len(scored):
        first = next(r for r in scored if not has_test_split(r))
        raise BabyGPTError(f"{len(scored) - split} of {len(scored)} runs predate the test split (first: "
                           f"{first['name']}) and the others do not: their losses are on different text; "
                           f"delete the older runs' directories to train them again, or use another --out")
    return "test" if scored and split == len(scored) else "validation"


def tuning_loss(row: dict) -> float:
    """The loss an LR is tuned on: tune_loss (the validation split's first half) where the run
    recorded it, else val_loss_full (the whole split); inf for a run without a result."""
    if row["status"] not in COMPLETED:
        return math.inf
    return recorded(row, "tune_loss") if has_test_split(row) else run_loss(row)


def reported_loss(row: dict) -> float:
    """The loss a table reports: test_loss (the validation split's second half, which no LR was
    chosen on) where the run recorded it, else val_loss_full; inf for a run without a result. A
    loss chosen as the lowest on a split is biased low as an estimate on that split."""
    if row["status"] not in COMPLETED:
        return math.inf
    return recorded(row, "test_loss") if has_test_split(row) else run_loss(row)


def verdict_loss(row: dict, unigram: float | None) -> float:
    """The loss a verdict counts for a run: its reported loss, or for a run that diverged or was
    skipped out the data's ``unigram`` loss. A collapsed run ends near the unigram loss anyway, so a
    diverged one counting there keeps both failures in the comparison at the cost of learning
    nothing (dropping the pair instead would compare only the seeds where a configuration
    survived). Without a unigram loss (None) such a run stays inf and its pair is dropped."""
    if row["status"] in FAILED and unigram is not None:
        return unigram
    return reported_loss(row)


def split_sentence(tuning: str, reported: str) -> str:
    """The report's sentence on which part of the validation split LRs were tuned on and which the
    losses are reported on (``loss_split`` of the tuning runs and of the evaluation runs)."""
    if tuning == reported == "validation":
        return ("LRs were tuned and losses reported on the same validation split (these runs predate the "
                "test split).")
    tuned = ("on the first half of the validation split (its tuning part)" if tuning == "test"
             else "on the whole validation split (the tuning runs predate the test split)")
    shown = ("the whole split (the evaluation runs predate the test split)" if reported == "validation"
             else "its second half (the test part, which no LR was chosen on)" if tuning == "test"
             else "its second half (the test part, which that tuning saw too)")
    return f"LRs were tuned {tuned}; losses are reported on {shown}."


# The parts of the validation split a run records, in the words a table uses: the test part is what
# verdicts are drawn on; the other two say whether a difference there holds on other text.
SPLIT_PARTS = {"test_loss": "test part (the verdicts')", "tune_loss": "tuning part",
               "val_loss_full": "whole split (non-overlapping windows)"}


def part_differences(rows: list[dict], baseline: list[dict]) -> dict[str, list[float]]:
    """{key of SPLIT_PARTS: the paired differences rows[i] - baseline[i] on that part}, over the seeds
    where both runs finished and recorded every part. A collapsed run is left out: it sits near the
    unigram loss on every part, which would swamp the differences between parts."""
    both = [(a, b) for a, b in zip(rows, baseline) if a["status"] == b["status"] == "finished"
            and all(recorded(r, key) is not None for r in (a, b) for key in SPLIT_PARTS)]
    return {key: [recorded(a, key) - recorded(b, key) for a, b in both] for key in SPLIT_PARTS}


def difference_interval(diffs: list[float]) -> str:
    """A mean paired difference, signed, ± the half-width of its 95% t-interval ("—" if none)."""
    if not diffs:
        return "—"
    mean, half = mean_ci(diffs)
    return f"{mean:+.3f} ± {half:.3f}" if math.isfinite(half) else f"{mean:+.3f}"


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
    (a seed where either has none, inf, has no pair: see verdict_loss)."""
    return [a - b for a, b in zip(losses, baseline) if math.isfinite(a) and math.isfinite(b)]


def count_cell(n: int | None) -> str:
    """A number of seed pairs as a table shows it: "≈ 23", or "> 10,000" beyond what is counted."""
    return f"≈ {n:,}" if n is not None else "> 10,000"


@dataclass
class Comparison:
    """One configuration against the baseline: its pairs, the test, and the table-wide verdict."""

    pairs: int
    test: PairedTest | None = None
    p_adjusted: float = math.nan  # Holm-adjusted p of "no difference"
    p_equivalence: float = math.nan  # Holm-adjusted TOST p of "|difference| >= margin"
    level: float = math.nan  # the confidence of the interval at this hypothesis' Holm step
    # the levels (one-sided for TOST, two-sided for the t-test) Holm tests this comparison at now:
    # what "pairs to decide" sizes the next test for
    alpha_equivalence: float = math.nan
    alpha_difference: float = math.nan
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

    def to_decide(self) -> str:
        """For an inconclusive comparison, how many seed pairs its observed paired SD s would need
        for an 80% chance to decide it at its Holm level (stats.pairs_for_equivalence and
        pairs_for_difference, Chow, Shao & Wang 2008): equivalence within ±m if the true difference
        were 0, and a difference if the true difference were the observed one; e.g.
        "≈ 23 (TOST ±0.01); ≈ 9 (difference)". "—" for a decided comparison or one without a spread."""
        if self.verdict != "inconclusive" or self.test is None:
            return "—"
        sd = self.test.se * math.sqrt(self.test.df + 1)
        equivalence = pairs_for_equivalence(sd, self.test.margin, self.alpha_equivalence)
        difference = pairs_for_difference(sd, self.test.mean, self.alpha_difference)
        return (f"{count_cell(equivalence)} (TOST ±{self.test.margin:g}); "
                f"{count_cell(difference)} (difference)")


def compare_table(losses: dict[str, list[float]], baseline: str, margin: float = EQUIVALENCE_MARGIN,
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
    p_diff, p_eq = [c.test.p_difference() for c in family], [c.test.p_equivalence() for c in family]
    for c, p_adj, p_eq_adj, level, level_eq in zip(family, holm(p_diff), holm(p_eq), holm_levels(p_diff, alpha),
                                                   holm_levels(p_eq, alpha)):
        c.p_adjusted, c.p_equivalence, c.level = p_adj, p_eq_adj, level
        c.alpha_difference, c.alpha_equivalence = 1 - level, 1 - level_eq
        if p_adj <= alpha:  # a measured difference, even one smaller than the margin, is reported as such
            c.verdict = "better" if c.test.mean < 0 else "worse"
        elif math.isfinite(margin) and p_eq_adj <= alpha:
            c.verdict = "equivalent"
    for c in out.values():  # outside the family (too few pairs): the plain 95% interval, no verdict, and
        if c.test is not None and not math.isfinite(c.level):  # pairs to decide at Bonferroni's level
            c.level = 0.95
            c.alpha_difference = c.alpha_equivalence = alpha / len(out)
    return out


def leave_one_seed_out(losses: dict[str, list[float]], baseline: str, margin: float = EQUIVALENCE_MARGIN,
                       alpha: float = ALPHA) -> dict[str, tuple[int, int]]:
    """{name: (k, n)} for each better/worse comparison: the whole table's verdicts drawn again with
    each of the n evaluation seeds deleted in turn (the same seed from every configuration, Holm
    over the table again), and in k of them this one's verdict stayed. A verdict that rests on one
    seed pair is not yet a finding."""
    full = compare_table(losses, baseline, margin, alpha)
    decided = [name for name, c in full.items() if c.verdict in ("better", "worse")]
    n = len(losses[baseline])
    kept = dict.fromkeys(decided, 0)
    for i in range(n):
        table = compare_table({name: v[:i] + v[i + 1:] for name, v in losses.items()}, baseline, margin, alpha)
        for name in decided:
            kept[name] += table[name].verdict == full[name].verdict
    return {name: (kept[name], n) for name in decided}
