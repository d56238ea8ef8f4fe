"""How a table's verdicts are designed (babygpt/verdicts.py, babygpt/stats.py): the loss each run
counts at, Holm's intervals where it stopped, how many pairs would decide, and leave-one-seed-out."""

import csv
import json
import math
import os
import random
import statistics

import numpy as np
import pytest
import torch

from babygpt.verdicts import (EQUIVALENCE_MARGIN, SPLIT_PARTS, compare_table, count_cell, difference_interval,
                             leave_one_seed_out, loss_split, part_differences, reported_loss, run_loss, split_sentence,
                             tuning_loss, verdict_loss)
from babygpt.errors import BabyGPTError
from babygpt.stats import (MAX_PAIRS, PairedTest, pairs_for_difference, pairs_for_equivalence,
                           t_ppf)
from conftest import ROOT

UNIGRAM = 3.3473


# ---------------------------------------------------------------- the loss a run counts at

def test_tuning_and_reporting_use_the_two_halves_of_the_split_where_a_run_recorded_them():
    old = {"name": "a", "status": "finished", "val_loss_full": 2.2}
    new = {"name": "b", "status": "finished", "val_loss_full": 2.2, "tune_loss": 2.1, "test_loss": 2.3}
    from_csv = {"name": "c", "status": "finished", "val_loss_full": "2.2", "tune_loss": "", "test_loss": ""}
    assert tuning_loss(old) == reported_loss(old) == 2.2 == tuning_loss(from_csv) == reported_loss(from_csv)
    assert (tuning_loss(new), reported_loss(new)) == (2.1, 2.3)
    diverged = {"name": "d", "status": "diverged", "val_loss_full": None}
    assert math.isinf(tuning_loss(diverged)) and math.isinf(reported_loss(diverged))
    # one split per table: runs from before the test split beside runs from after it are refused
    assert loss_split([old, from_csv, diverged]) == "validation" and loss_split([new, diverged]) == "test"
    assert loss_split([diverged]) == "validation"
    with pytest.raises(BabyGPTError, match="1 of 2 runs predate the test split"):
        loss_split([old, new])
    assert split_sentence("validation", "validation") == ("LRs were tuned and losses reported on the same "
                                                          "validation split (these runs predate the test split).")
    assert "first half" in split_sentence("test", "test") and "no LR was chosen on" in split_sentence("test", "test")
    assert "which that tuning saw too" in split_sentence("validation", "test")


def test_part_differences_pair_the_runs_that_trained_on_every_part_of_the_split():
    def row(status, tune, test, whole):
        return {"status": status, "tune_loss": tune, "test_loss": test, "val_loss_full": whole}
    base = [row("finished", 2.0, 2.2, 2.1), row("finished", 2.1, 2.3, 2.2), row("finished", 2.0, 2.1, 2.05),
            row("finished", 2.2, 2.4, 2.3)]
    other = [row("finished", 2.0, 2.1, 2.05), row("collapsed", 3.3, 3.3, 3.3), row("finished", 2.05, 2.0, 2.02),
             {"status": "finished", "val_loss_full": 2.3}]  # the last predates the split: no pair
    parts = part_differences(other, base)
    assert list(parts) == list(SPLIT_PARTS) == ["test_loss", "tune_loss", "val_loss_full"]
    for key, want in (("test_loss", [-0.1, -0.1]), ("tune_loss", [0.0, 0.05]), ("val_loss_full", [-0.05, -0.03])):
        torch.testing.assert_close(parts[key], want)
    assert difference_interval([]) == "—" and difference_interval([0.0123]) == "+0.012"
    mean, half = statistics.fmean(parts["val_loss_full"]), 12.7062 * statistics.stdev(parts["val_loss_full"]) / 2 ** 0.5
    assert difference_interval(parts["val_loss_full"]) == f"{mean:+.3f} ± {half:.3f}" == "-0.040 ± 0.127"


def test_a_diverged_run_counts_at_the_unigram_loss_and_keeps_its_pair():
    rows = {s: {"name": s, "status": s, "val_loss_full": v} for s, v in
            (("finished", 2.2), ("collapsed", 3.30), ("diverged", None), ("skipped_out", None))}
    assert [verdict_loss(r, UNIGRAM) for r in rows.values()] == [2.2, 3.30, UNIGRAM, UNIGRAM]
    assert math.isinf(verdict_loss(rows["diverged"], None))  # no unigram loss to count it at: no pair
    assert math.isinf(run_loss(rows["diverged"]))  # the other experiments' reading is unchanged
    base = [2.10, 2.20, 2.15, 2.12, 2.18]
    x = [2.30, 2.41, 2.33, 2.36, verdict_loss(rows["diverged"], UNIGRAM)]
    c = compare_table({"base": base, "x": x}, "base")["x"]
    assert c.pairs == 5 and c.test.mean == pytest.approx(statistics.fmean(a - b for a, b in zip(x, base)))
    assert compare_table({"base": base, "x": x[:4] + [math.inf]}, "base")["x"].pairs == 4


