#!/bin/bash
# Run on the device machine from the repository root, with data/shakespeare_char carried:
# `bash results/gpu/h200_repeat/deterministic.sh`. The follow-up to run.sh, whose three copies of one
# run ended at three different losses: the same run twice more at once, now under
# torch.use_deterministic_algorithms(True, warn_only=True) (set before train.py starts, no code change),
# so the logs name any op without a deterministic kernel. Writes det_K.json and det_K.log.
set -u
export PYTHONUNBUFFERED=1 CUBLAS_WORKSPACE_CONFIG=:4096:8
for k in 1 2; do
  (OMP_NUM_THREADS=2 python3 -c "
import runpy, sys, torch
torch.use_deterministic_algorithms(True, warn_only=True)
sys.argv = ['train.py', 'config/prenorm_rms.py', '--block_size=128', '--max_iters=4800',
            '--data_dir=data/shakespeare_char', '--learning_rate=0.003', '--min_lr=0.0003',
            '--seed=0', '--out_dir=/tmp/det_$k']
runpy.run_path('train.py', run_name='__main__')
" > $OUT/det_$k.log 2>&1
   cp /tmp/det_$k/summary.json $OUT/det_$k.json) &
done
wait
