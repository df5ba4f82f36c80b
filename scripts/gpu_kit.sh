#!/usr/bin/env bash
# GPU proof kit: one prepared command that proves the GPU path on a bare GPU machine.
#
#   bash scripts/gpu_kit.sh prepare            # here (package registry): wheels into .gpu-kit/
#   bash scripts/gpu_kit.sh run [OUT]          # on the GPU machine: OUT/gpu_kit.md + .json
#                                              # (OUT: $OUT, else outputs/gpu-kit)
#   bash scripts/gpu_kit.sh run --cpu [OUT]    # the same steps on the tiny model, on CPU
#
# `prepare` downloads the wheels the lent GPU machine lacks (bench/gpu_kit/packages.py says
# which: TRL, datasets, math-verify, DeepSpeed built without ops, and their needs the machine
# lacks), for CPython 3.12 on manylinux x86-64, keeps them cached (a re-run fetches only what
# is missing), checks that every need of every wheel is met by the kit or the machine, and
# fails if the kit and the working tree pass the 64 MiB a device call carries.
#
# `run` installs those wheels into a temporary folder (pip --target, no index, no network),
# puts it and src/ on PYTHONPATH, and runs each step (bench/gpu_kit/kit.py) under its own
# `timeout`; a step that fails or runs out of time does not stop the others. Everything is
# offline: the model (the Qwen2.5-0.5B shape, random weights; the tiny model with --cpu) and
# its tokenizer are built locally. An untimed warm-up run comes first; each later step's
# bound follows from its work at the warm-up's cost (kit.py cap). GPU_KIT_BUDGET_S bounds the
# whole run (default 480 s on GPU: one 10-minute device call with room to spare);
# GPU_KIT_TIMED_STEPS sets the timed steps per side of ours against bare TRL (default 30);
# GPU_KIT_PYTHON picks the interpreter (default: python3 on GPU, .venv/bin/python with --cpu);
# GPU_KIT_STEPS="oom zero2" runs only those steps (and the model's and the warm-up's);
# GPU_KIT_KEEP=1 keeps the work folder (models, logs, checkpoints).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
KIT="$ROOT/.gpu-kit"
LIMIT_MIB=64
BUILD_SETUPTOOLS="setuptools==84.2.1" # builds DeepSpeed's wheel (seen working with torch 2.13)

die() {
    echo "gpu_kit: error: $*" >&2
    exit 1
}

