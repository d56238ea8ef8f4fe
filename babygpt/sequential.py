"""Group-sequential verdicts: evaluation seed pairs added in rounds, each comparison looked at after
every round and stopped once it is decided, with the error rate of the whole table kept.

Looking at a growing sample again and again and stopping at the first significant look inflates the
error rate (five looks at a nominal 5% give about 14%: Armitage, McPherson & Rowe 1969). An
alpha-spending function fixes how much of the error rate each look may use (Lan & DeMets 1983,
Biometrika 70:659); its O'Brien-Fleming form (O'Brien & Fleming 1979, Biometrics 35:549) spends
almost nothing early, so that the last look's level is close to the fixed-sample one:

    alpha(t) = 2 * (2 - 2 * Phi(z_{1 - alpha/4} / sqrt(t))),   t = pairs so far / the cap (information fraction),

alpha / 2 on each side of a two-sided test

``boundaries`` turns the spending into one critical |z| per look by integrating the sum of the paired
differences over the looks, conditioned on no earlier stop (the recursive numerical integration of
Armitage, McPherson & Rowe; Jennison & Turnbull 2000, "Group Sequential Methods", ch. 19). A look
with n pairs then uses the nominal two-sided level p_k = 2 (1 - Phi(c_k)) for its paired t-test (the
usual small-sample use of z-scale boundaries; Jennison & Turnbull ch. 3.8). Over a table, Holm (1979)
is made sequential (``sequential_verdicts``); equivalence within +-m is TOST at look k's level (a
1 - 2 p_k interval inside +-m). The error rates this keeps are checked by simulation in
tests/test_sequential.py.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from .stats import t_cdf

GRID_POINTS = 801  # points over one look's continuation region (the sum's density is smooth there)


def normal_cdf(x: float) -> float:
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def normal_ppf(p: float) -> float:
    """The standard normal quantile, by bisection on normal_cdf (to 1e-12)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if normal_cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def obrien_fleming_spent(t: float, alpha: float) -> float:
    """The two-sided error rate spent by information fraction ``t`` in (0, 1]: alpha / 2 on each side,
    each by Lan & DeMets' O'Brien-Fleming form 2 - 2 Phi(z_{1 - a/2} / sqrt(t)) at one-sided a = alpha / 2
    (as gsDesign's sfLDOF and ldbounds spend a symmetric two-sided test)."""
    return 2 * (2 - 2 * normal_cdf(normal_ppf(1 - alpha / 4) / math.sqrt(t)))


def boundaries(looks: list[int], alpha: float = 0.05) -> list[float]:
    """The critical |z| of each look, for two-sided tests after ``looks`` pairs (increasing; the last
    is the cap), spending ``alpha`` by the O'Brien-Fleming form: under no difference, the chance that
    some look's |z| reaches its boundary is ``alpha``."""
    return list(_boundaries(tuple(looks), alpha))


@functools.lru_cache(maxsize=None)
def _boundaries(looks: tuple[int, ...], alpha: float) -> tuple[float, ...]:
    """boundaries, computed once per (looks, alpha). The sum of the differences so far is carried
    from look to look as a sub-density on its continuation region (trapezoid weights); a look's two
    tails are integrated in closed form over the increment, so each boundary is found to 1e-10."""
    if not looks or looks[0] < 1 or any(b <= a for a, b in zip(looks, looks[1:])):
        raise ValueError(f"looks must be increasing pair counts >= 1, got {list(looks)}")
    spent = [obrien_fleming_spent(n / looks[-1], alpha) for n in looks]
    bounds: list[float] = []
    grid = weights = None  # the continuation region's grid of sums, and density x trapezoid width there
    previous = 0
    for k, n in enumerate(looks):
        target = spent[k] - (spent[k - 1] if k else 0.0)
        spread = math.sqrt(n - previous)

        def tails(bound: float) -> float:  # P(no earlier stop, |S_n| >= bound sqrt(n))
            if grid is None:
                return 2 * (1 - normal_cdf(bound))
            edge = bound * math.sqrt(n)
            outside = _ndtr((-edge - grid) / spread) + 1 - _ndtr((edge - grid) / spread)
            return float(torch.sum(weights * outside))

        bound = _solve(tails, target)
        bounds.append(bound)
        new_grid = torch.linspace(-bound * math.sqrt(n), bound * math.sqrt(n), GRID_POINTS, dtype=torch.float64)
        if grid is None:
            density = _phi(new_grid / math.sqrt(n)) / math.sqrt(n)
        else:
            density = (_phi((new_grid[:, None] - grid[None, :]) / spread) / spread) @ weights
        step = float(new_grid[1] - new_grid[0])
        trapezoid = torch.full_like(new_grid, step)
        trapezoid[0] = trapezoid[-1] = step / 2
        grid, weights, previous = new_grid, density * trapezoid, n
    return tuple(bounds)


