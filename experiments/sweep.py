"""Run train.py over a grid of config overrides x seeds; see --help and babygpt/sweep.py.

    python experiments/sweep.py config/prenorm_rms.py --grid norm_type=layernorm,rmsnorm \
        --grid learning_rate=1e-3,3e-3 --seeds 0,1,2 --set max_iters=500 --jobs 1 --out results/my_sweep
"""

import _common

from babygpt.sweep import main

if __name__ == "__main__":
    _common.main(main)
