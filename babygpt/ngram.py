"""Floors for a loss: what n-gram models of the data score on its validation split.

Every loss this project reports is read against these numbers.

* The **unigram** loss: character frequencies of the train split with add-one smoothing,
  ``P(c) = (count(c) + 1) / (N + V)``, scored on ``val[2:]``. A run whose loss is no better than
  this has learned nothing but character frequencies: it is *collapsed* (``is_collapsed``). The
  formula and the targets are those this project has always used, so the rule stays the same.

* **Interpolated Kneser-Ney** character n-gram models, n = 2..10, in two families (Kneser & Ney
  1995, "Improved backing-off for M-gram language modeling"; Chen & Goodman 1998, "An empirical
  study of smoothing techniques for language modeling", Harvard TR-10-98, sections 2.7 and 3.5).
  They are what counting alone achieves: a model that does not beat them has learned no more.
  For a context ``h`` of n - 1 characters and ``h'`` = ``h`` less its first character::

      P_n(c | h) = (max(c(h c) - D_n(c(h c)), 0) + gamma(h) P_{n-1}(c | h')) / c(h .)
      gamma(h)   = sum_i D_n,i N_i(h .)

  where ``c(.)`` counts occurrences in the train split and ``c(h .) = sum_c c(h c)``. The discount
  depends on the n-gram's count through its *class*, and ``N_i(h .)`` is the number of distinct
  characters seen after ``h`` whose count is in class i, so that ``gamma(h)`` is exactly the mass the
  discounts took off:

  - plain **KN** (keys "kn2".."kn10"): one class, one discount ``D_n`` per order; ``gamma(h) = D_n
    N1+(h .)``, ``N1+`` the number of distinct characters seen after ``h``;
  - **modified KN** (keys "mkn2".."mkn10", Chen & Goodman's section 3.5): three classes, counts 1, 2
    and 3 or more, discounts ``D_n,1``, ``D_n,2``, ``D_n,3+``, so ``gamma(h) = D_n,1 N1(h .) + D_n,2
    N2(h .) + D_n,3+ N3+(h .)``. A rare n-gram is discounted differently from a common one.

  The lower orders k < n have the same form with *continuation counts* in place of ``c``:
  ``N1+(. g c)``, the number of distinct characters seen before ``g c`` (a character that follows
  many contexts is a likely guess in a new one, one that follows a single context is not); their
  count classes are those of the continuation counts. Order 1 interpolates with the uniform
  ``1/V``, so every character keeps a finite cost. A context never seen (``c(h .) = 0``) backs off
  fully: ``P_n(c | h) = P_{n-1}(c | h')``. As long as every discount of class i is in [0, i] (the
  top class: [0, its lowest count]) each ``P_k(. | h)`` sums to 1.

  The discounts are chosen on held-out text taken from the train split, never on val: counts of
  the first 90% of train, the discounts of each model that minimise the cross-entropy of the last
  10%; then the counts of the whole train split, with those discounts, score val. All orders score
  the same validation targets, ``val[9:]`` (the first is ``val[MAX_ORDER - 1]``), each with 9
  characters of context.

``floors`` computes all of them (about ten seconds on TinyShakespeare); ``data_floors`` caches them in
``floors.json`` beside a prepared data directory's ``train.bin`` and ``val.bin``.

**Matched scoring.** A transformer scores a split in windows of block_size characters, so a target
early in a window sees only a few characters before it; an n-gram model given its full context
everywhere is then scored on easier terms. ``scored_floors`` scores every model on given targets
with a cap on each target's context: the order-n model scores a target allowed c < n - 1
characters with the (c + 1)-gram model of its family (its own discounts). ``window_contexts`` and
``sliding_contexts`` are the caps of the two ways of evaluating a transformer (consecutive windows,
as trainer.full_split_loss does; overlapping windows scoring only their last ``stride`` targets), and
``scheme_floors`` caches the result for a named scheme ("windows64", "sliding64s32") in the same
``floors.json``.

Counting is vectorised: an n-gram of ids is one int64 code, its ids read as the base-V digits of a
number, so counting is ``np.unique`` and looking up is ``np.searchsorted``; the context of a code is
``code // V`` and its last k characters are ``code % V**k``. V**10 fits 64 bits for V <= 78; a
larger vocabulary gets the orders that fit (``kn_orders``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import time
from dataclasses import dataclass

import numpy as np

from .errors import BabyGPTError
from .files import write_atomic

MAX_ORDER = 10  # the highest order: 65**10 < 2**63 < 65**11, so TinyShakespeare's 10-gram codes are int64s
KN_ORDERS = tuple(range(2, MAX_ORDER + 1))
FIRST_TARGET = MAX_ORDER - 1  # the first validation target of the full-context floors: 9 characters before each
UNIGRAM_START = 2  # the unigram's targets, val[2:], as ever (see the module docstring)
HELD_OUT_FRACTION = 0.1  # the tail of train the discounts are chosen on
MIN_START = 0.01  # the lowest discount the search starts from (see start_discounts)
MAX_CLASSES = 3  # count classes kept per context: followers seen once, twice, three times or more
# A run whose final validation loss is no better than this far below the unigram loss has learned
# (almost) only character frequencies: status "collapsed".
COLLAPSE_MARGIN = 0.1  # nats

FLOORS_FILE = "floors.json"
SCHEMES = "schemes"  # floors.json's list of matched-scoring results (scheme_floors)
# Bump when the numbers floors() computes change, so that old floors.json files are recomputed.
CACHE_FORMAT = "babygpt-floors-v2"


# --- the unigram and the collapsed rule -------------------------------------------------------

def unigram_probabilities(train: np.ndarray, targets: np.ndarray, vocab_size: int) -> np.ndarray:
    """P(c) = (count(c) + 1) / (len(train) + V) of each target (add-one)."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size)
    return (counts[np.asarray(targets, dtype=np.int64)] + 1) / (len(train) + vocab_size)