def _phi(x: torch.Tensor) -> torch.Tensor:
    return torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _ndtr(x: torch.Tensor) -> torch.Tensor:
    return torch.special.ndtr(x)


def _solve(tails, target: float) -> float:
    """The |z| at which the decreasing ``tails`` holds ``target`` (inf if nothing is to be spent)."""
    if target <= 0:
        return math.inf
    lo, hi = 0.0, 40.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tails(mid) > target else (lo, mid)
    return (lo + hi) / 2


def nominal_levels(looks: list[int], alpha: float = 0.05) -> list[float]:
    """The two-sided level each look tests at: 2 (1 - Phi(c_k))."""
    return [2 * (1 - normal_cdf(c)) for c in boundaries(looks, alpha)]


@dataclass
class Look:
    """One comparison after one look: its verdict so far ("better", "worse", "equivalent" or None
    while undecided), and what it was decided on."""

    verdict: str | None
    pairs: int
    mean: float
    p_difference: float  # two-sided paired t-test of no difference
    p_equivalence: float  # TOST: the larger of the two one-sided p-values against +-margin

    def cell(self) -> str:
        """The look as a report's table shows it: "+0.002 (p 0.61, TOST p 0.21): open"."""
        return (f"{self.mean:+.3f} (p {self.p_difference:.2g}, TOST p {self.p_equivalence:.2g}): "
                f"{self.verdict or 'open'}")


def paired_tests(diffs: list[float], margin: float) -> tuple[float, float, float]:
    """(mean, two-sided p of no difference, TOST p of |difference| >= margin) of paired differences
    (configuration minus baseline; negative = lower loss = better)."""
    n = len(diffs)
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    se = sd / math.sqrt(n)
    if se == 0:
        return mean, (0.0 if mean else 1.0), (0.0 if abs(mean) < margin else 1.0)
    p_diff = 2 * (1 - t_cdf(abs(mean) / se, n - 1))
    p_low = 1 - t_cdf((mean + margin) / se, n - 1)  # H0: difference <= -margin
    p_high = t_cdf((mean - margin) / se, n - 1)  # H0: difference >= +margin
    return mean, p_diff, max(p_low, p_high)


def sequential_verdicts(diffs: dict[str, list[float]], looks: list[int], margin: float,
                        alpha: float = 0.05) -> dict[str, list[Look]]:
    """Each comparison's path over the looks. At look k every comparison still open is tested on its
    first looks[k] paired differences. "better"/"worse" by Holm's step-down made sequential: of the r
    comparisons not yet found different, the one with the smallest p is tested at look k's nominal
    level for alpha / r, the next at alpha / (r - 1), and so on until one is not rejected (each
    hypothesis spends its share of alpha by the O'Brien-Fleming form; a rejection passes its share on,
    as in Holm's procedure: the group-sequential Holm procedure of Maurer & Bretz 2013, Statistics in
    Biopharmaceutical Research 5:311, reviewed by Tamhane et al. 2021, Statistics in Medicine
    40:5333; its family-wise rate here is checked by simulation in tests/test_sequential.py). "equivalent" by TOST at look k's nominal
    level for alpha. A decided comparison stops: its later looks repeat its verdict and add no pairs;
    one found equivalent stays in Holm's count r (which only makes the others' tests stricter).
    Only the pairs a comparison reaches are read; the paths end before the first look for which some
    comparison still open has fewer pairs than the look asks (a campaign between rounds: the paths
    so far, and which comparisons the next round trains)."""
    paths: dict[str, list[Look]] = {name: [] for name in diffs}
    for k, n in enumerate(looks):
        open_names = [name for name in diffs if not paths[name] or paths[name][-1].verdict is None]
        if any(len(diffs[name]) < n for name in open_names):
            break
        tested = {name: paired_tests(diffs[name][:n], margin) for name in open_names}
        found_different = {name for name in diffs if paths[name] and paths[name][-1].verdict in ("better", "worse")}
        remaining = len(diffs) - len(found_different)
        rejected = set()
        for step, name in enumerate(sorted(open_names, key=lambda name: tested[name][1])):
            if tested[name][1] > nominal_levels(looks, alpha / (remaining - step))[k]:
                break  # Holm stops at its first non-rejection
            rejected.add(name)
        level = nominal_levels(looks, alpha)[k]
        for name in diffs:
            if name not in tested:
                paths[name].append(paths[name][-1])
                continue
            mean, p_diff, p_eq = tested[name]
            verdict = ("better" if mean < 0 else "worse") if name in rejected else \
                "equivalent" if p_eq <= level else None
            paths[name].append(Look(verdict, n, mean, p_diff, p_eq))
    return paths
