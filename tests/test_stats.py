"""t-intervals, paired differences and LR sensitivity (babygpt/stats.py)."""

import itertools
import math
import statistics

import pytest

from babygpt.stats import kendall_p, kendall_tau, lr_sensitivity, mean_ci, t_ppf

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, for df = 1 .. 30, as printed tables give them.
T_975_TABLE = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
               2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
               2.045, 2.042)


def test_t_ppf_is_exact_to_1e6_at_known_quantiles():
    # published values to full double precision, and the two closed forms: df = 1 is Cauchy,
    # t = tan(pi (p - 1/2)); df = 2 has t = q sqrt(2 / (1 - q^2)) with q = 2p - 1
    known = {1: 12.706204736174696, 4: 2.7764451051977987, 29: 2.045229642132703}
    for df, t in known.items():
        assert t_ppf(0.975, df) == pytest.approx(t, abs=1e-6)
    assert t_ppf(0.975, 1) == pytest.approx(math.tan(math.pi * 0.475), abs=1e-6)
    assert t_ppf(0.975, 2) == pytest.approx(0.95 * math.sqrt(2 / (1 - 0.95 ** 2)), abs=1e-6)
    assert t_ppf(0.975, 10_000) == pytest.approx(1.959964, abs=1e-3)  # towards the normal's quantile


def test_mean_ci_is_the_t_interval_with_the_exact_quantile():
    values = [2.10, 2.14, 2.12]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(2.12)
    t_2 = 0.95 * math.sqrt(2 / (1 - 0.95 ** 2))  # t_{0.975, 2} = 4.3027, not the table's 4.303
    assert half == pytest.approx(t_2 * statistics.stdev(values) / math.sqrt(3), rel=1e-9)
    assert math.isnan(mean_ci([1.0])[1])


def test_pairing_removes_the_shared_seed_effect():
    seed_effect = [0.05, -0.04, 0.01, 0.08]  # what each seed does to both configurations
    a = [2.0 + s for s in seed_effect]
    b = [2.1 + s + d for s, d in zip(seed_effect, [0.001, -0.001, 0.002, 0.0])]
    unpaired = mean_ci(a)[1] + mean_ci(b)[1]
    diff, half = mean_ci([x - y for x, y in zip(a, b)])
    assert diff == pytest.approx(-0.1005) and half < unpaired / 10 and abs(diff) > half


def test_lr_sensitivity_caps_failures_at_the_initial_loss():
    init = 4.2
    flat = {1e-3: 2.0, 3e-3: 2.0, 1e-2: 2.0}
    assert lr_sensitivity(flat, init) == 0.0
    # One LR diverged (nan) and one ended above the initial loss: both count as the initial loss.
    curve = {1e-3: 2.2, 3e-3: 2.0, 1e-2: math.nan, 3e-2: 5.0, 1e-1: 2.6}
    assert lr_sensitivity(curve, init) == pytest.approx((0.2 + 0.0 + 2.2 + 2.2 + 0.6) / 5)


def test_a_run_without_a_result_scores_as_infinitely_bad():
    from babygpt.verdicts import run_loss

    by_lr = {1e-3: {"status": "finished", "val_loss_full": 2.3}, 3e-3: {"status": "collapsed", "val_loss_full": 3.3},
             1e-2: {"status": "diverged", "val_loss_full": None}, 3e-2: {"status": "diverged", "val_loss_full": 1.0}}
    assert run_loss(by_lr[1e-3]) == 2.3 and run_loss(by_lr[3e-3]) == 3.3
    assert math.isinf(run_loss(by_lr[1e-2])) and math.isinf(run_loss(by_lr[3e-2]))