def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Mean -log P(c) over val[2:] under the add-one unigram (the collapse rule's targets)."""
    return cross_entropy(unigram_probabilities(train, val[UNIGRAM_START:], vocab_size))


def is_collapsed(val_loss: float | None, refs: dict) -> bool:
    """True if ``val_loss`` is within COLLAPSE_MARGIN of the unigram loss, or above it."""
    return val_loss is not None and math.isfinite(val_loss) and val_loss >= refs["unigram"] - COLLAPSE_MARGIN


def cross_entropy(p: np.ndarray) -> float:
    return float(-np.mean(np.log(p)))


# --- the two families and their names ----------------------------------------------------------

@dataclass(frozen=True)
class Family:
    """One kind of interpolated Kneser-Ney model: the prefix of its keys in floors(), its name, and
    its number of count classes m, one discount each: D_1..D_m for the n-grams seen once, twice, ...,
    m times or more. Class i's discount lies in (0, i]: an n-gram of class i keeps at least
    i - D_i >= 0 of its count."""

    prefix: str
    name: str
    classes: int

    def key(self, order: int) -> str:
        return f"{self.prefix}{order}"

    def bounds(self) -> tuple[float, ...]:
        return tuple(float(i) for i in range(1, self.classes + 1))


KN = Family("kn", "KN", 1)  # interpolated Kneser-Ney: one discount per order
MKN = Family("mkn", "modified KN", 3)  # Chen & Goodman's modified Kneser-Ney: D1, D2, D3+ per order
FAMILIES = (KN, MKN)


def kn_key(order: int) -> str:
    """"kn5" for the 5-gram: the key of a plain Kneser-Ney order in floors()."""
    return KN.key(order)


def parse_key(key: str) -> tuple[Family, int] | None:
    """(MKN, 5) for "mkn5", (KN, 5) for "kn5"; None for any other key ("unigram", or "bigram" in a
    summary from before the Kneser-Ney floors)."""
    for family in FAMILIES:
        rest = key[len(family.prefix):]
        if key.startswith(family.prefix) and rest.isdigit():
            return family, int(rest)
    return None


def kn_order(key: str) -> int | None:
    """5 for "kn5" and for "mkn5"; None for a key of no Kneser-Ney model."""
    parsed = parse_key(key)
    return None if parsed is None else parsed[1]


def label(key: str) -> str:
    """"KN 5-gram" for "kn5", "modified KN 5-gram" for "mkn5"; any other key is its own label."""
    parsed = parse_key(key)
    return key if parsed is None else f"{parsed[0].name} {parsed[1]}-gram"


def strongest(refs: dict) -> tuple[str, float] | None:
    """(key, nats) of the lowest Kneser-Ney loss in ``refs``, of either family (on a tie the lower
    order, then plain KN), or None if ``refs`` has none (a summary written before the Kneser-Ney
    floors). label(key) names its method."""
    def rank(key: str) -> tuple[int, int]:
        family, order = parse_key(key)
        return order, FAMILIES.index(family)
    keys = sorted((k for k in refs if parse_key(k) is not None), key=rank)
    if not keys:
        return None
    key = min(keys, key=refs.__getitem__)  # min keeps the first of equals
    return key, refs[key]


# --- n-gram codes and count tables -------------------------------------------------------------

def fits_int64(vocab_size: int, order: int) -> bool:
    """Whether V**order, the number of codes of that order, is an int64 (so is every code)."""
    return vocab_size ** order < 2 ** 63


def highest_order(vocab_size: int) -> int:
    """The highest order up to MAX_ORDER whose codes fit an int64: 10 for any V up to 78."""
    return max(k for k in range(1, MAX_ORDER + 1) if k == 1 or fits_int64(vocab_size, k))


def gram_codes(ids: np.ndarray, order: int, vocab_size: int, start: int) -> np.ndarray:
    """One int64 per n-gram of ``order`` ids ending at positions start..len-1: the ids as base-V
    digits, the first most significant."""
    if not fits_int64(vocab_size, order):
        raise BabyGPTError(f"{order}-gram codes of a {vocab_size}-character vocabulary do not fit 64 bits; "
                           f"use order {highest_order(vocab_size)} or lower")
    if start < order - 1:
        raise ValueError(f"a {order}-gram needs {order - 1} characters before position {start}")
    ids = np.asarray(ids, dtype=np.int64)
    if len(ids) <= start:
        return np.zeros(0, dtype=np.int64)
    codes = np.zeros(len(ids) - start, dtype=np.int64)
    for j in range(order):  # the n-gram ending at t is ids[t - order + 1 .. t]
        codes = codes * vocab_size + ids[start - order + 1 + j: len(ids) - order + 1 + j]
    return codes


@dataclass
class CountTable:
    """Counts of the distinct n-grams of one order (raw, or continuation counts), and for each
    context (an n-gram less its last character) the sum of its n-grams' counts and how many
    distinct characters follow it with a count of 1, 2, and 3 or more (``by_class``, one row each:
    N1(h .), N2(h .), N3+(h .); their sum is N1+(h .)). All sorted by code, for np.searchsorted."""

    grams: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    totals: np.ndarray
    by_class: np.ndarray  # (MAX_CLASSES, contexts)


def run_sums(values: np.ndarray, first: np.ndarray) -> np.ndarray:
    """The sum of ``values`` over each run of neighbours that starts at an index of ``first``."""
    return np.add.reduceat(values, first) if len(first) else np.zeros(0, dtype=np.int64)


def count_table(grams: np.ndarray, counts: np.ndarray, vocab_size: int) -> CountTable:
    """The table of the distinct, sorted ``grams`` with their ``counts``."""
    # Sorted codes have sorted contexts (code // V): each context is one run of neighbours.
    contexts, first = np.unique(grams // vocab_size, return_index=True)
    classes = np.minimum(counts, MAX_CLASSES)
    by_class = np.stack([run_sums((classes == i).astype(np.int64), first) for i in range(1, MAX_CLASSES + 1)])
    return CountTable(grams, counts, contexts, run_sums(counts, first), by_class)


def raw_table(ids: np.ndarray, order: int, vocab_size: int) -> CountTable:
    """c(h c): how often each n-gram of ``order`` occurs in ``ids``."""
    grams, counts = np.unique(gram_codes(ids, order, vocab_size, order - 1), return_counts=True)
    return count_table(grams, counts, vocab_size)


def continuation_table(higher: CountTable, order: int, vocab_size: int) -> CountTable:
    """N1+(. g c): for each n-gram ``g c`` of ``order``, how many distinct characters precede it,
    i.e. how many distinct (order + 1)-grams of ``higher`` end with it (Kneser & Ney 1995)."""
    grams, counts = np.unique(higher.grams % vocab_size ** order, return_counts=True)
    return count_table(grams, counts, vocab_size)


def lookup(keys: np.ndarray, table_keys: np.ndarray, *columns: np.ndarray) -> list[np.ndarray]:
    """For each column, column[i] (as float) where table_keys[i] == key, 0 for a key not in the
    (sorted) table."""
    if not len(table_keys):
        return [np.zeros(len(keys)) for _ in columns]
    at = np.minimum(np.searchsorted(table_keys, keys), len(table_keys) - 1)
    found = table_keys[at] == keys
    return [np.where(found, column[at], 0).astype(np.float64) for column in columns]


def start_discounts(table: CountTable, family: Family) -> list[float]:
    """Where the search for one order's discounts starts, from n_k, the number of n-grams of the
    table seen k times: Chen & Goodman's (1998, section 3.5) estimates

        Y = n1 / (n1 + 2 n2),    D_i = i - (i + 1) Y n_{i+1} / n_i    (i = 1, 2, 3 for 3+)

    For one class D_1 = Y, Ney, Essen & Kneser's (1994) estimate of a single discount. A class that
    no n-gram is in (n_i = 0) starts at Y (0.5 if no n-gram is seen once or twice); every start is
    kept in [MIN_START, i]: with a discount of 0 an n-gram seen nowhere in a seen context would
    have probability 0, and one above i would make a count negative."""
    n = [int(np.sum(table.counts == k)) for k in range(family.classes + 2)]  # n[0] unused
    y = n[1] / (n[1] + 2 * n[2]) if n[1] + n[2] else 0.5
    starts = [i - (i + 1) * y * n[i + 1] / n[i] if n[i] else y for i in range(1, family.classes + 1)]
    return [min(max(d, MIN_START), bound) for d, bound in zip(starts, family.bounds())]


# --- one Kneser-Ney model, vectorised over the scored targets ----------------------------------

@dataclass
class Level:
    """One order k of a Kneser-Ney model at each scored target, in the terms of

        P_k = share - sum_i D_i cut_i + (sum_i D_i spread_i + unseen) P_{k-1}

    (one term per count class i), which is the module docstring's formula with the count and the
    total of the target's n-gram and context (raw counts at the highest order, continuation counts
    below) folded in: share = count / total; cut_i = [count in class i] / total, since
    max(count - D_i, 0) = count - D_i for a count of class i (counts are whole and D_i <= i);
    spread_i = N_i(h .) / total; and unseen = 1 where the context was never seen (total = 0; then
    share = cut = spread = 0 and P_k = P_{k-1}). None of it depends on the discounts, so the
    discount search only combines these arrays."""

    share: np.ndarray
    cuts: list[np.ndarray]
    spreads: list[np.ndarray]
    unseen: np.ndarray

    def parts(self, discounts: list[float]) -> tuple[np.ndarray, np.ndarray]:
        """(kept, weight) with P_k = kept + weight P_{k-1}."""
        kept, weight = self.share, self.unseen
        for discount, cut, spread in zip(discounts, self.cuts, self.spreads):
            kept, weight = kept - discount * cut, weight + discount * spread
        return kept, weight

    def mix(self, discounts: list[float], lower: np.ndarray) -> np.ndarray:
        """P_k from P_{k-1} = ``lower``."""
        kept, weight = self.parts(discounts)
        return kept + weight * lower


@dataclass
class Found:
    """What one count table holds for each scored target: the count of its n-gram, and the total
    and the followers by class (MAX_CLASSES rows) of its context; 0 where the table has none."""

    count: np.ndarray
    total: np.ndarray
    by_class: list[np.ndarray]

    def level(self, family: Family) -> Level:
        """The Level of a model of ``family``: its top class m takes the counts of m or more."""
        m = family.classes
        seen = self.total > 0
        inverse = np.divide(1.0, self.total, out=np.zeros_like(self.total), where=seen)
        count_class = np.minimum(self.count, m)  # 0 for an n-gram never seen
        followers = self.by_class[:m - 1] + [sum(self.by_class[m - 1:])]
        return Level(self.count * inverse, [(count_class == i) * inverse for i in range(1, m + 1)],
                     [f * inverse for f in followers], (~seen).astype(np.float64))


@dataclass
class Lookups:
    """The Found of each level at the scored targets: ``below``, the continuation counts of orders
    1, 2, ... (the same in every model of either family), and ``top``, the raw counts of each
    model's highest order."""

    below: list[Found]
    top: dict[int, Found]

    def levels(self, family: Family, orders: tuple[int, ...]) -> dict[int, list[Level]]:
        """{n: Levels 1..n of the model of order n of ``family``}."""
        below = [found.level(family) for found in self.below]
        return {n: below[:n - 1] + [self.top[n].level(family)] for n in orders}


class Counts:
    """The count tables of one text for the models of orders 2..max_order: raw counts for a model's
    highest order, continuation counts for the orders below it."""

    def __init__(self, ids: np.ndarray, max_order: int, vocab_size: int):
        self.vocab_size = vocab_size
        self.raw = {k: raw_table(ids, k, vocab_size) for k in range(2, max_order + 1)}
        self.continuation = {k: continuation_table(self.raw[k + 1], k, vocab_size) for k in range(1, max_order)}

    def table(self, order: int, highest: int) -> CountTable:
        return self.raw[order] if order == highest else self.continuation[order]

    def find(self, codes: np.ndarray, table: CountTable, order: int) -> Found:
        """The Found of ``table`` (of ``order``) at the targets whose n-grams, of ``order`` characters
        or more, are ``codes``."""
        grams = codes % self.vocab_size ** order
        contexts = grams // self.vocab_size  # the empty context is 0, the only one of order 1
        count, = lookup(grams, table.grams, table.counts)
        total, *by_class = lookup(contexts, table.contexts, table.totals, *table.by_class)
        return Found(count, total, by_class)

    def lookups(self, codes: np.ndarray, orders: tuple[int, ...]) -> Lookups:
        """The Lookups of the models of ``orders`` at the targets ``codes``."""
        return Lookups([self.find(codes, self.continuation[k], k) for k in range(1, max(orders))],
                       {n: self.find(codes, self.raw[n], n) for n in orders})

    def start_discounts(self, highest: int, family: Family) -> list[list[float]]:
        """start_discounts of each level 1..highest of the model of order ``highest``."""
        return [start_discounts(self.table(k, highest), family) for k in range(1, highest + 1)]


def probabilities(levels: list[Level], discounts: list[list[float]], vocab_size: int, size: int) -> np.ndarray:
    """P_n(target | context) at each of ``size`` targets: the recursion from 1/V up through
    ``levels``, ``discounts[k - 1]`` holding level k's discount of each class."""
    p = np.full(size, 1.0 / vocab_size)
    for level, discount in zip(levels, discounts):
        p = level.mix(discount, p)
    return p


# --- choosing the discounts --------------------------------------------------------------------

def upper_parts(levels: list[Level], discounts: list[list[float]], size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(a_j, b_j)] with P_n = a_j + b_j P_j at each target: each level above j is kept + weight
    (the level below) (Level.parts), so the composition is affine in P_j."""
    parts = []
    a, b = np.zeros(size), np.ones(size)
    for level, discount in reversed(list(zip(levels, discounts))):
        parts.append((a, b))
        kept, weight = level.parts(discount)
        a, b = a + b * kept, b * weight
    return parts[::-1]


def best_discount(alpha: np.ndarray, beta: np.ndarray, start: float, upper: float = 1.0,
                  weights: np.ndarray | None = None, tolerance: float = 1e-7) -> float:
    """The D in (0, upper] that minimises L(D) = mean(-log(alpha + D beta)), the mean weighted by
    ``weights`` (which sum to 1) if given.

    L is convex in D (-log of an affine function), so its slope L' = -mean(beta / q), q = alpha +
    D beta, only grows, with L'' = mean((beta / q)**2): Newton steps from ``start``, kept inside a
    bracket [lo, hi] that holds the minimum (a step leaving it is replaced by bisection). D = 0 is
    never tried: an n-gram seen nowhere would get probability 0 there. Where D does not matter
    (beta = 0: at order 1 of plain KN when every character has been seen, the D taken off the
    counts is exactly what the uniform gives back; or a count class no n-gram is in) ``start`` is
    kept."""
    if np.max(np.abs(beta)) <= 1e-12 * np.max(np.abs(alpha)):
        return start

    def mean(x: np.ndarray) -> float:
        return float(np.mean(x) if weights is None else np.sum(weights * x))

    def slope_and_curvature(d: float) -> tuple[float, float]:
        ratio = beta / (alpha + d * beta)
        return -mean(ratio), mean(ratio * ratio)

    if slope_and_curvature(upper)[0] <= 0:  # still falling at the end of the range
        return upper
    lo, hi, d = 0.0, upper, min(max(start, MIN_START), upper)
    while hi - lo > tolerance:
        slope, curvature = slope_and_curvature(d)
        lo, hi = (lo, d) if slope > 0 else (d, hi)
        step = d - slope / max(curvature, 1e-300)
        previous, d = d, step if lo < step < hi else 0.5 * (lo + hi)
        if abs(d - previous) < tolerance:
            break
    return d


def sweep(levels: list[Level], discounts: list[list[float]], bounds: tuple[float, ...], vocab_size: int,
          weights: np.ndarray) -> list[list[float]]:
    """One round of coordinate descent over every (order, class) discount, level 1 up to level n:
    each set to its best value in (0, its class's bound] given the others.

    With the others fixed, P_n is affine in D_j,i, level j's discount of class i: P_j = base +
    D_j,i slope (Level's formula, slope = spread_i P_{j-1} - cut_i), and P_n = a_j + b_j P_j, where
    (a_j, b_j) involve only the discounts above j, which this round has not changed yet. The loss
    is the mean of -log P_n over the held-out targets, ``weights`` each (see fit_discounts)."""
    discounts = [list(d) for d in discounts]
    above, lower = upper_parts(levels, discounts, len(weights)), np.full(len(weights), 1.0 / vocab_size)
    for j, level in enumerate(levels):
        a, b = above[j]
        kept, weight = level.parts(discounts[j])
        for i, bound in enumerate(bounds):
            cut, spread, d = level.cuts[i], level.spreads[i], discounts[j][i]
            slope = spread * lower - cut
            best = best_discount(a + b * (kept + weight * lower - d * slope), b * slope, d, bound, weights)
            kept, weight, discounts[j][i] = kept - (best - d) * cut, weight + (best - d) * spread, best
        lower = kept + weight * lower
    return discounts


def choose_discounts(levels: list[Level], start: list[list[float]], bounds: tuple[float, ...], vocab_size: int,
                     weights: np.ndarray, rounds: int = 50, tolerance: float = 1e-4) -> list[list[float]]:
    """Coordinate descent from ``start`` (start_discounts) until a round moves no discount by more
    than ``tolerance``."""
    discounts = [list(d) for d in start]
    if len(weights) == 0:  # no held-out targets to choose on
        return discounts
    for _ in range(rounds):
        discounts, before = sweep(levels, discounts, bounds, vocab_size, weights), discounts
        if max(abs(x - y) for new, old in zip(discounts, before) for x, y in zip(new, old)) < tolerance:
            break
    return discounts


# --- the models fitted, and scored with a cap on each target's context -------------------------

def kn_orders(vocab_size: int) -> tuple[int, ...]:
    """The Kneser-Ney orders computed: 2..10, fewer for a vocabulary whose 10-gram codes overflow."""
    return tuple(n for n in KN_ORDERS if n <= highest_order(vocab_size))


def fit_discounts(train: np.ndarray, vocab_size: int,
                  orders: tuple[int, ...] | None = None) -> dict[str, list[list[float]]]:
    """{key: [[D_k,i for each class i] for k = 1..n]} of every model of both families, "kn2" up to
    "mkn10" (or of ``orders``): counts of the first 90% of ``train``, discounts that minimise the
    cross-entropy of the rest, each target of it scored with FIRST_TARGET characters of context.
    val plays no part.

    The order-n model gives the same probability to every target whose last n characters are the
    same, so it is fitted on the distinct n-grams of the held-out text, each weighted by how often
    it occurs there: the same loss, on fewer targets (on TinyShakespeare 6% of them at n = 3, 89% at
    n = 10)."""
    orders = orders or kn_orders(vocab_size)
    cut = int(len(train) * (1 - HELD_OUT_FRACTION))
    counts = Counts(train[:cut], max(orders), vocab_size)
    codes = gram_codes(train[cut:], max(orders), vocab_size, FIRST_TARGET)
    fitted = {}
    for n in orders:
        grams, occurrences = np.unique(codes % vocab_size ** n, return_counts=True)
        lookups, weights = counts.lookups(grams, (n,)), occurrences / max(len(codes), 1)
        for family in FAMILIES:
            fitted[family.key(n)] = choose_discounts(lookups.levels(family, (n,))[n], counts.start_discounts(n, family),
                                                     family.bounds(), vocab_size, weights)
    return dict(sorted(fitted.items(), key=lambda item: FAMILIES.index(parse_key(item[0])[0])))


def checked_contexts(contexts: np.ndarray, length: int) -> np.ndarray:
    """``contexts`` as int64, refused unless it has one entry per character of the text and every
    target t >= 1 may use between 1 and t characters (the ones before it in the text)."""
    contexts = np.asarray(contexts, dtype=np.int64)
    if contexts.shape != (length,):
        raise ValueError(f"contexts has shape {contexts.shape}; it needs one entry per character, ({length},)")
    targets = np.arange(1, length)
    if np.any(contexts[1:] < 1) or np.any(contexts[1:] > targets):
        raise ValueError("each target text[t], t >= 1, needs a context of 1 to t characters")
    return contexts


def capped(whole: dict[int, np.ndarray], order: int, caps: np.ndarray) -> np.ndarray:
    """The probabilities of the order-``order`` model with each target's context cut to its cap: a
    target allowed c < order - 1 characters takes the (c + 1)-gram model's probability (``whole``:
    {m: P of the order-m model at every target, with all the context it asks for})."""
    effective = np.minimum(order, caps + 1)
    p = np.array(whole[order])
    for m in np.unique(effective[effective < order]).tolist():
        if m not in whole:
            raise ValueError(f"a target capped at {m - 1} characters needs the {m}-gram model")
        at = effective == m
        p[at] = whole[m][at]
    return p


def model_probabilities(train: np.ndarray, text: np.ndarray, vocab_size: int,
                        discounts: dict[str, list[list[float]]]) -> dict[str, np.ndarray]:
    """{key: P(text[t] | the n - 1 characters before it) for t = 1..len(text) - 1} of each model in
    ``discounts`` (fit_discounts' keys and values), with counts of the whole of ``train``.

    The text is padded in front with zeros so that every target has a code of the highest order:
    where the order-n model's context runs into the padding (t < n - 1) its probability means
    nothing, and the callers never use it."""
    orders = tuple(sorted({parse_key(key)[1] for key in discounts}))
    top = max(orders)
    padded = np.concatenate([np.zeros(top - 1, dtype=np.int64), np.asarray(text, dtype=np.int64)])
    codes = gram_codes(padded, top, vocab_size, top)  # one per target text[1:]
    lookups = Counts(train, top, vocab_size).lookups(codes, orders)
    result = {}
    for family in FAMILIES:
        levels = lookups.levels(family, orders)
        result.update({family.key(n): probabilities(levels[n], discounts[family.key(n)], vocab_size, len(codes))
                       for n in orders if family.key(n) in discounts})
    return result


def target_probabilities(train: np.ndarray, text: np.ndarray, vocab_size: int, contexts: np.ndarray,
                         discounts: dict[str, list[list[float]]]) -> dict[str, np.ndarray]:
    """{key: P(text[t] | at most contexts[t] characters before it) for t = 1..len(text) - 1} of each
    model in ``discounts``: a target allowed c < n - 1 characters is scored by the (c + 1)-gram
    model of the same family, with its own discounts (``capped``), so the padding of
    model_probabilities is never used (c + 1 <= t + 1)."""
    caps = checked_contexts(contexts, len(text))[1:]
    whole = model_probabilities(train, text, vocab_size, discounts)
    result = {}
    for family in FAMILIES:
        mine = {parse_key(key)[1]: p for key, p in whole.items() if parse_key(key)[0] == family}
        result.update({family.key(n): capped(mine, n, caps) for n in mine})
    return result


def cross_entropies(train: np.ndarray, val: np.ndarray, vocab_size: int,
                    discounts: dict[str, list[list[float]]]) -> dict[str, float]:
    """{key: mean -log P} over val[FIRST_TARGET:] of each model in ``discounts``, every target with
    all the context it asks for: the full-context floors."""
    scored = model_probabilities(train, val, vocab_size, discounts)
    return {key: cross_entropy(p[FIRST_TARGET - 1:]) for key, p in scored.items()}


def rounded(discounts: dict[str, list[list[float]]]) -> dict[str, list[list[float]]]:
    return {key: [[round(float(d), 4) for d in level] for level in levels] for key, levels in discounts.items()}


def measure(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """{"floors": {"unigram": nats, "kn2": nats, ..., "kn10": nats, "mkn2": nats, ..., "mkn10":
    nats}, "discounts": {"kn2": [[D_1], [D_2]], ..., "mkn2": [[D_1,1, D_1,2, D_1,3+], ...], ...},
    "seconds": s}, values rounded to 4 decimals. Without FIRST_TARGET + 1 characters of val there
    is no target to score the Kneser-Ney models on: then only the unigram."""
    started = time.perf_counter()
    result = {"unigram": round(unigram_cross_entropy(train, val, vocab_size), 4)}
    discounts = {}
    if len(val) > FIRST_TARGET and len(train) > 0 and kn_orders(vocab_size):
        found = fit_discounts(train, vocab_size)
        scored = cross_entropies(train, val, vocab_size, found)
        result.update({key: round(nats, 4) for key, nats in scored.items()})
        discounts = rounded(found)
    return {"floors": result, "discounts": discounts, "seconds": round(time.perf_counter() - started, 3)}


def floors(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """{"unigram": nats, "kn2": nats, ..., "mkn10": nats} of the validation split (see the module
    docstring)."""
    return measure(train, val, vocab_size)["floors"]


def scored_floors(train: np.ndarray, text: np.ndarray, vocab_size: int, contexts: np.ndarray,
                  discounts: dict[str, list[list[float]]] | None = None) -> dict:
    """{"unigram": nats, "kn2": nats, ..., "mkn10": nats}: the cross-entropy of text[1:] (val, or a
    part of it), each target text[t] scored by the order-n model with min(n - 1, contexts[t])
    characters of context (``target_probabilities``), rounded to 4 decimals. The unigram (add-one)
    scores the same targets. ``discounts``: fit_discounts(train, vocab_size) unless given."""
    if len(text) < 2:
        raise ValueError("a text of fewer than 2 characters has no target to score")
    contexts = checked_contexts(contexts, len(text))
    result = {"unigram": round(cross_entropy(unigram_probabilities(train, text[1:], vocab_size)), 4)}
    if len(train) > 0 and kn_orders(vocab_size):
        discounts = discounts or fit_discounts(train, vocab_size)
        scored = target_probabilities(train, text, vocab_size, contexts, discounts)
        result.update({key: round(cross_entropy(p), 4) for key, p in scored.items()})
    return result


# --- the contexts a transformer's evaluation gives each target ---------------------------------

def window_contexts(length: int, block_size: int) -> np.ndarray:
    """contexts[t] of a text of ``length`` scored as trainer.full_split_loss scores it: consecutive,
    non-overlapping windows of block_size inputs from position 0 (the last one shorter), so target
    t >= 1 is the ((t - 1) mod T)-th target of its window and has (t - 1) mod T + 1 characters
    before it. contexts[0] = 0 (no target)."""
    if block_size < 1:
        raise ValueError(f"block_size must be at least 1, not {block_size}")
    t = np.arange(length, dtype=np.int64)
    contexts = (t - 1) % block_size + 1
    contexts[:1] = 0
    return contexts


def sliding_contexts(length: int, block_size: int, stride: int) -> np.ndarray:
    """contexts[t] of a text of ``length`` scored in windows of T = block_size that start every S =
    ``stride`` characters: the first window scores all its targets (t <= T: t characters before
    it), each later one, starting at s = kS, only its last S targets t = s + T - S + 1 .. s + T
    (t - s characters: T - S + 1 .. T); the last is cut short at the end of the text. Every target
    is scored once, and one after the first window has

        T - S + 1 + ((t - T - 1) mod S)

    characters before it. contexts[0] = 0 (no target)."""
    if not 1 <= stride <= block_size:
        raise ValueError(f"stride must be between 1 and block_size ({block_size}), not {stride}")
    t = np.arange(length, dtype=np.int64)
    return np.where(t <= block_size, t, block_size - stride + 1 + (t - block_size - 1) % stride)


SCHEME_PATTERN = re.compile(r"windows(?P<T>[1-9][0-9]*)|sliding(?P<sT>[1-9][0-9]*)s(?P<S>[1-9][0-9]*)")


def scheme_contexts(scheme: str, length: int) -> np.ndarray:
    """The contexts of a named scheme: "windows64" is window_contexts(length, 64), "sliding64s32"
    sliding_contexts(length, 64, 32)."""
    match = SCHEME_PATTERN.fullmatch(scheme)
    if match is None:
        raise ValueError(f"unknown scoring scheme {scheme!r}: use windows<T> or sliding<T>s<S>, e.g. windows64")
    if match["T"]:
        return window_contexts(length, int(match["T"]))
    return sliding_contexts(length, int(match["sT"]), int(match["S"]))


# --- the cache beside the data ---------------------------------------------------------------

def fingerprint(ids: np.ndarray) -> dict:
    """{"bytes", "sha1"} of a split's ids: for a split read by data.load_dataset, its .bin file's
    size and sha1 (for a part of it, as the uint16 ids load_dataset gives)."""
    data = np.ascontiguousarray(ids).tobytes()
    return {"bytes": len(data), "sha1": hashlib.sha1(data).hexdigest()}


def cache_key(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """What floors.json must match to be used: the format, the vocabulary size and both splits."""
    return {"format": CACHE_FORMAT, "vocab_size": vocab_size,
            "train.bin": fingerprint(train), "val.bin": fingerprint(val)}


def scheme_key(train: np.ndarray, text: np.ndarray, vocab_size: int, scheme: str) -> dict:
    """What a scheme's entry in floors.json must match to be used: the format, the vocabulary size,
    the train split, the text scored and the scheme."""
    return {"format": CACHE_FORMAT, "vocab_size": vocab_size, "train.bin": fingerprint(train),
            "text": fingerprint(text), "scheme": scheme}


def usable(values) -> bool:
    """Whether ``values`` is a whole set of floors: a dict of finite floats with the unigram."""
    return (isinstance(values, dict) and isinstance(values.get("unigram"), float)
            and all(isinstance(v, float) and math.isfinite(v) for v in values.values()))


def read_json(path: str) -> dict:
    """The JSON object in ``path``; {} if it is missing, damaged or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def read_cache(path: str, key: dict) -> dict | None:
    """The record in ``path`` if it is whole and made for ``key``; None if missing, stale or damaged."""
    record = read_json(path)
    return record if record.get("key") == key and usable(record.get("floors")) else None


def kept_schemes(record: dict, train: np.ndarray, vocab_size: int) -> list[dict]:
    """The scheme entries of a floors.json ``record`` still made from this train split, vocabulary
    and format: the others can never be used again, so they are dropped when the file is written."""
    current = {"format": CACHE_FORMAT, "vocab_size": vocab_size, "train.bin": fingerprint(train)}
    entries = record.get(SCHEMES)
    return [entry for entry in entries if isinstance(entry, dict) and isinstance(entry.get("key"), dict)
            and all(entry["key"].get(k) == v for k, v in current.items())] if isinstance(entries, list) else []


def write_cache(path: str, record: dict) -> None:
    """Write ``record`` atomically; a place that cannot be written (a read-only data directory)
    only means the floors are computed again next time."""
    try:
        write_atomic(path, json.dumps(record, indent=1).encode())
    except (OSError, BabyGPTError):
        pass


def load_or_measure(data_dir: str, train: np.ndarray, val: np.ndarray, vocab_size: int) -> tuple[dict, bool]:
    """(measure()'s record, whether it came from the cache) for the splits of ``data_dir``:
    ``data_dir``/floors.json if it was made from these very splits, else computed and saved there
    (with the schemes' entries that are still good)."""
    path, key = os.path.join(data_dir, FLOORS_FILE), cache_key(train, val, vocab_size)
    stored = read_json(path)
    if stored.get("key") == key and usable(stored.get("floors")):
        return stored, True
    record = {"key": key, **measure(train, val, vocab_size), SCHEMES: kept_schemes(stored, train, vocab_size)}
    write_cache(path, record)
    return record, False


def data_floors(data_dir: str, train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """floors() of ``data_dir``'s splits ``train`` and ``val`` (as data.load_dataset returns them),
    cached in ``data_dir``/floors.json."""
    return load_or_measure(data_dir, train, val, vocab_size)[0]["floors"]


def load_or_score(data_dir: str, train: np.ndarray, text: np.ndarray, vocab_size: int,
                  scheme: str) -> tuple[dict, bool]:
    """({"key", "floors", "seconds"}, whether it came from the cache): scored_floors of ``text``
    under ``scheme`` (scheme_contexts), an entry of ``data_dir``/floors.json's list of schemes if
    one was made from this train split and this text, else computed and added there."""
    path, key = os.path.join(data_dir, FLOORS_FILE), scheme_key(train, text, vocab_size, scheme)
    contexts = scheme_contexts(scheme, len(text))  # an unknown scheme is refused before any work
    stored = read_json(path)
    entries = kept_schemes(stored, train, vocab_size)
    for entry in entries:
        if entry["key"] == key and usable(entry.get("floors")):
            return entry, True
    started = time.perf_counter()
    entry = {"key": key, "floors": scored_floors(train, text, vocab_size, contexts),
             "seconds": round(time.perf_counter() - started, 3)}
    write_cache(path, {**stored, SCHEMES: [e for e in entries if e["key"] != key] + [entry]})
    return entry, False


def scheme_floors(data_dir: str, train: np.ndarray, text: np.ndarray, vocab_size: int, scheme: str) -> dict:
    """scored_floors of ``text`` (val, or a part of it) under the named ``scheme`` ("windows64",
    "sliding64s32": the caps a transformer's evaluation gives each target), cached in
    ``data_dir``/floors.json beside the full-context floors."""
    return load_or_score(data_dir, train, text, vocab_size, scheme)[0]["floors"]
