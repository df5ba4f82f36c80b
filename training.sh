#!/bin/bash
# maxent-grpo: one command for a training run.
#
#   bash training.sh                     # local smoke run (CPU is fine): tiny model, built-in data
#   MAXENT=1 bash training.sh            # the same with MaxEnt-GRPO
#   sbatch training.sh --config recipes/Qwen2.5-1.5B-Instruct/grpo/config_math.yaml
#   sbatch --array=0-3%1 training.sh --config ...   # up to 4 chained attempts (retries)
#   bash training.sh --config R --run-name my-run -- --max_steps 100   # recipe overrides after --
#
# Environment: RECIPE (recipe path), RUN_NAME (outputs/<run>, log names), MAXENT=1 (--method
# maxent), MAXENT_GRPO_ENV=conda (use environment.yml instead of a venv), MAXENT_GRPO_ENV=current
# (the environment whose maxent-grpo is on PATH, as it is: nothing is installed).
# Account and partition are yours to add at submit time: sbatch -A <account> -p <partition> ...
#
# The #SBATCH lines below only apply under sbatch; options on the sbatch command line win over
# them. The job gets USR1 five minutes (Slurm checks every 30 s, so up to ~5.5 min) before its
# time limit: the trainers save a complete checkpoint and the job requeues itself; the next
# attempt resumes from it with a fresh vLLM server.
#
# Resources: one task per node runs the launcher, which starts vLLM and every trainer, so the
# task gets the node's CPUs and memory. Each trainer gets OMP_NUM_THREADS = CPUs / trainers on
# its node. Many clusters default to 1 CPU and a small memory cap per job: ask explicitly.
#   sbatch --cpus-per-task=64 training.sh ...          # more CPUs (at most the node's)
#   sbatch --gres=gpu:4 --cpus-per-task=16 --mem=128G training.sh ...   # half a node
#   sbatch --exclusive training.sh ...                 # the whole node, nothing shared
# --mem=0 is "all of each node's memory", the right amount when the job holds all 8 GPUs.
#SBATCH --job-name=maxent-grpo
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gres=gpu:8
#SBATCH --cpus-per-task=32
#SBATCH --mem=0
#SBATCH --time=24:00:00
#SBATCH --signal=B:USR1@300
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=logs/slurm_%j.out
#SBATCH --error=logs/slurm_%j.err
set -euo pipefail
# Until the launcher takes over (it handles the signal), an early USR1 must not kill the job.
trap '' USR1

# Under sbatch this script runs from a spool copy: the repository is where you submitted from.
ROOT="${SLURM_SUBMIT_DIR:-$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)}"
cd "$ROOT"
if [[ -n "${SLURM_JOB_ID:-}" ]]; then
    # Marks where each attempt starts in logs/slurm_<job>.err (appended across requeues).
    echo "training.sh: job ${SLURM_JOB_ID} attempt ${SLURM_RESTART_COUNT:-0}" \
        "task ${SLURM_ARRAY_TASK_ID:-none} on $(hostname) at $(date -Is)" >&2
    # The attempt's GPUs by name and UUID: a faulty or swapped GPU can be named from the log.
    if command -v nvidia-smi >/dev/null; then
        timeout 30 nvidia-smi -L >&2 || echo "training.sh: nvidia-smi -L failed (exit $?)" >&2
    fi
fi

# The method is the recipe's `method:` key (grpo when it has none); MAXENT=1 asks for maxent.
args=(run)
if [[ "${MAXENT:-0}" == "1" ]]; then
    args+=(--method maxent)
    RECIPE="${RECIPE:-recipes/smoke/config_maxent.yaml}"
else
    RECIPE="${RECIPE:-recipes/smoke/config_grpo.yaml}"
fi
# The launcher itself computes nothing: one thread. Trainers get theirs from the plan.
export OMP_NUM_THREADS=1

BIN="$(bash scripts/setup_env.sh "$RECIPE" "$@" | tail -n 1)"  # + what the recipe needs
args+=(--config "$RECIPE")
if [[ -n "${RUN_NAME:-}" ]]; then
    args+=(--run-name "$RUN_NAME")
fi
# exec: the launcher itself receives Slurm's signals (no shell in between to forward them).
exec "$BIN/maxent-grpo" "${args[@]}" "$@"
