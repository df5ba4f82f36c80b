"""vLLM CPU generation throughput with one server against two (vllm_nodes), on the test cluster.

    flock /tmp/slurm.lock bash -c 'bash tests/slurm/cluster.sh start --nodes 3 &&
        OMP_NUM_THREADS=1 .venv/bin/python bench/bench_servers.py; bash tests/slurm/cluster.sh stop'

Needs vLLM's CPU build and the multi-node test cluster (tests/slurm/cluster.sh, 2 nodes or
more); without either it prints one line and exits 0. Not part of bench/run_all.py (two vLLM
starts on the cluster, about 3 minutes).

One Slurm job on two nodes starts the launcher's CPU server command (the plan's, as in
bench_vllm_replicas.py) on each node, each server's vLLM worker bound to its own core
(VLLM_CPU_OMP_THREADS_BIND=<node index>: the nodes of the test cluster share this machine's
cores, and vLLM would pin every server to core 0). From this host, the trainers' own router
(train/server_pool.py ServerPool over TRL's VLLMClient) sends `--prompts` prompts of exactly
`--tokens` completion tokens per round, to the first server alone or to both, a warm-up each,
then `--repeats` timed rounds, alternating. Figures: prompts/s (median round) for one and two
servers, their ratio, and how the two-server rounds split the prompts; then the disk weight
push (the model's safetensors reloaded) to one server, to both at once (the trainers' pool)
and to both in turn (the push before issue 55). Writes bench/results/servers.json.
"""

from __future__ import annotations

import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_vllm_replicas import TEXT, server_plan, small_model
from benchlib import (
    PYTHON,
    REPO,
    RESULTS_DIR,
    Measurement,
    bench_parser,
    child_env,
    figure,
    loadavg,
    print_figures,
    vllm_missing,
)

CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
START_S = 420.0  # two vLLM CPU starts on two shared cores: 60-150 s measured


def slurm(env: dict[str, str], *args: str) -> str:
    return subprocess.run(
        args, check=True, capture_output=True, text=True, timeout=60, env=env
    ).stdout


def cluster_env() -> dict[str, str] | None:
    """The multi-node test cluster's environment (`cluster.sh env`: SLURM_CONF and its node
    count), or None when it is not running with 2 nodes or more."""
    proc = subprocess.run(["bash", str(CLUSTER_SH), "env"], capture_output=True, text=True)
    exported = dict(
        line.removeprefix("export ").split("=", 1)
        for line in proc.stdout.splitlines()
        if line.startswith("export ") and "=" in line
    )
    exported = {k: v.strip("'\"") for k, v in exported.items()}
    if proc.returncode or int(exported.get("SLURM_TEST_NODES") or 0) < 2:
        return None
    env = child_env(SLURM_CONF=exported["SLURM_CONF"])
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], capture_output=True, env=env)
    return env if sinfo.returncode == 0 else None


def start_servers(env: dict[str, str], command: tuple[str, ...], log: Path) -> str:
    """One job, one server per node, each worker on the core of its node index, bound to its
    node's address (the plan's one-node command binds loopback)."""
    own = list(command)
    own[own.index("--host") + 1] = "NODE_ADDRESS"
    serve = "VLLM_CPU_OMP_THREADS_BIND=$SLURM_NODEID exec " + shlex.join(own)
    serve = serve.replace("NODE_ADDRESS", '"$(hostname)"')
    step = f"srun --ntasks=2 --ntasks-per-node=1 bash -c {shlex.quote(serve)}"
    args = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=1", f"--output={log}"]
    return (
        subprocess.run(
            [*args, f"--wrap={step}"], check=True, capture_output=True, text=True, env=env
        )
        .stdout.split(";")[0]
        .strip()
    )


def server_urls(env: dict[str, str], job: str, port: int) -> list[str]:
    """The job's nodes' addresses (NodeAddr), reachable from this host over the bridge."""
    deadline = time.monotonic() + 60
    while True:
        state, _, nodes = (
            slurm(env, "squeue", "-h", "-j", job, "-o", "%T %N").strip().partition(" ")
        )
        if state == "RUNNING" and nodes:
            break
        if not state:  # gone from the queue: it ended (e.g. its output file could not be made)
            raise RuntimeError(f"job {job} ended before its servers ran: see {RESULTS_DIR}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job} did not start within 60 s ({state})")
        time.sleep(0.5)
    urls = []
    for name in slurm(env, "scontrol", "show", "hostnames", nodes).split():
        record = slurm(env, "scontrol", "show", "node", "-o", name).split()
        fields = dict(f.split("=", 1) for f in record if "=" in f)
        urls.append(f"http://{fields['NodeAddr']}:{port}")
    return urls


def wait_healthy(urls: list[str]) -> float:
    from maxent_grpo.vllm_health import probe

    start = time.monotonic()
    while not all(probe(f"{url}/health", timeout=2.0) == 200 for url in urls):
        if time.monotonic() - start > START_S:
            raise RuntimeError(f"servers not healthy after {START_S:g} s: {urls}")
        time.sleep(2.0)
    return time.monotonic() - start


