#!/bin/bash
# Run on the device machine from the repository root, with data/shakespeare_char carried:
# `bash results/gpu/h200_repeat/flag.sh`. The follow-up to deterministic.sh, now through train.py's own
# --deterministic=true: the beyond tier's seed-0 baseline at lr 3e-3 twice at once on one GPU, and
# the CUDA tests (with the switch's own test). Writes machine_flag.txt, flag_K.json, flag_K.log,
# cuda_tests_flag.log. (The device copies the working tree, not its git state: machine_flag.txt's
# commit line names the session's starting commit, 74b73fc; the tree held the switch's commit.)
set -u
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch,sys;print('torch',torch.__version__,'python',sys.version.split()[0])"
  lscpu | grep 'Model name'; nproc; git log -1 --format='commit %H' 2>/dev/null; } > $OUT/machine_flag.txt 2>&1
for k in 1 2; do
  (OMP_NUM_THREADS=2 python3 train.py config/prenorm_rms.py --block_size=128 --max_iters=4800 \
     --data_dir=data/shakespeare_char --learning_rate=0.003 --min_lr=0.0003 --seed=0 --deterministic=true \
     --out_dir=/tmp/flag_$k > $OUT/flag_$k.log 2>&1
   cp /tmp/flag_$k/summary.json $OUT/flag_$k.json) &
done
(python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > $OUT/cuda_tests_flag.log 2>&1; echo "pytest rc=$?" >> $OUT/cuda_tests_flag.log) &
wait
