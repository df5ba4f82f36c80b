#!/bin/bash
# maxent-grpo: one command for a training run.
#
#   bash training.sh                     # local smoke run (CPU is fine): tiny model, built-in data
#   MAXENT=1 bash training.sh            # the same with MaxEnt-GRPO
#   sbatch training.sh --config recipes/Qwen2.5-1.5B-Instruct/grpo/config_math.yaml
#   sbatch --array=0-3%1 training.sh --config ...   # up to 4 chained attempts (retries)
#   bash training.sh --config R --run-name my-run -- --max_steps 100   # recipe overrides after --
#
# Environment: RECIPE (recipe path), RUN_NAME (outputs/<run>, log names), MAXENT=1 (MaxEnt entry
# point), MAXENT_GRPO_ENV=conda (use environment.yml instead of a venv).
# Account and partition are yours to add at submit time: sbatch -A <account> -p <partition> ...
#
# The #SBATCH lines below only apply under sbatch. The job gets USR1 five minutes (Slurm checks
# every 30 s, so up to ~5.5 min) before its time limit: the trainers save a complete checkpoint
# and the job requeues itself; the next attempt resumes from it with a fresh vLLM server.
#SBATCH --job-name=maxent-grpo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm_%j.out
set -euo pipefail
# Until the launcher takes over (it handles the signal), an early USR1 must not kill the job.
trap '' USR1

# Under sbatch this script runs from a spool copy: the repository is where you submitted from.
ROOT="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
cd "$ROOT"

if [[ "${MAXENT:-0}" == "1" ]]; then
    METHOD=maxent
    RECIPE="${RECIPE:-recipes/smoke/config_maxent.yaml}"
else
    METHOD=grpo
    RECIPE="${RECIPE:-recipes/smoke/config_grpo.yaml}"
fi
# More than one OpenMP thread per process makes CPU training 3-10x slower on small machines.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

BIN="$(bash scripts/setup_env.sh | tail -n 1)"
args=(run --method "$METHOD" --config "$RECIPE")
if [[ -n "${RUN_NAME:-}" ]]; then
    args+=(--run-name "$RUN_NAME")
fi
# exec: the launcher itself receives Slurm's signals (no shell in between to forward them).
exec "$BIN/maxent-grpo" "${args[@]}" "$@"
