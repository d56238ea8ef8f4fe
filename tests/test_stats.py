"""t-intervals, paired differences and LR sensitivity (babygpt/stats.py)."""

import math
import statistics

import pytest

from babygpt.stats import (T_975, excludes_zero, lr_sensitivity, mean_ci, paired_difference, t_quantile)


def test_t_quantile_table_and_expansion_agree_where_they_meet():
    assert t_quantile(1) == 12.706 and t_quantile(2) == 4.303 and t_quantile(30) == T_975[-1]
    assert t_quantile(31) == pytest.approx(2.0395, abs=2e-4)  # exact t_{0.975,31} = 2.0395
    assert t_quantile(120) == pytest.approx(1.9799, abs=2e-4)
    assert all(a > b for a, b in zip(T_975, T_975[1:]))
    with pytest.raises(ValueError):
        t_quantile(0)


def test_mean_ci_is_the_t_interval():
    values = [2.10, 2.14, 2.12]
    mean, half = mean_ci(values)
    assert mean == pytest.approx(2.12)
    assert half == pytest.approx(4.303 * statistics.stdev(values) / math.sqrt(3))
    assert math.isnan(mean_ci([1.0])[1])


def test_pairing_removes_the_shared_seed_effect():
    seed_effect = [0.05, -0.04, 0.01, 0.08]  # what each seed does to both configurations
    a = [2.0 + s for s in seed_effect]
    b = [2.1 + s + d for s, d in zip(seed_effect, [0.001, -0.001, 0.002, 0.0])]
    unpaired = mean_ci(a)[1] + mean_ci(b)[1]
    diff, half = paired_difference(a, b)
    assert diff == pytest.approx(-0.1005) and half < unpaired / 10
    assert excludes_zero(diff, half) and not excludes_zero(0.01, 0.02) and not excludes_zero(0.5, math.nan)
    with pytest.raises(ValueError):
        paired_difference([1.0], [1.0, 2.0])


def test_lr_sensitivity_caps_failures_at_the_initial_loss():
    init = 4.2
    flat = {1e-3: 2.0, 3e-3: 2.0, 1e-2: 2.0}
    assert lr_sensitivity(flat, init) == 0.0
    # One LR diverged (nan) and one ended above the initial loss: both count as the initial loss.
    curve = {1e-3: 2.2, 3e-3: 2.0, 1e-2: math.nan, 3e-2: 5.0, 1e-1: 2.6}
    assert lr_sensitivity(curve, init) == pytest.approx((0.2 + 0.0 + 2.2 + 2.2 + 0.6) / 5)


def test_tuning_picks_the_lowest_loss_among_runs_that_did_not_diverge():
    from babygpt.compare import best_lr, run_loss

    by_lr = {1e-3: {"status": "finished", "val_loss_full": 2.3}, 3e-3: {"status": "collapsed", "val_loss_full": 3.3},
             1e-2: {"status": "diverged", "val_loss_full": None}, 3e-2: {"status": "diverged", "val_loss_full": 1.0}}
    assert best_lr(by_lr) == 1e-3 and math.isinf(run_loss(by_lr[3e-2])) and run_loss(by_lr[3e-3]) == 3.3
    assert best_lr({1e-2: by_lr[1e-2]}) is None


def test_paired_verdicts_need_an_interval_that_excludes_zero():
    from babygpt.compare import mean_interval, outcome_counts, paired_against, verdict

    assert [verdict(m, 0.02) for m in (-0.05, 0.05, 0.01)] == ["better", "worse", "no difference measured"]
    assert verdict(-0.05, math.nan) == "no difference measured"
    base, var = [2.10, 2.20, 2.15], [2.00, 2.12, 2.04]
    mean, half = paired_difference(var, base)
    assert paired_against(var, base) == (f"{mean:+.3f} ± {half:.3f}", "better")
    # A seed that diverged in either configuration has no pair; one pair is not enough for an interval.
    assert paired_against([2.0, math.inf, 2.1], [2.1, 2.2, math.inf]) == ("—", "fewer than 2 pairs")
    # Two pairs give an interval but no verdict, even one that excludes zero (>= 3 seeds for a verdict).
    var2, base2 = [2.000, 2.101], [2.100, 2.200]
    mean, half = paired_difference(var2, base2)
    assert excludes_zero(mean, half)
    assert paired_against(var2, base2) == (f"{mean:+.3f} ± {half:.3f}", "no difference measured (2 pairs)")
    assert mean_interval([2.0, math.inf]) == "2.000" and mean_interval([math.inf]) == "—"
    assert mean_interval([2.0, 2.2]) == f"2.100 ± {mean_ci([2.0, 2.2])[1]:.3f}"
    rows = [{"status": s} for s in ("finished", "collapsed", "finished", "diverged")]
    assert outcome_counts(rows) == "2 finished, 1 collapsed, 1 diverged" and outcome_counts([]) == "—"