def one_round(pool, prompts: list[str], tokens: int) -> float:
    start = time.perf_counter()
    answer = pool.generate(
        prompts, max_tokens=tokens, generation_kwargs={"min_tokens": tokens, "ignore_eos": True}
    )
    assert len(answer["completion_ids"]) == len(prompts)
    return time.perf_counter() - start


def measure(urls: list[str], args, model: Path) -> dict:
    """Warm-up, then alternating timed rounds of the first server alone and of both; then the
    weight pushes."""
    from maxent_grpo.train.server_pool import ServerPool
    from maxent_grpo.train.vllm_connect import authorized_client_class

    clients = [authorized_client_class()(base_url=url) for url in urls]  # the bench's token
    pools = {1: ServerPool(clients[:1], timeout=600), 2: ServerPool(clients, timeout=600)}
    prompts = [f"{TEXT} ({i})" for i in range(args.prompts)]
    for pool in pools.values():
        one_round(pool, prompts, args.tokens)
    before = list(pools[2].prompts_served)
    rounds: dict[int, list[float]] = {1: [], 2: []}
    for _ in range(args.repeats):
        for servers, pool in pools.items():
            rounds[servers].append(one_round(pool, prompts, args.tokens))
    split = [after - b for after, b in zip(pools[2].prompts_served, before, strict=True)]
    return {
        "round_s": rounds,
        "prompts_per_s": {n: args.prompts / statistics.median(r) for n, r in rounds.items()},
        "two_server_split": dict(zip(urls, split, strict=True)),
        "push_s": pushes(pools, model, args.repeats),
    }


def pushes(pools: dict, model: Path, repeats: int) -> dict[str, float]:
    """Median seconds of a disk weight push (the model's safetensors reloaded, the prefix
    cache reset: vllm_weight_sync: disk's calls) to one server, to both at once (the pool),
    and to both one after the other (the push before issue 55), alternating."""
    import functools

    from maxent_grpo.train.vllm_sync import _reload_and_reset

    reload = functools.partial(_reload_and_reset, directory=model)

    def in_turn() -> None:
        for client in pools[2].clients:
            reload(client)

    ways = {
        "1 server": lambda: pools[1].each(reload, "reload_weights"),
        "2 at once": lambda: pools[2].each(reload, "reload_weights"),
        "2 in turn": in_turn,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(repeats + 1):  # the first round warms up
        for name, push in ways.items():
            start = time.perf_counter()
            push()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(seconds[1:]) for name, seconds in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__doc__)
    parser.add_argument("--prompts", type=int, default=64, help="prompts a round")
    parser.add_argument("--tokens", type=int, default=32, help="tokens per completion")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per setting")
    args = parser.parse_args(argv)
    if vllm_missing("servers"):
        return 0
    env = cluster_env()
    if env is None:
        print(
            "servers: skipped: no multi-node test cluster (tests/slurm/cluster.sh start --nodes 3)"
        )
        return 0
    measurement = Measurement("servers", args.output)
    with tempfile.TemporaryDirectory(prefix="bench-servers-") as tmp:
        model = small_model(Path(tmp))
        plan = server_plan(Path(tmp), model, 1)
        env.update(plan.env)
        log = RESULTS_DIR / "servers-job.log"
        log.parent.mkdir(parents=True, exist_ok=True)  # a fresh checkout has no results yet
        job = start_servers(env, plan.command, log)
        try:
            urls = server_urls(env, job, plan.port)
            healthy = wait_healthy(urls)
            print(f"servers: {', '.join(urls)} healthy after {healthy:.1f} s", flush=True)
            result = measure(urls, args, model)
        finally:
            subprocess.run(["scancel", job], env=env, check=False)
    one, two = result["prompts_per_s"][1], result["prompts_per_s"][2]
    split = ", ".join(f"{url}: {n}" for url, n in result["two_server_split"].items())
    setting = f"{args.prompts} prompts x {args.tokens} tokens, load {loadavg()}"
    figures = [
        figure("servers: 1 server, prompts/s", one, "/s"),
        figure("servers: 2 servers, prompts/s", two, "/s"),
        figure("servers: 2/1 prompts/s", two / one, "x", is_ratio=True, note=setting),
    ]
    push = result["push_s"]
    for name, seconds in push.items():
        figures.append(figure(f"servers: weight push, {name}", seconds, "s"))
    figures.append(
        figure(
            "servers: push 2 at once / 1", push["2 at once"] / push["1 server"], "x", is_ratio=True
        )
    )
    figures.append(
        figure(
            "servers: push 2 in turn / 1", push["2 in turn"] / push["1 server"], "x", is_ratio=True
        )
    )
    print_figures(figures)
    print(f"  servers: two-server rounds, prompts per server: {split}", flush=True)
    settings = {"prompts": args.prompts, "tokens": args.tokens, "repeats": args.repeats}
    measurement.finish(figures, settings, healthy_after_s=healthy, python=PYTHON, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
