#!/bin/bash
# Run on the device machine from the repository root, data/shakespeare_char carried (its floors.json too):
# `bash results/gpu/time_to_target/run.sh`. How long does config/shakespeare_char_gpu.py (nanoGPT's GPU
# shape, Pre-LN RMSNorm) take to reach nanoGPT's val 1.4697, with and without compile, and under Muon
# (muon_lr 0.01: the value tuned for config/modern_rms.py on the CPU, not tuned for this shape)?
# Each run stops at its first evaluation at or below the target (target_val_loss); then the CUDA tests.
# Writes machine.txt, runs.tar.gz (each run's config.json, metrics.jsonl, summary.json, log), cuda_tests.log.
set -u
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch,sys,inspect;print('torch',torch.__version__,'python',sys.version.split()[0]);print('Muon',inspect.signature(torch.optim.Muon))"
  lscpu | grep 'Model name'; nproc; } > $OUT/machine.txt 2>&1
stage=/tmp/stage
mkdir -p $stage
run() {  # name, time limit in seconds, extra options
  local name=$1 limit=$2; shift 2
  timeout $limit python3 train.py config/shakespeare_char_gpu.py --target_val_loss=1.4697 \
    --out_dir=/tmp/runs/$name "$@" > $stage/$name.log 2>&1
  echo "rc=$?" >> $stage/$name.log
  mkdir -p $stage/$name
  cp /tmp/runs/$name/config.json /tmp/runs/$name/metrics.jsonl /tmp/runs/$name/summary.json $stage/$name/ 2>/dev/null
  tar -czf $OUT/runs.tar.gz -C $stage .
}
# STEPS picks a subset (the H100 repeat ran STEPS="adamw_compile adamw" with limits of 100 and 110 s)
steps=" ${STEPS:-adamw_compile adamw muon_compile tests} "
[[ $steps == *" adamw_compile "* ]] && run adamw_compile ${LIMIT_COMPILE:-140} --compile=true
[[ $steps == *" adamw "* ]] && run adamw ${LIMIT_EAGER:-150}
[[ $steps == *" muon_compile "* ]] && run muon_compile 100 --optimizer=muon --muon_lr=0.01 --compile=true
if [[ $steps == *" tests "* ]]; then
  timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > $OUT/cuda_tests.log 2>&1
  echo "pytest rc=$?" >> $OUT/cuda_tests.log
fi
