"""Environment variables of the seed guide that override recipe keys, as recipe flags.

    VLLM_TP_SIZE=2 maxent-grpo plan --config R --gpus 8   # 2 server GPUs, 6 trainers

Each variable becomes the flag of its key, placed before the command line's own overrides,
so it goes through the one recipe parse (types, choices, ranges) and reaches the trainers
exactly as the launcher saw it; a flag given on the command line still wins. Pure: the
environment comes in as a mapping.

VLLM_PORT is the exception: it picks the server's port (the launcher otherwise asks the OS
for a free one), and it is removed from the server's environment, because vLLM reads a
variable of that name for its own internal ports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import ConfigError
from maxent_grpo.methods import METHODS

# variable -> the recipe key it sets
KEY_VARIABLES = {
    "VLLM_MODEL": "model_name_or_path",
    "VLLM_TP_SIZE": "vllm_tensor_parallel_size",
    "VLLM_DP_SIZE": "vllm_data_parallel_size",
    "VLLM_NODES": "vllm_nodes",
    "VLLM_MAX_LEN": "vllm_max_model_length",
    "VLLM_MEM_UTIL": "vllm_server_gpu_memory_utilization",
}
PORT_VARIABLE = "VLLM_PORT"
ENTRYPOINT_VARIABLE = "TRAIN_ENTRYPOINT"


@dataclass(frozen=True)
class EnvOverrides:
    """What the environment asks for: recipe flags, a server port, a method, and why."""

    flags: tuple[str, ...] = ()
    vllm_port: int | None = None
    method: str | None = None
    notes: tuple[str, ...] = ()  # "VLLM_TP_SIZE=2 -> vllm_tensor_parallel_size", one per variable


def _method_of_entrypoint(value: str) -> str:
    """TRAIN_ENTRYPOINT=src/maxent-grpo.py (or maxent-grpo.py, grpo.py) -> its method."""
    name = Path(value).name
    for method in METHODS.values():
        if name == method.script:
            return method.name
    scripts = ", ".join(f"src/{m.script}" for m in METHODS.values())
    raise ConfigError(
        f"environment: {ENTRYPOINT_VARIABLE}={value!r} is not an entry point of this toolkit; "
        f"set it to one of {scripts}, or unset it"
    )


def _port(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise ConfigError(
            f"environment: {PORT_VARIABLE}={value!r} is not a TCP port; set it to 1-65535 "
            "or unset it (a free port is picked)"
        )
    return int(value)


def env_overrides(environ: Mapping[str, str]) -> EnvOverrides:
    """The overrides the seed guide's variables ask for (empty ones are ignored)."""
    flags: list[str] = []
    notes: list[str] = []
    for variable, key in KEY_VARIABLES.items():
        value = environ.get(variable, "")
        if value:
            flags += [f"--{key}", value]
            notes.append(f"{variable}={value} -> {key}")
    port = environ.get(PORT_VARIABLE, "")
    vllm_port = _port(port) if port else None
    if vllm_port is not None:
        notes.append(f"{PORT_VARIABLE}={port} -> the vLLM server's port")
    entrypoint = environ.get(ENTRYPOINT_VARIABLE, "")
    method = _method_of_entrypoint(entrypoint) if entrypoint else None
    if method is not None:
        notes.append(f"{ENTRYPOINT_VARIABLE}={entrypoint} -> method {method}")
    return EnvOverrides(tuple(flags), vllm_port, method, tuple(notes))


def server_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment a vLLM server starts from: ours, without our VLLM_PORT."""
    return {k: v for k, v in environ.items() if k != PORT_VARIABLE}