prepare() {
    local py="${GPU_KIT_PYTHON:-$ROOT/.venv/bin/python}" specs wheel kit_bytes tree_bytes
    mkdir -p "$KIT"
    for wheel in $("$py" bench/gpu_kit/packages.py stale "$KIT"); do
        echo "removing $(basename "$wheel") (not in the kit)"
        rm -f "$wheel"
    done
    mapfile -t specs < <("$py" bench/gpu_kit/packages.py missing "$KIT")
    local fetch=() build=()
    for spec in "${specs[@]}"; do
        if [[ "$spec" == deepspeed==* ]]; then build+=("$spec"); else fetch+=("$spec"); fi
    done
    if [[ ${#fetch[@]} -gt 0 ]]; then
        echo "downloading: ${fetch[*]}"
        "$py" -m pip download --quiet --disable-pip-version-check --no-deps \
            --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
            --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
            -d "$KIT" "${fetch[@]}" 2> >(grep -v "^WARNING: Location" >&2)
    fi
    if [[ ${#build[@]} -gt 0 ]]; then
        # No ops compiled (they JIT-build on first use; HF's Trainer gives DeepSpeed a torch
        # optimizer): a pure-Python wheel. No build isolation: setup.py imports torch, which
        # isolation would fetch again (gigabytes). A setuptools of its own: torch's
        # BuildExtension passes keywords that setuptools 77's build_ext refuses (TypeError:
        # use_ninja), and installing vLLM's CPU build puts 77 into .venv.
        echo "building: ${build[*]} (DS_BUILD_OPS=0, $BUILD_SETUPTOOLS)"
        local tools
        tools="$(mktemp -d "${TMPDIR:-/tmp}/gpu-kit-setuptools.XXXXXX")"
        "$py" -m pip install --quiet --disable-pip-version-check --no-deps --target "$tools" \
            "$BUILD_SETUPTOOLS" 2> >(grep -v "^WARNING: Location" >&2)
        DS_BUILD_OPS=0 PYTHONPATH="$tools" "$py" -m pip wheel --quiet \
            --disable-pip-version-check --no-deps --no-build-isolation --no-binary deepspeed \
            -w "$KIT" "${build[@]}" 2> >(grep -v "^WARNING: Location" >&2) >&2 ||
            { rm -rf "$tools"; die "building ${build[*]} failed (above)"; }
        rm -rf "$tools"
    fi
    [[ -z "$("$py" bench/gpu_kit/packages.py missing "$KIT")" ]] ||
        die "still missing after prepare: $("$py" bench/gpu_kit/packages.py missing "$KIT" | xargs)"
    "$py" bench/gpu_kit/packages.py check "$KIT" >&2 ||
        die "the wheels above need packages that neither the kit nor the GPU machine has"
    echo "wheels in .gpu-kit/:"
    for wheel in "$KIT"/*.whl; do
        awk -v b="$(stat -c %s "$wheel")" -v n="$(basename "$wheel")" \
            'BEGIN { printf "  %8.1f KiB  %s\n", b / 1024, n }'
    done
    kit_bytes=$(cat "$KIT"/*.whl | wc -c)
    # What else travels with a device call: tracked and untracked-not-ignored files.
    tree_bytes=$(git ls-files -z --cached --others --exclude-standard |
        xargs -0 cat 2>/dev/null | wc -c)
    awk -v k="$kit_bytes" -v t="$tree_bytes" -v n="$(ls "$KIT"/*.whl | wc -l)" -v l=$LIMIT_MIB \
        'BEGIN { m = 1048576; printf "total: %.1f MiB of wheels (%d files) + %.1f MiB working" \
            " tree = %.1f MiB (limit %d MiB)\n", k / m, n, t / m, (k + t) / m, l }'
    if ((kit_bytes + tree_bytes > LIMIT_MIB * 1048576)); then
        die "the kit and the working tree pass the ${LIMIT_MIB} MiB a device call carries"
    fi
}

# Seconds since a `date +%s.%N` stamp.
since() {
    awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'
}

# One step under its own time bound (kit.py cap: its work at the warm-up's cost, within the
# budget left); its exit code, seconds and bound go to WORK/steps/NAME.rc.
run_step() {
    local name="$1" cap left rc=0 t0
    left=$((BUDGET - ($(date +%s) - START) - 15)) # 15 s kept for the report
    mkdir -p "$WORK/steps"
    if ((left < 10)); then
        echo "skipped 0 out of the kit's time budget (${BUDGET} s)" >"$WORK/steps/$name.rc"
        return
    fi
    cap=$("$PY" bench/gpu_kit/kit.py cap "$name" --work "$WORK" --mode "$MODE") || cap=$left
    ((cap < left)) || cap=$left
    echo "=== step $name (at most ${cap} s of ${left} s left; $(($(date +%s) - START)) s since start)"
    t0=$(date +%s.%N)
    timeout -k 15 "$cap" "$PY" bench/gpu_kit/kit.py step "$name" --work "$WORK" --mode "$MODE" ||
        rc=$?
    echo "$rc $(since "$t0") $cap" >"$WORK/steps/$name.rc"
    echo "=== step $name: exit $rc after $(since "$t0") s"
}

run() {
    local out="" rc=0 cpu=0
    for arg in "$@"; do
        case "$arg" in
        --cpu) cpu=1 ;;
        -*) die "unknown option $arg (run [OUT] [--cpu])" ;;
        *) out="$arg" ;;
        esac
    done
    out="${out:-${OUT:-$ROOT/outputs/gpu-kit}}"
    mkdir -p "$out"
    out="$(cd "$out" && pwd)"
    MODE=gpu
    PY="${GPU_KIT_PYTHON:-python3}"
    BUDGET="${GPU_KIT_BUDGET_S:-480}"
    if ((cpu)); then
        MODE=cpu
        PY="${GPU_KIT_PYTHON:-$ROOT/.venv/bin/python}"
        BUDGET="${GPU_KIT_BUDGET_S:-600}"
    fi
    PY="$(command -v "$PY")"
    [[ "$BUDGET" =~ ^[0-9]+$ ]] || die "GPU_KIT_BUDGET_S=$BUDGET: give whole seconds (e.g. 480)"
    [[ "${GPU_KIT_TIMED_STEPS:-30}" =~ ^[0-9]+$ && "${GPU_KIT_TIMED_STEPS:-30}" -ge 2 ]] ||
        die "GPU_KIT_TIMED_STEPS=$GPU_KIT_TIMED_STEPS: give a whole number of steps, 2 or more"
    START=$(date +%s)
    WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-kit.XXXXXX")"
    export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
    mkdir -p "$WORK/steps" "$WORK/bin"
    echo "gpu_kit: $MODE run, work folder $WORK, results to $out, budget ${BUDGET} s"

    # The wheels: onto PYTHONPATH ahead of whatever the interpreter has.
    local t0=$(date +%s.%N)
    if ! "$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))'; then
        echo "0 0 0 the wheels are for Python 3.12: the interpreter's own packages" \
            >"$WORK/steps/install.rc"
    elif compgen -G "$KIT/*.whl" >/dev/null; then
        timeout 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
            --disable-pip-version-check --target "$WORK/site" "$KIT"/*.whl || rc=$?
        export PYTHONPATH="$WORK/site:$PYTHONPATH"
        "$PY" bench/gpu_kit/packages.py conflicts "$KIT" >"$WORK/conflicts.txt" || true
        echo "$rc $(since "$t0") 120 wheels" >"$WORK/steps/install.rc"
    else
        # Your own node's environment; on a bare machine the steps then fail on the import.
        echo "0 0 0 no wheels in .gpu-kit/: the interpreter's own packages" \
            >"$WORK/steps/install.rc"
    fi
    # training.sh runs `maxent-grpo` from the environment setup_env.sh names; with
    # MAXENT_GRPO_ENV=current that is the one on PATH, here this interpreter and PYTHONPATH.
    printf '#!/bin/sh\nexec "%s" -m maxent_grpo.cli "$@"\n' "$PY" >"$WORK/bin/maxent-grpo"
    chmod +x "$WORK/bin/maxent-grpo"
    export PATH="$WORK/bin:$PATH" MAXENT_GRPO_ENV=current HF_HUB_OFFLINE=1 \
        WANDB_MODE=disabled PYTHONUNBUFFERED=1
    # Every side gets the same OpenMP threads: what our launcher gives one trainer on a GPU
    # node (all CPUs), one on CPU (more is slower on a small machine).
    if [[ $MODE == gpu ]]; then
        export CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" OMP_NUM_THREADS="$(nproc)"
    else
        export OMP_NUM_THREADS=1
    fi

    # Most telling first: a step the budget cannot fit any more is the least missed.
    local name
    for name in model warmup overhead signal oom maxent checkpointing zero2; do
        # GPU_KIT_STEPS="oom zero2": only those (a rerun of what failed); the model and the
        # warm-up always (the warm-up's cost sets the others' bounds).
        if [[ -n "${GPU_KIT_STEPS:-}" && $name != model && $name != warmup &&
            " $GPU_KIT_STEPS " != *" $name "* ]]; then
            continue
        fi
        run_step "$name"
    done
    rc=0
    "$PY" bench/gpu_kit/kit.py report --work "$WORK" --mode "$MODE" --out "$out" \
        --total "$(($(date +%s) - START))" || rc=$?
    [[ -n "${GPU_KIT_KEEP:-}" ]] || rm -rf "$WORK"
    return $rc # 1 when a step failed, ran out of time or did not run
}

case "${1:-}" in
prepare) prepare ;;
run)
    shift
    run "$@"
    ;;
*)
    sed -n '2,6p' "$0" >&2
    exit 2
    ;;
esac
