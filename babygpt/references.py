"""``python -m babygpt.references [--data_dir DIR]``: print the data's reference losses.

The losses themselves are computed in babygpt/ngram.py (the add-one unigram, and interpolated
Kneser-Ney n-gram models for n = 2..10, plain and modified) and cached in DIR/floors.json. This module is the command
only: no library module imports it, so it may import babygpt.cli.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from .ngram import COLLAPSE_MARGIN, FLOORS_FILE, label, load_or_measure, parse_key, strongest
from .options import option, parse_into


@dataclass
class ReferenceOptions:
    """python -m babygpt.references's command line."""

    data_dir: str = option("data/shakespeare_char", "prepared data (prepared first if needed)")


def note(key: str, record: dict) -> str:
    """How the loss of ``key`` is made, in a few words: the unigram's rule, or a Kneser-Ney model's
    discounts, order 1 first (one per order for plain KN; D1/D2/D3+ per order for modified KN)."""
    if key == "unigram":
        return f"add-one; a run within {COLLAPSE_MARGIN:g} nats of it is collapsed"
    levels = record.get("discounts", {}).get(key, [])
    if parse_key(key) is None or not levels:
        return "no discounts recorded"
    if len(levels[0]) == 1:
        return "discounts D_1..D_n " + ", ".join(f"{level[0]:.4f}" for level in levels)
    return "discounts D1/D2/D3+ of orders 1..n " + ", ".join("/".join(f"{d:.3f}" for d in level) for level in levels)


def report_lines(record: dict, cached: bool, path: str) -> list[str]:
    """One line per reference loss (with its discounts), then the strongest and where it came from."""
    values = record["floors"]
    lines = [f"{key:8s} {nats:.4f} nats  {label(key):19s} ({note(key, record)})" for key, nats in values.items()]
    best = strongest(values)
    if best:
        lines.append(f"strongest: {label(best[0])}, {best[1]:.4f} nats")
    if cached:
        lines.append(f"read from {path}")
    else:
        lines.append(f"computed in {record['seconds']:.2f} s (saved to {path} if writable)")
    return lines


def main(argv: list[str]) -> int:
    """Print the data's reference losses."""
    from .data import load_dataset

    args = parse_into(ReferenceOptions, argv, "python -m babygpt.references [--data_dir DIR]",
                      "Cross-entropy of the validation split under n-gram models of the train split: the "
                      "add-one unigram, and interpolated Kneser-Ney for n = 2..10, plain (one discount per "
                      "order) and modified (three per order, Chen & Goodman 1998), with discounts chosen on a "
                      "held-out tenth of train.")
    train, val, tok = load_dataset(args.data_dir)
    record, cached = load_or_measure(args.data_dir, train, val, tok.vocab_size)
    print("\n".join(report_lines(record, cached, os.path.join(args.data_dir, FLOORS_FILE))))
    return 0


if __name__ == "__main__":
    from .cli import run

    sys.exit(run(main, sys.argv[1:]))
