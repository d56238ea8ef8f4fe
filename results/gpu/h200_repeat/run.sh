#!/bin/bash
# Run on the device machine from the repository root, with data/shakespeare_char carried:
# `bash results/gpu/h200_repeat/run.sh`. Does a GPU repeat its own runs bit for bit? Three copies of
# the beyond tier's seed-0 baseline at lr 3e-3 (first trained on an H200 at 1.5200094062335363, again
# on an H100 at 1.5184448719567591) train at once on one H200, two CPU threads each as in the sweep;
# beside them, the CUDA tests of today's code. Writes machine.txt, repeat_K.json, repeat_K.log, cuda_tests.log.
set -u
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch,sys;print('torch',torch.__version__,'python',sys.version.split()[0])"
  lscpu | grep 'Model name'; nproc; git log -1 --format='commit %H' 2>/dev/null; } > $OUT/machine.txt 2>&1
for k in 1 2 3; do
  (OMP_NUM_THREADS=2 python3 train.py config/prenorm_rms.py --block_size=128 --max_iters=4800 \
     --data_dir=data/shakespeare_char --learning_rate=0.003 --min_lr=0.0003 --seed=0 \
     --out_dir=/tmp/repeat_$k > $OUT/repeat_$k.log 2>&1
   cp /tmp/repeat_$k/summary.json $OUT/repeat_$k.json) &
done
(python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > $OUT/cuda_tests.log 2>&1; echo "pytest rc=$?" >> $OUT/cuda_tests.log) &
wait
