"""Put finished runs side by side: python compare.py RUN_DIR RUN_DIR... [--plot FILE]  (see --help)."""

import sys

from babygpt.cli import run
from babygpt.compare_runs import main

if __name__ == "__main__":
    sys.exit(run(main, sys.argv[1:]))
