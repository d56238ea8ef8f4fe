"""Reference points for a loss: n-gram models of the data, computed from the data itself.

A character model that has learned nothing but character frequencies scores the unigram
cross-entropy; one that uses the previous character, the bigram; two previous characters, the
trigram. Every loss this project reports is read against these three numbers (GUIDE §6).

Each model is estimated from the train split and scored on the validation split, with add-one
(Laplace) smoothing over the vocabulary so that an n-gram never seen in training keeps a finite
cost:  P(c | h) = (count(h, c) + 1) / (count(h) + V).  All three score the same targets, the
validation tokens from the third on (so that every target has two characters of context).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .options import option, parse_into

ORDERS = {"unigram": 1, "bigram": 2, "trigram": 3}
# A run whose final validation loss is no better than this far below the unigram loss has learned
# (almost) only character frequencies: status "collapsed".
COLLAPSE_MARGIN = 0.1  # nats


def _codes(ids: np.ndarray, order: int, vocab_size: int, start: int) -> np.ndarray:
    """One int64 code per n-gram of ``order`` ids ending at positions start..len-1 (base V digits)."""
    ids = ids.astype(np.int64)
    end = len(ids)
    codes = np.zeros(end - start, dtype=np.int64)
    for j in range(order):  # the n-gram ending at t is ids[t - order + 1 .. t]
        codes = codes * vocab_size + ids[start - order + 1 + j: end - order + 1 + j]
    return codes


def _counts_of(keys: np.ndarray, table: np.ndarray) -> np.ndarray:
    """How often each of ``keys`` occurs in ``table``."""
    unique, counts = np.unique(table, return_counts=True)
    at = np.clip(np.searchsorted(unique, keys), 0, max(len(unique) - 1, 0))
    return np.where(unique[at] == keys, counts[at], 0) if len(unique) else np.zeros(len(keys), dtype=np.int64)


def ngram_cross_entropy(train: np.ndarray, val: np.ndarray, order: int, vocab_size: int) -> float:
    """Mean cross-entropy (nats) of val[2:] under an add-one smoothed n-gram model of ``train``."""
    start = 2  # the same targets for every order up to 3
    if order > 1:
        full = _counts_of(_codes(val, order, vocab_size, start), _codes(train, order, vocab_size, order - 1))
        # count(h) = how often h occurs followed by a character: the (n-1)-grams of train[:-1]
        context = _counts_of(_codes(val[:-1], order - 1, vocab_size, start - 1),
                             _codes(train[:-1], order - 1, vocab_size, order - 2))
    else:
        full = np.bincount(train.astype(np.int64), minlength=vocab_size)[val[start:].astype(np.int64)]
        context = np.full(len(full), len(train))
    return float(-np.mean(np.log((full + 1) / (context + vocab_size))))


def references(train: np.ndarray, val: np.ndarray, vocab_size: int) -> dict:
    """{"unigram": nats, "bigram": nats, "trigram": nats} of the validation split."""
    return {name: round(ngram_cross_entropy(train, val, order, vocab_size), 4) for name, order in ORDERS.items()}


def is_collapsed(val_loss: float | None, refs: dict) -> bool:
    """True if ``val_loss`` is within COLLAPSE_MARGIN of the unigram loss, or above it."""
    return val_loss is not None and math.isfinite(val_loss) and val_loss >= refs["unigram"] - COLLAPSE_MARGIN


@dataclass
class ReferenceOptions:
    """python -m babygpt.references's command line."""

    data_dir: str = option("data/shakespeare_char", "prepared data (prepared first if needed)")


def main(argv: list[str]) -> int:
    """Print the data's reference losses."""
    from .data import load_dataset

    args = parse_into(ReferenceOptions, argv, "python -m babygpt.references [--data_dir DIR]",
                      "Unigram, bigram and trigram cross-entropy of the validation split (add-one smoothed "
                      "counts of the train split).")
    train, val, tok = load_dataset(args.data_dir)
    for name, nats in references(train, val, tok.vocab_size).items():
        print(f"{name:8s} {nats:.4f} nats")
    return 0


if __name__ == "__main__":
    import sys

    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
