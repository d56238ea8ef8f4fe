"""Prepare TinyShakespeare (or your own text with --input PATH) for training.

    python data/shakespeare_char/prepare.py [--input PATH]

Writes train.bin, val.bin and meta.json next to this file. train.py runs this
step by itself when the files are missing.
"""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

from babygpt.cli import main_prepare  # noqa: E402

if __name__ == "__main__":
    main_prepare(os.path.dirname(os.path.abspath(__file__)))
