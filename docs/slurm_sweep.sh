#!/usr/bin/env bash
# One experiment (or experiments/sweep.py) as a Slurm job array: task K of N trains slice K of the
# runs into the shared --out; the tables are written afterwards by the same command with --collect.
#
#   sbatch docs/slurm_sweep.sh                                  # experiment 2, default tier, 8 shards
#   sbatch --array=0-3 docs/slurm_sweep.sh --configs config/prenorm_ln.py,config/prenorm_rms.py
#   python experiments/exp2_norm_comparison.py --out results/exp2_cluster --collect   # when all are done
#
# Submit from the repository root. --out must be on a filesystem every node sees and that supports
# flock (NFSv4, or Lustre/BeeGFS mounted with flock): shards claim runs through it. A task that dies
# (node failure, time limit) leaves its claims free: --requeue starts it again and it resumes its runs
# from their checkpoints; until then, shards still waiting on its runs retry them themselves.
#SBATCH --job-name=babygpt-sweep
#SBATCH --array=0-7
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=4
#SBATCH --time=02:00:00
#SBATCH --requeue
#SBATCH --output=slurm-%A_%a.out
set -euo pipefail

EXPERIMENT=${EXPERIMENT:-experiments/exp2_norm_comparison.py}
OUT=${OUT:-results/exp2_cluster}
PYTHON=${PYTHON:-python}
: "${SLURM_ARRAY_TASK_ID:?run this with sbatch --array (or set SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT)}"
COUNT=${SLURM_ARRAY_TASK_COUNT:?this Slurm sets no SLURM_ARRAY_TASK_COUNT; set it to the array size}

# Every task runs the same command (so all of them list the same runs) but for its --shard.
exec "$PYTHON" "$EXPERIMENT" --out "$OUT" --shard "$SLURM_ARRAY_TASK_ID/$COUNT" "$@"
