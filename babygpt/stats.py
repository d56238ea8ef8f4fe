"""The statistics of comparing configurations (docs/experiments.md): t-intervals over seeds, paired
differences and their tests (Holm's correction, TOST), how many pairs would decide a comparison,
Wortsman et al.'s LR sensitivity, and Kendall's tau between two rankings.

Seeds are the unit of replication: a configuration's runs differ only in ``seed`` (its init and
its data order), and two configurations run with the same seeds are *paired*, which removes the
part of the seed-to-seed spread they share.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from dataclasses import dataclass

def mean_ci(values: list[float]) -> tuple[float, float]:
    """(mean, half-width of its 95% t-interval); the half-width is nan for a single value. The
    quantile t_{0.975, n-1} is the exact one (t_ppf), not a rounded table value: a table cell shows
    three decimals, and a quantile rounded to three decimals moves its last digit."""
    values = list(values)
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, t_ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))


def lr_sensitivity(final_losses: dict[float, float], initial_loss: float) -> float:
    """Wortsman et al. 2023 (arXiv:2309.14322): over a grid of learning rates, the mean of
    min(loss(lr), initial loss) minus the best loss on the grid. A run that diverged (non-finite
    loss) counts as the initial loss, so a failure costs as much as not training at all and no
    more. Lower means less sensitive to the choice of learning rate."""
    if not final_losses:
        raise ValueError("LR sensitivity needs at least one learning rate")
    capped = [min(loss, initial_loss) if math.isfinite(loss) else initial_loss for loss in final_losses.values()]
    return statistics.fmean(capped) - min(capped)


# ---------------------------------------------------------------- tests of a difference, and of equivalence

def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz
    evaluation), using the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where the fraction converges slowly."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        # the two coefficients of the fraction's m-th step (even term, then odd term)
        for coeff in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                      -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + coeff * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + coeff / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return math.exp(log_front) * fraction / a


def beta_ppf(q: float, a: float, b: float) -> float:
    """The q-quantile of the Beta(a, b) distribution: the x with I_x(a, b) = q, by bisection (to 1e-12)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _incomplete_beta(a, b, mid) < q else (lo, mid)
    return (lo + hi) / 2


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper & Pearson 1934, Biometrika 26:404) two-sided interval for a rate seen k times
    in n trials: the p whose binomial tails at k are each (1 - confidence) / 2, from the Beta quantiles
    Beta((1-c)/2; k, n-k+1) and Beta((1+c)/2; k+1, n-k); 0 and 1 at the ends. It never covers less than
    ``confidence`` (it is conservative), which at a handful of runs is the honest side to err on."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"a rate needs 0 <= k <= n and n >= 1, got k={k}, n={n}")
    tail = (1 - confidence) / 2
    lo = 0.0 if k == 0 else beta_ppf(tail, k, n - k + 1)
    hi = 1.0 if k == n else beta_ppf(1 - tail, k + 1, n - k)
    return lo, hi


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom: the tail is I_{df/(df+t^2)}(df/2, 1/2) / 2."""
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


@functools.lru_cache(maxsize=4096)
def t_ppf(p: float, df: float) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on t_cdf (to 1e-10 relative); cached,
    since a table asks for the same few quantiles many times (leave-one-out, pairs to decide)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"a quantile needs 0 < p < 1, got {p}")
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, hi * 2
    while hi - lo > 1e-10 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison's figures: the mean difference, its standard error and degrees of freedom,
    with the two-sided p-value of "no difference" and the TOST p-value of "a difference of at least
    ``margin``"."""

    mean: float
    se: float
    df: int
    margin: float

    @classmethod
    def of(cls, differences: list[float], margin: float) -> "PairedTest":
        if len(differences) < 2:
            raise ValueError(f"a paired test needs at least 2 pairs, got {len(differences)}")
        n = len(differences)
        return cls(statistics.fmean(differences), statistics.stdev(differences) / math.sqrt(n), n - 1, margin)

    def _t(self, shift: float) -> float:
        """(mean - shift) / se, with a zero standard error read as an infinitely sharp estimate."""
        if self.se > 0:
            return (self.mean - shift) / self.se
        return math.copysign(math.inf, self.mean - shift) if self.mean != shift else 0.0

    def p_difference(self) -> float:
        """Two-sided p of the null hypothesis "mean difference = 0"."""
        return 2 * (1 - t_cdf(abs(self._t(0.0)), self.df))

    def p_equivalence(self) -> float:
        """Schuirmann's two one-sided tests (1987): the larger of p(difference <= -margin) and
        p(difference >= +margin); small means the difference lies inside (-margin, +margin)."""
        return max(1 - t_cdf(self._t(-self.margin), self.df), t_cdf(self._t(self.margin), self.df))

    def half_width(self, confidence: float) -> float:
        """Half-width of the two-sided t-interval at ``confidence`` (e.g. 0.95)."""
        return t_ppf(1 - (1 - confidence) / 2, self.df) * self.se


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni (Holm 1979) adjusted p-values, in the order given: sort ascending, multiply
    the i-th smallest (from 0) by k - i, and carry the running maximum so that the adjustment keeps
    the order. Rejecting where the adjusted p <= alpha controls the family-wise error at alpha."""
    k = len(p_values)
    order = sorted(range(k), key=lambda i: p_values[i])
    adjusted, running = [0.0] * k, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (k - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def holm_levels(p_values: list[float], alpha: float = 0.05) -> list[float]:
    """The confidence of the interval that matches each hypothesis' Holm step (Holm 1979), so that
    an interval excludes zero exactly where Holm rejects. Over the p-values sorted ascending, step
    ``rank`` (from 0) tests at alpha / (k - rank) while every earlier step rejected: those get
    1 - alpha / (k - rank). Holm stops at its first non-rejection; the hypotheses after it are never
    tested at a step of their own, so they, and the one it stopped at, get the stopping step's
    1 - alpha / (k - stop). Their p-values are at least the one Holm stopped at, which exceeds that
    step's alpha, so their intervals hold zero, beside the "inconclusive" they are given."""
    k = len(p_values)
    order = sorted(range(k), key=lambda i: p_values[i])
    levels, stop = [0.0] * k, None
    for rank, i in enumerate(order):
        if stop is None and p_values[i] > alpha / (k - rank):
            stop = rank
        levels[i] = 1 - alpha / (k - (rank if stop is None else stop))
    return levels