# ---------------------------------------------------------------- Holm's intervals where it stopped

def random_table(rng: random.Random) -> dict:
    """A table of 2..8 configurations over 3..8 paired seeds; some differ from the baseline, most by
    little against the seeds' spread, so Holm stops at every step somewhere over many tables."""
    seeds = rng.randint(3, 8)
    base = [2.0 + rng.gauss(0, 0.05) for _ in range(seeds)]
    table = {"base": base}
    for i in range(rng.randint(1, 7)):
        effect, noise = rng.choice([0.0, 0.005, 0.01, 0.02, 0.05, -0.02]), rng.choice([0.005, 0.01, 0.02])
        table[f"c{i}"] = [b + effect + rng.gauss(0, noise) for b in base]
    return table


def excludes_zero(mean: float, half_width: float) -> bool:
    """The interval mean ± half_width lies entirely on one side of zero."""
    return math.isfinite(half_width) and abs(mean) > half_width


def test_no_interval_excludes_zero_beside_an_inconclusive_verdict():
    """Over random tables (fixed seed), an interval at the level holm_levels gives excludes zero
    exactly where the verdict is better or worse. With each hypothesis at its own step's level after
    Holm stopped, some inconclusive rows' intervals excluded zero: that count is shown to be > 0."""
    rng, own_step_would = random.Random(20240611), 0
    for _ in range(400):
        table = compare_table(random_table(rng), "base")
        decided = sorted((c.test.p_difference(), name) for name, c in table.items())
        for name, c in table.items():
            mean, half = c.test.mean, c.test.half_width(c.level)
            assert excludes_zero(mean, half) == (c.verdict in ("better", "worse")), (name, c)
            rank = [n for _, n in decided].index(name)
            own = 1 - 0.05 / (len(table) - rank)
            inconclusive = c.verdict not in ("better", "worse")
            own_step_would += inconclusive and excludes_zero(mean, c.test.half_width(own))
    assert own_step_would > 0


# ---------------------------------------------------------------- how many pairs would decide

def simulated_power(n: int, sd: float, true: float, passes, rng, reps: int = 20_000) -> float:
    """The share of ``reps`` simulated sets of n paired differences ~ N(true, sd^2) for which
    ``passes(mean, se)`` holds."""
    x = rng.normal(true, sd, (reps, n))
    return float(np.mean(passes(x.mean(axis=1), x.std(axis=1, ddof=1) / math.sqrt(n))))


@pytest.mark.parametrize("sd,alpha", [(0.02, 0.05 / 3), (0.01, 0.05), (0.005, 0.05 / 6), (0.03, 0.05)])
def test_pairs_for_equivalence_gives_80_percent_power_by_simulation(sd, alpha):
    """TOST at alpha passes where |mean| + t_{1-alpha, n-1} se < m (the 1 - 2 alpha interval inside
    ±m). At the formula's n, simulated with a true difference of 0 (fixed seed), it passes in at
    least 80% of tables, and at n - 1 in under 80% (to the simulation's error, 3 SE = 0.0085)."""
    m, rng = EQUIVALENCE_MARGIN, np.random.default_rng(7)
    n = pairs_for_equivalence(sd, m, alpha)
    # the rule it is defined by: the smallest n with sqrt(n) m / sd >= t_{1-alpha} + t_{0.9}
    assert math.sqrt(n) * m / sd >= t_ppf(1 - alpha, n - 1) + t_ppf(0.9, n - 1)
    assert n == 2 or math.sqrt(n - 1) * m / sd < t_ppf(1 - alpha, n - 2) + t_ppf(0.9, n - 2)

    def tost(k):
        return lambda mean, se: np.abs(mean) + t_ppf(1 - alpha, k - 1) * se < m
    assert simulated_power(n, sd, 0.0, tost(n), rng) >= 0.8 - 0.0085
    if n > 2:
        assert simulated_power(n - 1, sd, 0.0, tost(n - 1), rng) < 0.8 + 0.0085
    # the simulated criterion is the TOST that compare_table draws
    x = rng.normal(0, sd, n)
    test = PairedTest.of(list(x), m)
    assert (test.p_equivalence() <= alpha) == bool(tost(n)(x.mean(), x.std(ddof=1) / math.sqrt(n)))


@pytest.mark.parametrize("sd,diff,alpha", [(0.02, 0.01, 0.05 / 3), (0.01, 0.01, 0.05), (0.02, 0.03, 0.05 / 6),
                                           (0.03, -0.01, 0.05)])
def test_pairs_for_difference_gives_80_percent_power_by_simulation(sd, diff, alpha):
    rng = np.random.default_rng(11)
    n = pairs_for_difference(sd, diff, alpha)
    assert math.sqrt(n) * abs(diff) / sd >= t_ppf(1 - alpha / 2, n - 1) + t_ppf(0.8, n - 1)

    def t_test(k):
        return lambda mean, se: np.abs(mean) > t_ppf(1 - alpha / 2, k - 1) * se
    assert simulated_power(n, sd, diff, t_test(n), rng) >= 0.8 - 0.0085
    assert simulated_power(n - 1, sd, diff, t_test(n - 1), rng) < 0.8 + 0.0085