def test_table_cells_of_seeds_and_outcomes():
    from babygpt.verdicts import floor_interval, mean_interval, outcome_counts, pairs_of

    # a seed where either configuration diverged has no pair
    assert pairs_of([2.0, math.inf, 2.1], [2.1, 2.2, math.inf]) == [pytest.approx(-0.1)]
    assert mean_interval([2.0, math.inf]) == "2.000" and mean_interval([math.inf]) == "—"
    # against a floor: the side is claimed only where the mean's whole interval lies on it
    half = mean_ci([1.50, 1.51, 1.52])[1]
    assert 0 < half < 0.09 and floor_interval([1.50, 1.51, 1.52, math.inf], 1.60) == "-0.090 (below)"
    assert floor_interval([1.50, 1.51, 1.52], 1.40) == "+0.110 (above)"
    assert floor_interval([2.0, 2.2], 1.5) == "+0.600 (at)"  # two seeds: t(1) makes the interval wide
    assert floor_interval([1.6], 1.5) == "+0.100" and floor_interval([math.inf], 1.5) == "—"
    assert mean_interval([2.0, 2.2]) == f"2.100 ± {mean_ci([2.0, 2.2])[1]:.3f}"
    rows = [{"status": s} for s in ("finished", "collapsed", "finished", "diverged")]
    assert outcome_counts(rows) == "2 finished, 1 collapsed, 1 diverged" and outcome_counts([]) == "—"


# ---------------------------------------------------------------- p-values, Holm, TOST

def test_t_cdf_and_ppf_match_the_table_and_closed_forms():
    from babygpt.stats import t_cdf, t_ppf

    for df, q in enumerate(T_975_TABLE, start=1):  # the table's quantiles, to its 3 decimals
        assert t_ppf(0.975, df) == pytest.approx(q, abs=6e-4)
        assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-4)  # the table's rounding
    # df = 1 is the Cauchy distribution, df = 2 has F(t) = 1/2 + t / (2 sqrt(2 + t^2))
    for t in (-3.0, -0.5, 0.0, 0.7, 4.0):
        assert t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-12)
        assert t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * math.sqrt(2 + t * t)), abs=1e-12)
    assert t_ppf(0.5, 7) == pytest.approx(0.0, abs=1e-9) and t_ppf(0.05, 4) == pytest.approx(-2.131847, abs=1e-5)
    with pytest.raises(ValueError):
        t_ppf(1.0, 3)


def test_paired_test_p_values_match_their_intervals():
    from babygpt.stats import PairedTest

    diffs = [0.03, 0.05, 0.02, 0.06, 0.04]
    test = PairedTest.of(diffs, margin=0.1)
    mean, half = mean_ci(diffs)
    assert test.mean == pytest.approx(mean) and test.half_width(0.95) == pytest.approx(half, rel=2e-4)
    # the 95% interval's edge sits exactly at p = 0.05: shift the data so that it touches zero
    touching = PairedTest.of([d - (mean - test.half_width(0.95)) for d in diffs], margin=0.1)
    assert touching.p_difference() == pytest.approx(0.05, abs=1e-9)
    # TOST at 5% rejects exactly when the 90% interval lies inside (-m, m)
    lo, hi = test.mean - test.half_width(0.90), test.mean + test.half_width(0.90)
    assert PairedTest(test.mean, test.se, test.df, hi + 1e-6).p_equivalence() < 0.05
    assert PairedTest(test.mean, test.se, test.df, hi - 1e-6).p_equivalence() > 0.05
    assert lo > 0
    same = PairedTest.of([0.0, 0.0, 0.0], margin=0.01)  # no spread: exactly no difference, exactly equivalent
    assert same.p_difference() == 1.0 and same.p_equivalence() == 0.0
    with pytest.raises(ValueError):
        PairedTest.of([0.1], margin=0.1)


