"""vLLM CPU servers shared by several tests of the suite (one start costs about 33 CPU-s: three
processes importing vLLM, torch and transformers).

A shared server is started as the launcher starts it (plan.make_plan -> server.VLLMServer) for a
recipe with its server keys; a test that trains against it makes its own plan on the server's
ports and checks that its recipe would have started the very same server. Sharing is sound for
training runs: a fresh trainer pushes its weights (or adapter) before its first generation
(TRL syncs at step 0), and TRL's logprob check at every step catches a server on other weights.
Tests that stop or kill a server start their own.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import SimpleNamespace

from helpers.procs import wait_until_gone
from helpers.recipes import SMOKE_VLLM, write_recipe
from helpers.runs import child_env
from maxent_grpo.launch.plan import Environment, Ports, make_plan
from maxent_grpo.launch.processes import free_port
from maxent_grpo.launch.server import VLLMServer
from maxent_grpo.recipe import read_recipe

# The server keys each kind of shared server is started with (on SMOKE_VLLM's). A recipe
# trained against it sets the same values (SHARED_KEYS[kind] in its write_recipe).
SHARED_KEYS = {
    # Disk weight sync; 1024 tokens so that the tool test's prompts (tool schemas) fit.
    "disk": dict(vllm_weight_sync="disk", vllm_max_model_length=1024),
    # The disk server's keys, a server of its own for test_vllm_rollout_func.py: its requests
    # would move the shared disk server's sampling stream, on which test_vllm_rollouts.py's
    # "some step needs a second round" rests (seen: no step did, in CI, once it shared).
    "rollout_func": dict(vllm_weight_sync="disk", vllm_max_model_length=1024),
    # Runtime LoRA loading, rank 8 (`vllm_weight_sync: lora`).
    "lora": dict(
        vllm_weight_sync="lora", use_peft=True, lora_r=8, lora_target_modules="all-linear"
    ),
}


RUNNING: dict[str, SimpleNamespace] = {}  # kind -> the shared server, while it runs


def start_shared(folder: Path, tiny_model: Path, kind: str):
    """Start the `kind` server; a generator for a session fixture (yields, then stops it)."""
    recipe = write_recipe(
        folder, base=SMOKE_VLLM, model_name_or_path=str(tiny_model), **SHARED_KEYS[kind]
    )
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    request = read_recipe(["--config", str(recipe)])
    plan = make_plan(Environment(python=sys.executable), request, ports)
    server = VLLMServer(plan.server, folder / "logs" / f"vllm_{kind}.log", child_env())
    RUNNING[kind] = SimpleNamespace(kind=kind, plan=plan, ports=ports, server=server.start())
    try:
        took = server.wait_until_healthy()
        print(f"\nMEASURED shared {kind} server: time to healthy {took:.3g}s", flush=True)
        yield RUNNING[kind]
    finally:
        stop_shared(kind)


def stop_shared(kind: str) -> None:
    """Stop the `kind` server if it runs: at the session's end, or once its last test is done
    (conftest.py), since an idle CPU server still takes about 0.04 of a core."""
    shared = RUNNING.pop(kind, None)
    if shared is None:
        return
    start = time.monotonic()
    shared.server.stop()
    left, _ = wait_until_gone({shared.server.pid}, timeout=15)
    print(f"\nMEASURED shared {kind} server: stop {time.monotonic() - start:.3g}s", flush=True)
    assert not left, left


def plan_on(shared, recipe):
    """(plan, env): the launcher's plan for `recipe` (a file, or a read recipe) on the shared
    server's ports, and its trainers' environment as the launcher gives it (the recipe's env:
    block under the plan's variables). The recipe must start the very server that is running."""
    request = read_recipe(["--config", str(recipe)]) if isinstance(recipe, Path) else recipe
    plan = make_plan(Environment(python=sys.executable), request, shared.ports)
    assert plan.server.command == shared.plan.server.command, (plan.server, shared.plan.server)
    assert plan.server.env == shared.plan.server.env, (plan.server.env, shared.plan.server.env)
    assert RUNNING.get(shared.kind) is shared and shared.server.poll() is None, "server gone"
    return plan, {**request.env, **plan.train.env}
