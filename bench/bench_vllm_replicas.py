"""vLLM CPU server generation throughput with 1 against 2 replicas (--data-parallel-size).

    OMP_NUM_THREADS=1 python bench/bench_vllm_replicas.py [--shape small|tiny] [--prompts 64]

Needs vllm (vLLM's CPU build); without it, it prints one line and exits 0. Not part of
bench/run_all.py's default set (two server starts, about 2 minutes).

For each replica count: the server the launcher would start for a CPU recipe with
vllm_data_parallel_size 1 or 2 (the plan's own command, launch/plan.py make_plan), started
alone; once healthy, `--prompts` completion requests of exactly `--tokens` tokens (ignore_eos),
sent all at once from as many threads, a warm-up round and then `--repeats` timed rounds.
Figures: completions/s and tokens/s (median round), the 2/1 ratio, the load average around
each server's rounds. Models: `small` (default), a randomly initialised Qwen2 of 4 layers,
hidden 256, head_dim 64, untied embeddings, with the tiny model's tokenizer (enough compute
per token for replicas to matter), or `tiny`, the tests' model. Writes
bench/results/vllm_replicas.json and the servers' logs beside it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchlib import (
    PYTHON,
    REPO,
    RESULTS_DIR,
    SMOKE_VLLM,
    Measurement,
    bench_parser,
    child_env,
    figure,
    loadavg,
    print_figures,
    vllm_missing,
    write_recipe,
)

from maxent_grpo.server_auth import auth_headers

TEXT = "What is the sum of 12 plus 30? Think in <think></think>, then answer."


def small_model(folder: Path) -> Path:
    """A random Qwen2 bigger than the tiny one (vLLM CPU: head_dim >= 32, untied embeddings)."""
    import torch
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model, qwen2_config

    tokenizer = AutoTokenizer.from_pretrained(ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR))
    config = qwen2_config(
        tokenizer,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
    )
    torch.manual_seed(0)
    out = folder / "small-qwen2"
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def server_plan(folder: Path, model: Path, replicas: int):
    """The launcher's server for a CPU recipe with vllm_data_parallel_size `replicas`."""
    from maxent_grpo.launch.plan import Environment, Ports, make_plan
    from maxent_grpo.launch.processes import free_port
    from maxent_grpo.recipe import read_recipe

    recipe = write_recipe(
        folder,
        SMOKE_VLLM,
        f"replicas-{replicas}.yaml",
        model_name_or_path=str(model),
        vllm_data_parallel_size=replicas,
    )
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    return make_plan(
        Environment(python=PYTHON), read_recipe(["--config", str(recipe)]), ports
    ).server


def one_round(url: str, model_id: str, prompts: int, tokens: int) -> tuple[float, int, int]:
    """(seconds, completions, tokens) for `prompts` concurrent requests."""
    import requests

    headers = auth_headers()  # the server asks for the bench's token (benchlib)

    def request(i: int) -> int:
        response = requests.post(
            f"{url}/v1/completions",
            headers=headers,
            json={
                "model": model_id,
                "prompt": f"{TEXT} ({i})",
                "max_tokens": tokens,
                "min_tokens": tokens,
                "ignore_eos": True,
                # No per-request "seed": vLLM 0.31's CPU sampler kills the engine with
                # "CPU Generator does not use offset" on a seeded request.
                "temperature": 1.0,
            },
            timeout=600,
        )
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:500]}")
        return response.json()["usage"]["completion_tokens"]

    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=prompts) as pool:
        counts = list(pool.map(request, range(prompts)))
    return time.perf_counter() - start, len(counts), sum(counts)


def measure(folder: Path, model: Path, replicas: int, args) -> dict:
    import requests

    from maxent_grpo.launch.server import VLLMServer

    plan = server_plan(folder, model, replicas)
    log = RESULTS_DIR / f"vllm_replicas-dp{replicas}.log"
    server = VLLMServer(plan, log, child_env()).start()
    try:
        try:
            healthy = server.wait_until_healthy()
        except Exception as exc:  # noqa: BLE001 - a failed start is a result here
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
            errors = [line for line in tail if "Error" in line or "error" in line]
            return {"failed": str(exc).splitlines()[0], "error_line": (errors or tail or [""])[-1]}
        models = requests.get(f"{plan.url}/v1/models", headers=auth_headers(), timeout=30)
        model_id = models.json()["data"][0]["id"]
        one_round(plan.url, model_id, args.prompts, args.tokens)  # warm-up
        load_before = loadavg()
        rounds = [
            one_round(plan.url, model_id, args.prompts, args.tokens) for _ in range(args.repeats)
        ]
        load_after = loadavg()
    finally:
        server.stop()
    seconds = statistics.median(r[0] for r in rounds)
    completions, tokens = rounds[0][1], rounds[0][2]
    result = {
        "replicas": replicas,
        "healthy_after_s": healthy,
        "round_s": [r[0] for r in rounds],
        "completions_per_s": completions / seconds,
        "tokens_per_s": tokens / seconds,
        "tokens_per_round": tokens,
        "load_average": {"before": load_before, "after": load_after},
        "command": list(plan.command),
    }
    print(
        f"replicas {replicas}: healthy after {healthy:.1f}s; {completions / seconds:.2f} "
        f"completions/s, {tokens / seconds:.1f} tokens/s (rounds "
        + ", ".join(f"{r[0]:.2f}" for r in rounds)
        + f" s); load average {load_before} -> {load_after}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--shape", choices=["small", "tiny"], default="small")
    parser.add_argument("--prompts", type=int, default=64, help="concurrent requests a round")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per server")
    args = parser.parse_args(argv)
    if vllm_missing("vllm replicas"):
        return 0
    measurement = Measurement("vllm_replicas", args.output)
    with tempfile.TemporaryDirectory(prefix="bench-vllm-replicas-") as tmp:
        folder = Path(tmp)
        if args.shape == "small":
            model = small_model(folder)
        else:
            from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

            model = ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR)
        runs = {n: measure(folder, model, n, args) for n in (1, 2)}
    one, two = runs[1], runs[2]
    setting = f"{args.shape} model, {args.prompts} x {args.tokens} tokens, {loadavg()} load now"
    if "failed" in one or "failed" in two:
        failed = two if "failed" in two else one
        print(f"vllm replicas: a server did not start: {failed['error_line']}", flush=True)
        figures = [figure("vllm replicas: 2/1 tokens/s", None, "x", note=failed["failed"])]
    else:
        figures = [
            figure("vllm replicas: 1 replica, completions/s", one["completions_per_s"], "/s"),
            figure("vllm replicas: 2 replicas, completions/s", two["completions_per_s"], "/s"),
            figure("vllm replicas: 1 replica, tokens/s", one["tokens_per_s"], "tok/s"),
            figure("vllm replicas: 2 replicas, tokens/s", two["tokens_per_s"], "tok/s"),
            figure(
                "vllm replicas: 2/1 tokens/s",
                two["tokens_per_s"] / one["tokens_per_s"],
                "x",
                is_ratio=True,
                note=setting,
            ),
        ]
    print_figures(figures)
    settings = {"shape": args.shape, "prompts": args.prompts, "tokens": args.tokens}
    measurement.finish(figures, {**settings, "repeats": args.repeats}, runs=runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
