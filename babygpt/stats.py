"""The statistics of comparing configurations (GUIDE §6): t-intervals over seeds, paired
differences, and Wortsman et al.'s LR sensitivity.

Seeds are the unit of replication: a configuration's runs differ only in ``seed`` (its init and
its data order), and two configurations run with the same seeds are *paired*, which removes the
part of the seed-to-seed spread they share.
"""

from __future__ import annotations

import math
import statistics

# Two-sided 95% quantiles of Student's t, t_{0.975, df}, for df = 1 .. 30 (standard table values).
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)
Z_975 = 1.959964


def t_quantile(df: int) -> float:
    """t_{0.975, df}: the table up to 30 degrees of freedom, then the Cornish-Fisher expansion
    z + (z^3 + z) / (4 df) + (5 z^5 + 16 z^3 + 3 z) / (96 df^2), within 0.0002 of the exact value there."""
    if df < 1:
        raise ValueError(f"a t-interval needs at least 2 values (df >= 1), got df={df}")
    if df <= len(T_975):
        return T_975[df - 1]
    z = Z_975
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def mean_ci(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% t-interval); the half-width is nan for a single value."""
    values = list(values)
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t_quantile(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def paired_difference(a: list[float], b: list[float]) -> tuple[float, float]:
    """(mean of a_i - b_i, half-width of its 95% t-interval) for runs paired by seed."""
    if len(a) != len(b):
        raise ValueError(f"paired values must come in pairs, got {len(a)} and {len(b)}")
    return mean_ci([x - y for x, y in zip(a, b)])


def excludes_zero(mean: float, half_width: float) -> bool:
    """True if the interval mean ± half_width lies entirely on one side of zero."""
    return math.isfinite(half_width) and abs(mean) > half_width


def lr_sensitivity(final_losses: dict[float, float], initial_loss: float) -> float:
    """Wortsman et al. 2023 (arXiv:2309.14322): over a grid of learning rates, the mean of
    min(loss(lr), initial loss) minus the best loss on the grid. A run that diverged (non-finite
    loss) counts as the initial loss, so a failure costs as much as not training at all and no
    more. Lower means less sensitive to the choice of learning rate."""
    if not final_losses:
        raise ValueError("LR sensitivity needs at least one learning rate")
    capped = [min(loss, initial_loss) if math.isfinite(loss) else initial_loss for loss in final_losses.values()]
    return statistics.fmean(capped) - min(capped)
