#!/bin/bash
# Run on the device machine from the repository root, with data/shakespeare_char carried: `bash results/gpu/h100/slice.sh`
# (it ran as .devrun/slice.sh); it wrote machine.txt, cuda_tests.log and repeat_summary.json
# (committed here as repeat_prenorm_rms_lr0.003_seed0.json) and the runs of results/beyond/exp2_gpt2.
# One device call: machine facts, the CUDA tests, one repeat of an H200 run, and a slice of the
# beyond-n-gram GPT-2 table that drains itself after 400 s.
set -u
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch,sys;print('torch',torch.__version__,'python',sys.version.split()[0])"
  lscpu | grep 'Model name'; nproc; } > $OUT/machine.txt 2>&1
(python3 train.py config/prenorm_rms.py --block_size=128 --max_iters=4800 --data_dir=data/shakespeare_char \
   --learning_rate=0.003 --min_lr=0.0003 --seed=0 --out_dir=/tmp/repeat > $OUT/repeat.log 2>&1
 cp /tmp/repeat/summary.json $OUT/repeat_summary.json) &
(python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > $OUT/cuda_tests.log 2>&1; echo "pytest rc=$?" >> $OUT/cuda_tests.log) &
start=$(date +%s)
timeout -s USR1 -k 130 400 python3 experiments/exp2_norm_comparison.py --beyond \
  --configs config/prenorm_rms.py,config/prenorm_ln.py,config/postnorm_ln.py,config/prenorm_none.py,config/periln_rms.py,config/deepnorm_ln.py,config/prenorm_rms_qknorm_perhead.py \
  --tuned_from results/exp2_norm_comparison,results/exp2_norm_variants,results/exp2_norm_variants_2025 \
  --out results/beyond/exp2_gpt2 --jobs 10 > $OUT/slice.log 2>&1
echo "slice rc=$? after $(( $(date +%s) - start )) s" >> $OUT/slice.log
wait
cd results/beyond/exp2_gpt2 && tar cf $OUT/runs.tar --exclude='*.pt' --exclude=logs --exclude=claims \
  settings.json $(for d in runs/*/; do [ -f $d/summary.json ] && echo $d; done)
ls runs | wc -l >> $OUT/slice.log