def test_pairs_to_decide_at_the_edges_and_in_the_table():
    assert pairs_for_equivalence(0.0, 0.01, 0.05) == 2  # no spread at all: any two pairs decide
    assert pairs_for_difference(0.01, 0.0, 0.05) is None  # a difference of 0 is never shown
    assert pairs_for_difference(1.0, 1e-4, 0.05) is None and count_cell(None) == "> 10,000" and MAX_PAIRS == 10_000
    assert count_cell(1234) == "≈ 1,234"
    base = [2.10, 2.20, 2.15, 2.12, 2.18]
    losses = {"base": base, "better": [b - 0.1 for b in base],
              "unsure": [b + e for b, e in zip(base, [0.02, -0.01, 0.03, 0.00, 0.01])]}
    table = compare_table(losses, "base")
    assert table["better"].verdict == "better" and table["better"].to_decide() == "—"
    unsure = table["unsure"]
    assert unsure.verdict == "inconclusive"
    # by hand: the observed paired SD; Holm rejected "better" at step 1 and stopped at step 2 (alpha / 1)
    sd = statistics.stdev([0.02, -0.01, 0.03, 0.00, 0.01])
    assert unsure.alpha_difference == pytest.approx(0.05) and unsure.alpha_equivalence == pytest.approx(0.05 / 2)
    n_eq, n_diff = pairs_for_equivalence(sd, 0.01, 0.05 / 2), pairs_for_difference(sd, 0.01, 0.05)
    assert unsure.to_decide() == f"≈ {n_eq} (TOST ±0.01); ≈ {n_diff} (difference)"


# ---------------------------------------------------------------- leave one seed out

def p_two_sided_df2(diffs: list[float]) -> float:
    """The paired t-test's two-sided p for three pairs, by Student's closed form at df = 2:
    F(t) = 1/2 + t / (2 sqrt(2 + t^2)), so p = 1 - |t| / sqrt(2 + t^2)."""
    t = statistics.fmean(diffs) / (statistics.stdev(diffs) / math.sqrt(3))
    return 1 - abs(t) / math.sqrt(2 + t * t)


def test_leave_one_seed_out_redraws_the_table_without_each_seed():
    base = [2.10, 2.20, 2.15, 2.12]
    diffs = [0.10, 0.12, 0.11, 0.30]  # worse on four pairs; one seed carries much of it
    losses = {"base": base, "x": [b + d for b, d in zip(base, diffs)]}
    assert compare_table(losses, "base")["x"].verdict == "worse"
    # by hand: each deletion leaves three pairs, one comparison (no Holm factor): worse where p <= 0.05
    by_hand = sum(p_two_sided_df2(diffs[:i] + diffs[i + 1:]) <= 0.05 for i in range(4))
    assert by_hand == 1 and leave_one_seed_out(losses, "base") == {"x": (1, 4)}
    # a steady difference survives every deletion; inconclusive rows are not counted
    steady = [b + d for b, d in zip(base, [0.10, 0.11, 0.09, 0.10])]
    unsure = [b + d for b, d in zip(base, [0.05, -0.04, 0.01, -0.02])]
    assert leave_one_seed_out({"base": base, "y": steady, "z": unsure}, "base") == {"y": (4, 4)}
    # the verdicts are the whole table's: beside two more comparisons Holm no longer calls x worse
    assert leave_one_seed_out({**losses, "y": steady, "z": unsure}, "base") == {"y": (4, 4)}


def committed_losses(result: str) -> dict:
    """{configuration: [verdict loss by evaluation seed]} of a committed experiment-2 output, read
    from its results.csv and tuned_lrs.json (every run there predates the test split)."""
    record = json.load(open(os.path.join(ROOT, result, "tuned_lrs.json")))
    with open(os.path.join(ROOT, result, "results.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    evaluation = sorted({int(r["seed"]) for r in rows} - set(record["tune_seeds"]))
    losses = {}
    for name, lr in record["tuned"].items():
        mine = {int(r["seed"]): r for r in rows
                if r["name"].startswith(name + "__") and float(r["cfg.learning_rate"]) == lr}
        losses[name] = [verdict_loss(mine[s], UNIGRAM) for s in evaluation]
    return losses


def test_the_committed_batchnorm_verdict_rests_on_one_seed():
    """The referee's finding, reproduced: in the committed variants table BatchNorm is "worse", but
    with one of the five evaluation seeds deleted the verdict stays in only one of the five tables."""
    result = "results/exp2_norm_variants"
    if not os.path.exists(os.path.join(ROOT, result, "results.csv")):
        pytest.skip(f"{result} is not here")
    losses = committed_losses(result)
    assert compare_table(losses, "prenorm_rms")["prenorm_bn"].verdict == "worse"
    stable = leave_one_seed_out(losses, "prenorm_rms")
    assert stable["prenorm_bn"] == (1, 5) and stable["sandwich_rms"] == (5, 5)