# ---------------------------------------------------------------- how many pairs would decide

POWER = 0.8  # the chance of deciding that "pairs to decide" is sized for
MAX_PAIRS = 10_000  # beyond this many pairs the count is not worth giving ("> 10,000")


def pairs_for_equivalence(sd: float, margin: float, alpha: float, power: float = POWER) -> int | None:
    """The smallest n of seed pairs whose TOST (each one-sided test at ``alpha``) shows equivalence
    within +-``margin`` with probability ``power`` when the true difference is 0 and the paired
    differences have standard deviation ``sd`` (Chow, Shao & Wang 2008, Sample Size Calculations in
    Clinical Research, sec. 3.2). TOST passes when |mean| + t_{1-alpha, n-1} s / sqrt(n) < margin;
    with the mean ~ N(0, sd^2 / n) that has probability 2 Phi(sqrt(n) margin / sd - t_{1-alpha}) - 1,
    at least ``power`` when
        sqrt(n) margin / sd >= t_{1-alpha, n-1} + t_{1-(1-power)/2, n-1},
    the second quantile a t's in place of the normal's for the estimated sd. None beyond MAX_PAIRS."""
    return smallest_pairs(margin / sd if sd > 0 else math.inf, 1 - alpha, 1 - (1 - power) / 2)


def pairs_for_difference(sd: float, difference: float, alpha: float, power: float = POWER) -> int | None:
    """The smallest n of seed pairs whose two-sided paired t-test at ``alpha`` rejects "no difference"
    with probability ``power`` when the true difference is ``difference`` and the paired differences
    have standard deviation ``sd`` (Chow, Shao & Wang 2008, sec. 3.1):
        sqrt(n) |difference| / sd >= t_{1-alpha/2, n-1} + t_{power, n-1}.
    None beyond MAX_PAIRS (a difference of 0 is never shown)."""
    return smallest_pairs(abs(difference) / sd if sd > 0 else math.inf, 1 - alpha / 2, power)