def test_holm_adjusts_in_steps_and_keeps_the_order():
    from babygpt.stats import holm, holm_levels

    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005 (x4), 0.01 (x3), 0.03 (x2), 0.04 (x1), each at least the one before
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    # Holm rejects 0.005 (<= 0.05/4) and 0.01 (<= 0.05/3), stops at 0.03 (> 0.05/2): 0.04 is never
    # tested at its own step (0.05/1), so its interval is the stopping step's, 1 - 0.05/2
    assert holm_levels(p) == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 2, 1 - 0.05 / 2, 1 - 0.05 / 4])
    assert holm_levels([0.001, 0.002]) == pytest.approx([1 - 0.05 / 2, 1 - 0.05 / 1])  # no stop: each its own
    assert holm_levels([0.3, 0.001, 0.02]) == pytest.approx([1 - 0.05 / 1, 1 - 0.05 / 3, 1 - 0.05 / 2])
    assert holm_levels([0.3, 0.02, 0.04]) == pytest.approx([1 - 0.05 / 3] * 3)  # stopped at the first step
    assert holm([]) == [] and holm([0.2]) == [0.2]


def test_a_table_draws_better_worse_equivalent_and_inconclusive_together():
    from babygpt.verdicts import EQUIVALENCE_MARGIN, compare_table

    base = [2.10, 2.20, 2.15, 2.12, 2.18]
    losses = {"base": base,
              "better": [b - 0.10 + e for b, e in zip(base, [0.00, 0.01, -0.01, 0.005, -0.005])],
              "same": [b + e for b, e in zip(base, [0.001, -0.001, 0.0, 0.001, -0.001])],
              "noisy": [b + e for b, e in zip(base, [0.2, -0.1, 0.3, -0.2, 0.1])],
              "short": [2.0, 2.1, math.inf, math.inf, math.inf]}
    margin = EQUIVALENCE_MARGIN  # stated in advance, whatever the baseline's own spread
    assert margin == 0.01 and compare_table(losses, "base")["same"].test.margin == margin
    table = compare_table(losses, "base", margin)
    assert set(table) == {"better", "same", "noisy", "short"}
    assert table["better"].call() == "better" and table["better"].p_adjusted <= 0.05
    assert table["same"].call() == f"equivalent within ±{margin:.3f}"
    assert table["noisy"].call() == "inconclusive"
    assert table["short"].call() == "inconclusive (2 pairs)" and table["short"].test is not None
    # three comparisons with enough pairs form the family: the smallest p is tested at 1 - 0.05/3, and
    # Holm stops at the second step (1 - 0.05/2), whose level the third gets too; "short" has its plain 95%
    assert sorted(c.level for c in table.values()) == pytest.approx([0.95, 1 - 0.05 / 2, 1 - 0.05 / 2, 1 - 0.05 / 3])
    assert table["better"].level == pytest.approx(1 - 0.05 / 3)
    # what one comparison alone calls better, a family of many may not: Holm widens the bar
    nearly = [b - 0.012 + e for b, e in zip(base, [0.008, -0.01, 0.005, -0.007, 0.004])]
    alone = compare_table({"base": base, "x": nearly}, "base", margin)["x"]
    crowd = {"base": base, "x": nearly, **{f"null{i}": [b + 0.3 * ((i + j) % 3 - 1) for j, b in enumerate(base)]
                                            for i in range(9)}}
    assert alone.call() == "better" and 0.005 < alone.p_adjusted <= 0.05
    assert compare_table(crowd, "base", margin)["x"].call() != "better"


def test_a_difference_too_small_to_matter_is_still_reported_when_measured():
    from babygpt.verdicts import compare_table

    base = [2.10, 2.20, 2.15, 2.12, 2.18]
    tiny = [b + 0.002 + e for b, e in zip(base, [0.0001, -0.0001, 0.0, 0.0002, -0.0002])]
    c = compare_table({"base": base, "tiny": tiny}, "base", margin=0.05)["tiny"]
    assert c.p_equivalence <= 0.05 and c.call() == "worse"  # measured, and smaller than the margin
    assert c.adjusted().endswith("(95%)") and c.delta().startswith("+0.002")


