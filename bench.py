"""Benchmark a BabyGPT configuration: python bench.py [CONFIG.py] [--key=value ...] [--json=PATH]."""

import sys

from babygpt.bench import main
from babygpt.cli import run

if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