def smallest_pairs(effect: float, test_quantile: float, power_quantile: float) -> int | None:
    """The smallest n >= 2 with sqrt(n) effect >= t_{test_quantile, n-1} + t_{power_quantile, n-1}
    (effect: the difference to resolve over the paired sd). t quantiles exceed the normal's, so the
    normal's n, ((z_test + z_power) / effect)^2, is a lower bound the search starts from."""
    if effect == 0:
        return None
    z = statistics.NormalDist().inv_cdf
    n = max(2, math.ceil(((z(test_quantile) + z(power_quantile)) / effect) ** 2))
    while n <= MAX_PAIRS and math.sqrt(n) * effect < t_ppf(test_quantile, n - 1) + t_ppf(power_quantile, n - 1):
        n += 1
    return n if n <= MAX_PAIRS else None


# ---------------------------------------------------------------- agreement between two rankings

def kendall_tau(xs: list[float], ys: list[float]) -> float:
    """Kendall's tau-b between two scorings of the same items: (concordant - discordant pairs) over
    sqrt((pairs - ties in x) (pairs - ties in y)); 1 is the same order, -1 the reverse. Ties count
    as neither (tau-b), so two configurations tied in one tier neither agree nor disagree."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError(f"Kendall's tau needs two scorings of the same >= 2 items, got {len(xs)} and {len(ys)}")
    concordant = discordant = tied_x = tied_y = 0
    for i in range(len(xs)):
        for j in range(i + 1, len(xs)):
            dx, dy = xs[i] - xs[j], ys[i] - ys[j]
            tied_x += dx == 0
            tied_y += dy == 0
            s = dx * dy
            concordant += s > 0
            discordant += s < 0
    pairs = len(xs) * (len(xs) - 1) // 2
    denominator = math.sqrt((pairs - tied_x) * (pairs - tied_y))
    return (concordant - discordant) / denominator if denominator else math.nan


def kendall_p(xs: list[float], ys: list[float]) -> float:
    """Two-sided exact permutation p-value of Kendall's tau: the share of the n! orders of ``ys``
    whose |tau| is at least the observed one. Exact, so for the few configurations a table holds
    (n <= 9: at most 362,880 orders); refused beyond that."""
    if len(xs) > 9:
        raise ValueError(f"the exact permutation test enumerates n! orders; n = {len(xs)} is too many (n <= 9)")
    observed = abs(kendall_tau(xs, ys))
    if math.isnan(observed):
        return math.nan
    orders = list(itertools.permutations(ys))
    # a small tolerance, so that an order with the same |tau| up to rounding counts as reaching it
    return sum(abs(kendall_tau(xs, list(o))) >= observed - 1e-12 for o in orders) / len(orders)


def kendall_ceiling(n: int, alpha: float = 0.05) -> float | None:
    """The smallest |tau| that the exact two-sided test of no association can call significant at
    ``alpha`` for n untied items; None when no order of n items can (n <= 4 at 5%: even the exact
    reverse has p = 2 / n!). With n items tau = 1 - 4 I / (n (n - 1)), I the inversions of the order,
    whose count over the n! orders are the Mahonian numbers (built by adding one item at a time, each
    new item adding 0 .. k inversions). A tau below the ceiling is no evidence either way."""
    counts = [1]  # counts[i]: orders of the items so far with i inversions
    for k in range(1, n):
        counts = [sum(counts[i - j] for j in range(k + 1) if 0 <= i - j < len(counts))
                  for i in range(len(counts) + k)]
    total, pairs = math.factorial(n), n * (n - 1) / 2
    taus = [1 - 2 * i / pairs for i in range(len(counts))] if pairs else []
    for tau in sorted({abs(t) for t in taus}):
        p = sum(c for t, c in zip(taus, counts) if abs(t) >= tau - 1e-12) / total
        if p <= alpha:
            return tau
    return None
