"""Floors for a loss: what n-gram models of the data score on its validation split.

Every loss this project reports is read against these numbers.

* The **unigram** loss: character frequencies of the train split with add-one smoothing,
  ``P(c) = (count(c) + 1) / (N + V)``, scored on ``val[2:]``. A run whose loss is no better than
  this has learned nothing but character frequencies: it is *collapsed* (``is_collapsed``). The
  formula and the targets are those this project has always used, so the rule stays the same.

* **Interpolated Kneser-Ney** character n-gram models, n = 2..8 (Kneser & Ney 1995, "Improved
  backing-off for M-gram language modeling"; Chen & Goodman 1999, "An empirical study of smoothing
  techniques for language modeling", section 3: interpolated Kneser-Ney, one discount per order).
  They are what counting alone achieves: a model that does not beat them has learned no more.
  For a context ``h`` of n - 1 characters and ``h'`` = ``h`` less its first character::

      P_n(c | h) = (max(c(h c) - D_n, 0) + D_n N1+(h .) P_{n-1}(c | h')) / c(h .)

  where ``c(.)`` counts occurrences in the train split, ``c(h .) = sum_c c(h c)`` and ``N1+(h .)``
  is the number of distinct characters seen after ``h``. The lower orders k < n have the same form
  with *continuation counts* in place of ``c``: ``N1+(. g c)``, the number of distinct characters
  seen before ``g c`` (a character that follows many contexts is a likely guess in a new one, one
  that follows a single context is not). Order 1 interpolates with the uniform ``1/V``, so every
  character keeps a finite cost. A context never seen (``c(h .) = 0``) backs off fully:
  ``P_n(c | h) = P_{n-1}(c | h')``. As long as every ``D`` is in [0, 1] each ``P_k(. | h)`` sums to 1.

  The discounts are chosen on held-out text taken from the train split, never on val: counts of
  the first 90% of train, the discounts ``D_1..D_n`` of each model that minimise the cross-entropy
  of the last 10%; then the counts of the whole train split, with those discounts, score val. All
  orders score the same validation targets, ``val[7:]``, each with 7 characters of context.

``floors`` computes all of them (a few seconds on TinyShakespeare); ``data_floors`` caches them in
``floors.json`` beside a prepared data directory's ``train.bin`` and ``val.bin``.

Counting is vectorised: an n-gram of ids is one int64 code, its ids read as the base-V digits of a
number, so counting is ``np.unique`` and looking up is ``np.searchsorted``; the context of a code is
``code // V`` and its last k characters are ``code % V**k``. V**8 fits 64 bits for V <= 234; a
larger vocabulary gets the orders that fit (``kn_orders``).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from dataclasses import dataclass

import numpy as np

from .errors import BabyGPTError
from .files import write_atomic

MAX_ORDER = 8
KN_ORDERS = tuple(range(2, MAX_ORDER + 1))
KN_START = MAX_ORDER - 1  # the first validation target scored: every target has 7 characters of context
UNIGRAM_START = 2  # the unigram's targets, val[2:], as ever (see the module docstring)
HELD_OUT_FRACTION = 0.1  # the tail of train the discounts are chosen on
MIN_START = 0.01  # the lowest discount the search starts from (see ney_discount)
# A run whose final validation loss is no better than this far below the unigram loss has learned
# (almost) only character frequencies: status "collapsed".
COLLAPSE_MARGIN = 0.1  # nats

FLOORS_FILE = "floors.json"
# Bump when the numbers floors() computes change, so that old floors.json files are recomputed.
CACHE_FORMAT = "babygpt-floors-v1"


# --- the unigram and the collapsed rule -------------------------------------------------------

def unigram_cross_entropy(train: np.ndarray, val: np.ndarray, vocab_size: int) -> float:
    """Mean -log P(c) over val[2:], with P(c) = (count(c) + 1) / (len(train) + V) (add-one)."""
    counts = np.bincount(np.asarray(train, dtype=np.int64), minlength=vocab_size)
    targets = np.asarray(val[UNIGRAM_START:], dtype=np.int64)
    return float(-np.mean(np.log((counts[targets] + 1) / (len(train) + vocab_size))))


def is_collapsed(val_loss: float | None, refs: dict) -> bool:
    """True if ``val_loss`` is within COLLAPSE_MARGIN of the unigram loss, or above it."""
    return val_loss is not None and math.isfinite(val_loss) and val_loss >= refs["unigram"] - COLLAPSE_MARGIN


# --- names --------------------------------------------------------------------------------------

def kn_key(order: int) -> str:
    """"kn5" for the 5-gram: the key of an order in floors()."""
    return f"kn{order}"


def kn_order(key: str) -> int | None:
    """5 for "kn5"; None for any other key ("unigram", or "bigram" in a summary from before)."""
    return int(key[2:]) if key.startswith("kn") and key[2:].isdigit() else None


def label(key: str) -> str:
    """"KN 5-gram" for "kn5"; any other key is its own label."""
    order = kn_order(key)
    return key if order is None else f"KN {order}-gram"


def strongest(refs: dict) -> tuple[str, float] | None:
    """(key, nats) of the lowest Kneser-Ney loss in ``refs`` (the lower order on a tie), or None if
    ``refs`` has none (a summary written before the Kneser-Ney floors)."""
    keys = sorted((k for k in refs if kn_order(k) is not None), key=kn_order)
    if not keys:
        return None
    key = min(keys, key=refs.__getitem__)  # min keeps the first of equals: the lowest order
    return key, refs[key]


# --- n-gram codes and count tables -------------------------------------------------------------

def fits_int64(vocab_size: int, order: int) -> bool:
    """Whether V**order, the number of codes of that order, is an int64 (so is every code)."""
    return vocab_size ** order < 2 ** 63


def highest_order(vocab_size: int) -> int:
    """The highest order up to MAX_ORDER whose codes fit an int64: 8 for any V up to 234."""
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
    distinct characters follow it. All sorted by code, for np.searchsorted."""

    grams: np.ndarray
    counts: np.ndarray
    contexts: np.ndarray
    totals: np.ndarray
    followers: np.ndarray


