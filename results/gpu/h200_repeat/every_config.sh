#!/bin/bash
# Run on the device machine from the repository root, with data/shakespeare_char carried:
# `bash results/gpu/h200_repeat/every_config.sh`. Does every shipped config train under
# --deterministic=true on a GPU (no op without a deterministic kernel)? A tiny 10-iteration run of
# each config, eight at once, plus one with --compile=true. Writes every_config.txt: config, exit code, last line.
set -u
TINY="--device=cuda --max_iters=10 --n_layer=2 --n_head=2 --n_embd=32 --block_size=16 --batch_size=8 --eval_interval=5 --eval_iters=2 --warmup_iters=2 --deterministic=true"
one() {  # $1: config file, $2...: extra flags
  local name=$(basename $1 .py)$( [ $# -gt 1 ] && echo _compiled )
  OMP_NUM_THREADS=2 python3 train.py $1 $TINY "${@:2}" --out_dir=/tmp/every/$name > /tmp/every_$name.log 2>&1
  echo "$name rc=$? $(tail -1 /tmp/every_$name.log | cut -c1-300)"
}
export -f one; export TINY
{ ls config/*.py | xargs -P 8 -I{} bash -c 'one {}'
  one config/prenorm_rms.py --compile=true; } | sort > $OUT/every_config.txt