@pytest.mark.parametrize("ys,tau,p", [
    ([1, 2, 3, 4], 1.0, 2 / 24),      # the same order: only it and the reverse reach |tau| = 1
    ([4, 3, 2, 1], -1.0, 2 / 24),
    ([1, 3, 2, 4], 4 / 6, 8 / 24),    # one discordant pair of six; orders with 0, 1, 5 or 6 inversions: 1+3+3+1
    ([2, 1, 4, 3], 2 / 6, 18 / 24),   # two discordant pairs: |tau| >= 1/3 unless 3 inversions (6 of 24 orders)
])
def test_kendall_tau_and_its_exact_p_against_counted_inversions(ys, tau, p):
    assert kendall_tau([1, 2, 3, 4], ys) == pytest.approx(tau)
    assert kendall_p([1, 2, 3, 4], ys) == pytest.approx(p)


def test_tau_cells_print_a_small_exact_p_without_rounding_it_to_zero():
    from babygpt.rankings import tau_cells
    a = {c: (float(i), "—") for i, c in enumerate("abcdefg")}
    assert tau_cells(a, a, list(a))[1:3] == ["+1.000", "0.0004"]  # 2 orders of 7! reach |tau| = 1
    b = {c: (float(i), "—") for i, c in enumerate("abcdgfe")}
    assert tau_cells(a, b, list(a))[2] == f"{kendall_p(list(range(7)), [0, 1, 2, 3, 6, 5, 4]):.3f}"


def test_kendall_tau_b_leaves_ties_out_of_both_counts():
    # pairs (1,2) tied in y; (1,3), (2,3) concordant: tau-b = 2 / sqrt(3 * 2)
    assert kendall_tau([1, 2, 3], [1, 1, 2]) == pytest.approx(2 / math.sqrt(6))
    assert math.isnan(kendall_tau([1, 2], [5, 5]))  # no untied pair: no order to agree with
    with pytest.raises(ValueError, match="two scorings of the same >= 2 items"):
        kendall_tau([1, 2], [1])
    with pytest.raises(ValueError, match="n = 10 is too many"):
        kendall_p(list(range(10)), list(range(10)))


@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7])
@pytest.mark.slow
def test_kendall_ceiling_is_the_smallest_tau_the_exact_permutation_test_rejects(n):
    from babygpt.stats import kendall_ceiling

    xs = list(range(n))
    orders = list(itertools.permutations(range(n)))
    taus = sorted(abs(kendall_tau(xs, list(order))) for order in orders)  # every order's |tau|, by brute force
    p_of = {round(t, 9): sum(u >= t - 1e-12 for u in taus) / len(taus) for t in taus}
    significant = [t for t, p in p_of.items() if p <= 0.05]
    if not significant:
        assert kendall_ceiling(n) is None
        return
    assert kendall_ceiling(n) == pytest.approx(min(significant))
    at = next(o for o in orders if abs(abs(kendall_tau(xs, list(o))) - min(significant)) < 1e-9)
    assert kendall_p(xs, list(at)) <= 0.05  # the project's own exact test agrees at the ceiling
    if n == 7:  # the figure the docs quote: with seven configurations only tau >= 0.714 can reject
        assert round(kendall_ceiling(7), 3) == 0.714


@pytest.mark.parametrize("k,n", [(0, 5), (1, 7), (3, 10), (5, 5), (12, 30)])
def test_clopper_pearson_ends_are_where_each_binomial_tail_is_two_and_a_half_percent(k, n):
    """The reference is the binomial itself: at the lower end P(X >= k) = 0.025, at the upper end
    P(X <= k) = 0.025 (k = 0 and k = n put an end at 0 or 1)."""
    from babygpt.stats import clopper_pearson

    def at_least(p):
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k, n + 1))

    def at_most(p):
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))

    lo, hi = clopper_pearson(k, n)
    assert lo == 0.0 if k == 0 else at_least(lo) == pytest.approx(0.025, abs=1e-9)
    assert hi == 1.0 if k == n else at_most(hi) == pytest.approx(0.025, abs=1e-9)
    if (k, n) == (1, 7):  # the textbook example: 1 of 7 is 0.4% to 58%
        assert (round(lo, 4), round(hi, 4)) == (0.0036, 0.5787)