def count_table(grams: np.ndarray, counts: np.ndarray, vocab_size: int) -> CountTable:
    """The table of the distinct, sorted ``grams`` with their ``counts``."""
    # Sorted codes have sorted contexts (code // V): each context is one run of neighbours.
    contexts, first, followers = np.unique(grams // vocab_size, return_index=True, return_counts=True)
    totals = np.add.reduceat(counts, first) if len(first) else np.zeros(0, dtype=np.int64)
    return CountTable(grams, counts, contexts, totals, followers)


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


def ney_discount(table: CountTable) -> float:
    """Ney, Essen & Kneser (1994)'s estimate D = n1 / (n1 + 2 n2), from how many n-grams occur
    once (n1) and twice (n2); 0.5 when there are none. The discount search starts here. Kept at
    least MIN_START: with D = 0 an n-gram seen nowhere in a seen context has probability 0."""
    n1, n2 = int(np.sum(table.counts == 1)), int(np.sum(table.counts == 2))
    return max(n1 / (n1 + 2 * n2), MIN_START) if n1 + n2 else 0.5


# --- one Kneser-Ney model, vectorised over the scored targets ----------------------------------

@dataclass
class Level:
    """One order k of a Kneser-Ney model at each scored target, in the terms of

        P_k = share - D cut + (D spread + unseen) P_{k-1}

    which is the docstring's formula with count, total and followers of the target's n-gram and
    context (raw counts at the highest order, continuation counts below) folded in:
    share = count / total, cut = [count > 0] / total (max(count - D, 0) = count - D [count > 0]
    since counts are whole and D <= 1), spread = followers / total, and unseen = 1 where the
    context was never seen (total = 0; then share = cut = spread = 0 and P_k = P_{k-1}).
    None of it depends on the discounts, so the discount search only combines these arrays."""

    share: np.ndarray
    cut: np.ndarray
    spread: np.ndarray
    unseen: np.ndarray

    def mix(self, discount: float, lower: np.ndarray) -> np.ndarray:
        """P_k from P_{k-1} = ``lower``."""
        return self.share - discount * self.cut + (discount * self.spread + self.unseen) * lower


def level_of(count: np.ndarray, total: np.ndarray, followers: np.ndarray) -> Level:
    """The Level of targets whose n-grams have ``count`` and whose contexts ``total`` and ``followers``."""
    seen = total > 0
    inverse = np.divide(1.0, total, out=np.zeros_like(total), where=seen)
    return Level(count * inverse, (count > 0) * inverse, followers * inverse, (~seen).astype(np.float64))


class Counts:
    """The count tables of one text for the models of orders 2..max_order: raw counts for a model's
    highest order, continuation counts for the orders below it."""

    def __init__(self, ids: np.ndarray, max_order: int, vocab_size: int):
        self.vocab_size = vocab_size
        self.raw = {k: raw_table(ids, k, vocab_size) for k in range(2, max_order + 1)}
        self.continuation = {k: continuation_table(self.raw[k + 1], k, vocab_size) for k in range(1, max_order)}

    def table(self, order: int, highest: int) -> CountTable:
        return self.raw[order] if order == highest else self.continuation[order]

    def level(self, codes: np.ndarray, table: CountTable, order: int) -> Level:
        """The Level of ``table`` (of ``order``) at the targets whose n-grams, of ``order`` characters
        or more, are ``codes``."""
        grams = codes % self.vocab_size ** order
        contexts = grams // self.vocab_size  # the empty context is 0, the only one of order 1
        count, = lookup(grams, table.grams, table.counts)
        return level_of(count, *lookup(contexts, table.contexts, table.totals, table.followers))

    def levels(self, codes: np.ndarray, orders: tuple[int, ...]) -> dict[int, list[Level]]:
        """{n: Levels 1..n of the model of order n} at the targets ``codes``; the continuation
        levels are the same in every model, so they are looked up once."""
        below = [self.level(codes, self.continuation[k], k) for k in range(1, max(orders))]
        return {n: below[:n - 1] + [self.level(codes, self.raw[n], n)] for n in orders}

    def ney_discounts(self, highest: int) -> list[float]:
        return [ney_discount(self.table(k, highest)) for k in range(1, highest + 1)]


def probabilities(levels: list[Level], discounts: list[float], vocab_size: int, size: int) -> np.ndarray:
    """P_n(target | context) at each of ``size`` targets: the recursion from 1/V up through ``levels``."""
    p = np.full(size, 1.0 / vocab_size)
    for level, discount in zip(levels, discounts):
        p = level.mix(discount, p)
    return p


def cross_entropy(p: np.ndarray) -> float:
    return float(-np.mean(np.log(p)))


# --- choosing the discounts --------------------------------------------------------------------

def upper_parts(levels: list[Level], discounts: list[float], size: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """[(a_j, b_j)] with P_n = a_j + b_j P_j at each target: each level above j is c + e (the level
    below), c = share - D cut and e = D spread + unseen, so the composition is affine in P_j."""
    parts = []
    a, b = np.zeros(size), np.ones(size)
    for level, discount in reversed(list(zip(levels, discounts))):
        parts.append((a, b))
        a, b = a + b * (level.share - discount * level.cut), b * (discount * level.spread + level.unseen)
    return parts[::-1]


def best_discount(alpha: np.ndarray, beta: np.ndarray, start: float, tolerance: float = 1e-7) -> float:
    """The D in (0, 1] that minimises L(D) = mean(-log(alpha + D beta)).

    L is convex in D (-log of an affine function), so its slope L' = -mean(beta / q), q = alpha +
    D beta, only grows, with L'' = mean((beta / q)**2): Newton steps from ``start``, kept inside a
    bracket [lo, hi] that holds the minimum (a step leaving it is replaced by bisection). D = 0 is
    never tried: an n-gram seen nowhere would get probability 0 there. Where D does not matter
    (beta = 0: at order 1 when every character has been seen, the D taken off the counts is exactly
    what the uniform gives back) ``start`` is kept."""
    if np.max(np.abs(beta)) <= 1e-12 * np.max(np.abs(alpha)):
        return start

    def slope_and_curvature(d: float) -> tuple[float, float]:
        ratio = beta / (alpha + d * beta)
        return -float(np.mean(ratio)), float(np.mean(ratio * ratio))

    if slope_and_curvature(1.0)[0] <= 0:  # still falling at the end of the range
        return 1.0
    lo, hi, d = 0.0, 1.0, min(max(start, MIN_START), 1.0)
    while hi - lo > tolerance:
        slope, curvature = slope_and_curvature(d)
        lo, hi = (lo, d) if slope > 0 else (d, hi)
        step = d - slope / max(curvature, 1e-300)
        previous, d = d, step if lo < step < hi else 0.5 * (lo + hi)
        if abs(d - previous) < tolerance:
            break
    return d


def sweep(levels: list[Level], discounts: list[float], vocab_size: int, size: int) -> list[float]:
    """One round of coordinate descent, D_1 up to D_n: each set to its best value given the others.

    With the others fixed, P_n is affine in D_j: P_j = base + D_j slope (Level's formula), and
    P_n = a_j + b_j P_j, where (a_j, b_j) involve only the discounts above j, which this round has
    not changed yet."""
    discounts = list(discounts)
    above, lower = upper_parts(levels, discounts, size), np.full(size, 1.0 / vocab_size)
    for j, level in enumerate(levels):
        base, slope = level.share + level.unseen * lower, level.spread * lower - level.cut
        a, b = above[j]
        discounts[j] = best_discount(a + b * base, b * slope, discounts[j])
        lower = level.mix(discounts[j], lower)
    return discounts


def choose_discounts(levels: list[Level], start: list[float], vocab_size: int, size: int,
                     rounds: int = 50, tolerance: float = 1e-5) -> list[float]:
    """Coordinate descent from ``start`` (Ney's estimates) until a round moves no discount by more
    than ``tolerance``."""
    discounts = list(start)
    if size == 0:  # no held-out targets to choose on
        return discounts
    for _ in range(rounds):
        discounts, before = sweep(levels, discounts, vocab_size, size), discounts
        if max(abs(x - y) for x, y in zip(discounts, before)) < tolerance:
            break
    return discounts


# --- the floors ----------------------------------------------------------------------------------

def kn_orders(vocab_size: int) -> tuple[int, ...]:
    """The Kneser-Ney orders computed: 2..8, fewer for a vocabulary whose 8-gram codes overflow."""
    return tuple(n for n in KN_ORDERS if n <= highest_order(vocab_size))


def fit_discounts(train: np.ndarray, vocab_size: int, orders: tuple[int, ...]) -> dict[int, list[float]]:
    """{n: [D_1..D_n]} for each order: counts of the first 90% of ``train``, discounts that minimise
    the cross-entropy of the rest. val plays no part."""
    cut = int(len(train) * (1 - HELD_OUT_FRACTION))
    counts = Counts(train[:cut], max(orders), vocab_size)
    codes = gram_codes(train[cut:], max(orders), vocab_size, KN_START)
    levels = counts.levels(codes, orders)
    return {n: choose_discounts(levels[n], counts.ney_discounts(n), vocab_size, len(codes)) for n in orders}


def kn_cross_entropies(train: np.ndarray, val: np.ndarray, vocab_size: int,
                       discounts: dict[int, list[float]]) -> dict[int, float]:
    """{n: mean -log P_n} over val[7:], with counts of the whole of ``train``."""
    counts = Counts(train, max(discounts), vocab_size)
    codes = gram_codes(val, max(discounts), vocab_size, KN_START)
    levels = counts.levels(codes, tuple(discounts))
    return {n: cross_entropy(probabilities(levels[n], d, vocab_size, len(codes))) for n, d in discounts.items()}


def measure(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """{"floors": {"unigram": nats, "kn2": nats, ..., "kn8": nats}, "discounts": {"kn2": [D_1, D_2],
    ...}, "seconds": s}, values rounded to 4 decimals. Without 8 characters of val there is no
    target to score the Kneser-Ney models on: then only the unigram."""
    started = time.perf_counter()
    result = {"unigram": round(unigram_cross_entropy(train, val, vocab_size), 4)}
    discounts = {}
    if len(val) > KN_START and len(train) > 0:
        found = fit_discounts(train, vocab_size, kn_orders(vocab_size))
        scored = kn_cross_entropies(train, val, vocab_size, found)
        result.update({kn_key(n): round(nats, 4) for n, nats in scored.items()})
        discounts = {kn_key(n): [round(float(d), 4) for d in ds] for n, ds in found.items()}
    return {"floors": result, "discounts": discounts, "seconds": round(time.perf_counter() - started, 3)}


def floors(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """{"unigram": nats, "kn2": nats, ..., "kn8": nats} of the validation split (see the module docstring)."""
    return measure(train, val, vocab_size)["floors"]


# --- the cache beside the data ---------------------------------------------------------------

def fingerprint(ids: np.ndarray) -> dict:
    """{"bytes", "sha1"} of a split's ids: for a split read by data.load_dataset, its .bin file's
    size and sha1."""
    data = np.ascontiguousarray(ids).tobytes()
    return {"bytes": len(data), "sha1": hashlib.sha1(data).hexdigest()}


def cache_key(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """What floors.json must match to be used: the format, the vocabulary size and both splits."""
    return {"format": CACHE_FORMAT, "vocab_size": vocab_size,
            "train.bin": fingerprint(train), "val.bin": fingerprint(val)}


def read_cache(path: str, key: dict) -> dict | None:
    """The record in ``path`` if it is whole and made for ``key``; None if missing, stale or damaged."""
    try:
        with open(path, encoding="utf-8") as f:
            record = json.load(f)
        values = record["floors"]
        usable = (record["key"] == key and isinstance(values.get("unigram"), float)
                  and all(isinstance(v, float) and math.isfinite(v) for v in values.values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return record if usable else None


def write_cache(path: str, record: dict) -> None:
    """Write ``record`` atomically; a place that cannot be written (a read-only data directory)
    only means the floors are computed again next time."""
    try:
        write_atomic(path, json.dumps(record, indent=1).encode())
    except (OSError, BabyGPTError):
        pass


def load_or_measure(data_dir: str, train: np.ndarray, val: np.ndarray, vocab_size: int) -> tuple[dict, bool]:
    """(measure()'s record, whether it came from the cache) for the splits of ``data_dir``:
    ``data_dir``/floors.json if it was made from these very splits, else computed and saved there."""
    path, key = os.path.join(data_dir, FLOORS_FILE), cache_key(train, val, vocab_size)
    record = read_cache(path, key)
    if record is not None:
        return record, True
    record = {"key": key, **measure(train, val, vocab_size)}
    write_cache(path, record)
    return record, False


def data_floors(data_dir: str, train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """floors() of ``data_dir``'s splits ``train`` and ``val`` (as data.load_dataset returns them),
    cached in ``data_dir``/floors.json."""
    return load_or_measure(data_dir, train, val, vocab_size)[0]["floors"]
