#!/bin/bash
# Third GPU slice: the GPT-2 table's 40 evaluation and runner-up runs, drained after 430 s.
set -u
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch,sys;print('torch',torch.__version__,'python',sys.version.split()[0])"
  lscpu | grep 'Model name'; nproc; } > $OUT/machine.txt 2>&1
rm -rf results/beyond/exp2_core   # the CPU pair's partial runs are not this call's business
start=$(date +%s)
timeout -s USR1 -k 135 430 python3 experiments/exp2_norm_comparison.py --beyond \
  --configs config/prenorm_rms.py,config/prenorm_ln.py,config/postnorm_ln.py,config/prenorm_none.py,config/periln_rms.py,config/deepnorm_ln.py,config/prenorm_rms_qknorm_perhead.py \
  --tuned_from results/exp2_norm_comparison,results/exp2_norm_variants,results/exp2_norm_variants_2025 \
  --out results/beyond/exp2_gpt2 --jobs 10 > $OUT/slice.log 2>&1
echo "slice rc=$? after $(( $(date +%s) - start )) s" >> $OUT/slice.log
cd results/beyond/exp2_gpt2 && tar cf $OUT/runs.tar --exclude='*.pt' --exclude=logs --exclude=claims \
  settings.json $(for d in runs/*/; do [ -f $d/summary.json ] && echo $d; done)
ls runs | wc -l >> $OUT/slice.log
