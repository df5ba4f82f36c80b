"""`maxent-grpo rehearse`: the user's recipe, shrunk to this machine, run for a few steps,
stopped with the signal Slurm sends, resumed, and checked; prints a passport (docs/rehearse.md).

The decisions (what shrinks, what a row concludes) are launch/plan/rehearse.py's; the checks
that need no training run are launch/rehearse_probes.py's. Here: the effects. Training goes
through the launcher's public entry point, `maxent-grpo run`, as a user would start it:

1. an uninterrupted rehearsal of `steps` steps (the reference for the prompts' order);
2. the same, stopped with SIGUSR1 to the launcher while its first step is held at its
   generation (so the stop lands at that step's end), then started again, which resumes it
   from the checkpoint the signal wrote.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from maxent_grpo.errors import UserError
from maxent_grpo.faults import ENV as FAILPOINT
from maxent_grpo.faults import HITS_ENV as FAILPOINT_HITS
from maxent_grpo.launch.plan import rehearse as plan
from maxent_grpo.rundir.checkpoints import list_checkpoints
from maxent_grpo.rundir.events import read_events

MARKER = "rehearsal.json"
# one launch, start to exit (a CPU vLLM server took 873 s to start on a busy 2-core machine)
LAUNCH_TIMEOUT_S = 3600
FAILPOINT_ENV = "MAXENT_GRPO_REHEARSAL_FAILPOINT"  # given to the resumed launch only (tests)
TOLERANCE = 1e-3  # server vs trainer logprob, per token, after a push (float32 on both sides)


def hub_reachable(timeout: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        return False
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _folder(path: Path) -> Path:
    """A fresh rehearsal folder: an older rehearsal's is replaced, anything else refused."""
    if path.exists() and any(path.iterdir()) and not (path / MARKER).is_file():
        raise UserError(f"--out {path}: exists and is not a rehearsal's folder; give another")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    (path / MARKER).write_text("{}")
    return path


def _values(request) -> dict:
    from maxent_grpo.recipe.parser import load_recipe_file  # the recipe file as written

    values = dict(load_recipe_file(request.recipe))
    args = list(request.overrides)
    for i, arg in enumerate(args):
        if arg.startswith("--") and i + 1 < len(args):
            values[arg[2:]] = yaml.safe_load(args[i + 1])
    return values


def _check(request, gpus, nodes) -> dict:
    from maxent_grpo.launch.plan import servers_summary  # check's verdict only
    from maxent_grpo.launch.sbatch import check_for, planned_environment  # check's verdict only

    environment = planned_environment(nodes, gpus) if gpus is not None else None
    try:
        prepared, _notes = check_for(request, environment)
    except UserError as exc:
        return {"error": str(exc).replace("\n", "; ")}
    p = prepared.plan
    where = f"{p.train.num_processes} training process(es) on {p.device}{servers_summary(p)}"
    return {"verdict": f"valid for {where}", "plan": where}


def main(
    request, gpus: int | None, nodes: int, steps: int, out: str | None, server: bool = True
) -> int:
    """Rehearse request.recipe; print the passport; 0 when every row holds, 1 otherwise."""
    from maxent_grpo.tiny_model import (
        DEFAULT_TINY_MODEL_DIR,
        ensure_tiny_model,
    )  # builds the model: seconds

    if steps < 2:
        raise UserError(f"--steps {steps}: a rehearsal stops after step 1 and resumes; give 2+")
    start = time.monotonic()
    stem = Path(request.recipe).with_suffix("")
    folder = _folder(Path(out or Path("outputs") / "rehearse" / "_".join(stem.parts[-3:])))
    record = {"check": _check(request, gpus, nodes)}
    print(f"rehearse {request.recipe}: {record['check'].get('verdict', 'fails check')}")
    node = plan.Node(
        tiny_model=str(ensure_tiny_model(DEFAULT_TINY_MODEL_DIR).resolve()),
        vllm=server and importlib.util.find_spec("vllm") is not None,
        hub=hub_reachable(),
        tool_template=_tool_template(),
    )
    original = _values(request)
    shrunk = plan.shrink(original, node, steps)
    print(f"shrunk for this machine ({len(shrunk.changes)} changes):")
    print("\n".join(f"  change: {line}" for line in shrunk.changes))
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(shrunk.values, sort_keys=False))
    record.update(_static(recipe, request.method, original, node))
    if plan.exit_code(plan.passport(record)) == 0:
        record.update(_trained(recipe, folder, shrunk.values, steps, node))
        record["rewards"] = {**record.get("rewards", {}), **record.pop("rewards_training", {})}
        if "tools" in record:
            record["tools"].update(record.pop("tools_training", {}))
    else:  # what the rows below say fails before any training: fix that first
        record["resume"] = {"skipped": "training not run: fix the failing rows first"}
    rows = plan.passport(record)
    wall = time.monotonic() - start
    print(plan.table(rows))
    print(f"wall time {wall:.0f} s; passport: {folder / 'passport.json'}")
    passport = {
        "recipe": request.recipe,
        "planned_for": {"gpus": gpus, "nodes": nodes},
        "flags": [] if server else ["--no-server"],
        "changes": list(shrunk.changes),
        "rows": [row.as_json() for row in rows],
        "wall_s": round(wall, 1),
        "record": record,
    }
    (folder / "passport.json").write_text(json.dumps(passport, indent=1, default=str))
    return plan.exit_code(rows)


def _tool_template() -> str:
    """TRL's Qwen2.5 chat template: it renders tool calls, and TRL parses them back."""
    from importlib.resources import files  # tools recipes only

    try:
        return (files("trl") / "chat_templates" / "qwen2_5.jinja").read_text()
    except (ModuleNotFoundError, OSError):
        return ""


def _static(recipe: Path, method, original: dict, node) -> dict:
    """The rows that need no training: rewards, prompts, tools, sandbox (on the shrunk recipe,
    built as the trainers build it)."""
    import datasets  # seconds

    from maxent_grpo.data import load_datasets  # datasets: seconds
    from maxent_grpo.launch import rehearse_probes as probes  # imports transformers
    from maxent_grpo.recipe import build_recipe, read_recipe  # imports TRL when built

    datasets.disable_progress_bars()
    try:
        built = build_recipe(read_recipe(["--config", str(recipe)], method), plan.TRAINERS)
        script, training, model = built.script, built.training, built.model
        rows = load_datasets(script)["train"]
    except UserError as exc:
        line = str(exc).replace("\n", "; ")
        return {"build": {"error": line}, "check": {"error": line}}
    found: dict = {"build": {}}
    try:
        found["rewards"] = {"probe": probes.reward_probe(script, training, rows)}
    except UserError as exc:
        found["check"] = {"error": str(exc)}
    found["prompts"] = probes.prompt_fit(script, training, model, original, rows, node.tiny_model)
    if (tools := probes.tool_probe(script)) is not None:
        found["tools"] = tools
    names = [str(n) for n in script.reward_funcs or []]
    if (sandbox := probes.sandbox_probe(script, names)) is not None:
        found["sandbox"] = sandbox
    return found


def _env(draws: Path, failpoint: bool = False) -> dict:
    from maxent_grpo.rewards.rehearsal import ENV  # the probe's variable

    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", ENV: str(draws)}
    env.setdefault("HF_HUB_OFFLINE", "0" if hub_reachable() else "1")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if failpoint and os.environ.get(FAILPOINT_ENV):
        env["MAXENT_GRPO_FAILPOINT"] = os.environ[FAILPOINT_ENV]
    return env


def _launch(recipe: Path, output: Path, logs: Path, env: dict, stop_at: int | None, extra=()):
    """`maxent-grpo run` of the rehearsal's recipe into `output`; with stop_at, SIGUSR1 to the
    launcher while step `stop_at` is held at its generation (the product's failpoint), so the
    stop lands at that step's end however fast the steps are (a 3-step CPU run could end
    before a signal sent on its first step's event). Returns the exit code (None: it ran out
    of time)."""
    logs.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "maxent_grpo.cli", "run", "--config", str(recipe)]
    command += ["--logs-dir", str(logs), "--", "--output_dir", str(output), *extra]
    hits = logs / "held.txt"
    if stop_at is not None:
        env = {**env, FAILPOINT: f"generation:{stop_at}:pause", FAILPOINT_HITS: str(hits)}
    with open(logs / "launcher.out", "w") as log:
        # its own session: on a timeout or an interrupt here, its whole tree can be stopped
        proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    try:
        if stop_at is not None:
            _stop_while_held(proc, output, hits, deadline)
        return proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None
    finally:
        _stop(proc)


def _stop_while_held(proc: subprocess.Popen, output: Path, hits: Path, deadline: float) -> None:
    """Once a rank holds at the failpoint: SIGUSR1 (what Slurm sends the job before its
    limit); once the launcher has written the stop request, let every held rank go on (a rank
    that reaches the point later is let go when it does)."""
    signalled, released = False, set()
    while proc.poll() is None and time.monotonic() < deadline:
        held = {int(line.split()[0]) for line in _lines(hits)}
        if held and not signalled:
            proc.send_signal(signal.SIGUSR1)
            signalled = True
        if signalled and any(e["event"] == "stop_request" for e in read_events(output)):
            for pid in held - released:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass
                released.add(pid)
        time.sleep(0.2)


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text().splitlines()
    except FileNotFoundError:
        return []


def _stop(proc: subprocess.Popen) -> None:
    """A launcher still running: SIGINT twice (its "stop everything now"), then its session."""
    for _ in range(2):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            time.sleep(2)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever of its session is left
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def _step_events(output: Path, since: int = 0) -> list[dict]:
    return [e for e in list(read_events(output))[since:] if e["event"] == "step"]


def _trained(recipe: Path, folder: Path, values: dict, steps: int, node) -> dict:
    """The two rehearsals and what they left: the training rows' records."""
    whole, stopped = folder / "outputs" / "uninterrupted", folder / "outputs" / "interrupted"
    logs, draws = folder / "logs", folder / "draws"
    print(f"training: {steps} steps uninterrupted, then stopped by SIGUSR1 and resumed")
    # The reference only draws prompts (the sampler does not depend on who generates): it
    # generates in the trainers, and one vLLM server start (minutes on a busy CPU) is saved.
    server = values.get("use_vllm") and values.get("vllm_mode") == "server"
    extra = ("--use_vllm", "false") if server else ()
    if server:
        print("  the uninterrupted reference generates in the trainers (--use_vllm false)")
    rc = _launch(recipe, whole, logs / "uninterrupted", _env(draws / "uninterrupted"), None, extra)
    if rc != 0:
        return {"resume": {"error": _failed("the uninterrupted rehearsal", rc, logs)}}
    stop_code = _launch(recipe, stopped, logs / "first", _env(draws / "first"), 1)
    saved = [c.step for c in list_checkpoints(stopped) if c.complete]
    if stop_code != 85 or not saved:
        return {"resume": {"error": _failed("the stopped attempt", stop_code, logs, 85)}}
    before = sum(1 for _ in read_events(stopped))
    env = _env(draws / "resumed", failpoint=True)
    rc = _launch(recipe, stopped, logs / "resumed", env, None)
    if rc != 0:
        return {"resume": {"error": _failed("the resumed attempt", rc, logs)}}
    events = _step_events(stopped)  # both attempts: every step, with the recipe's server
    resumed = _step_events(stopped, before)
    found = {
        "resume": {
            "stop_code": stop_code,
            "saved_step": saved[-1],
            "first_resumed_step": min((int(e["step"]) for e in resumed), default=None),
            "pieces_saved": _saved_pieces(stopped / f"checkpoint-{saved[-1]}"),
            "pieces_restored": _restored_pieces(logs / "resumed"),
            "draws_uninterrupted": _draws(draws / "uninterrupted"),
            "draws_resumed": _draws(draws / "resumed"),
        },
        "rundir": _rundir(stopped, logs / "resumed", steps),
    }
    found.update(_training_records(events, values, node))
    return found


def _failed(what: str, rc, logs: Path, wanted: int = 0) -> str:
    code = "ran out of time" if rc is None else f"exited {rc} (expected {wanted})"
    return f"{what} {code}: see {logs}/*/launcher.out and the train logs beside it"


def _saved_pieces(checkpoint: Path) -> list[str]:
    import torch  # deferred: seconds

    path = checkpoint / "registered_state-0.pt"
    if not path.is_file():
        return []
    return sorted(torch.load(path, weights_only=True).get("pieces", {}))


def _restored_pieces(logs: Path) -> list[str] | None:
    for log in sorted(logs.glob("*.log")):
        for line in log.read_text(errors="replace").splitlines():
            if "Restored trainer state [" in line:
                names = line.split("Restored trainer state ", 1)[1].rsplit(" from ", 1)[0]
                return sorted(ast.literal_eval(names))
    return None


def _draws(folder: Path) -> dict:
    """{step: {process: [prompt hashes, in order]}} of what the probe reward recorded."""
    found: dict = {}
    for path in sorted(folder.glob("draws-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            # the step a batch trains: TRL's global step when it was generated, + 1
            per = found.setdefault(str(int(entry["step"]) + 1), {})
            per.setdefault(str(entry["process"]), []).extend(entry["prompts"])
    return found


def _rundir(output: Path, logs: Path, steps: int) -> dict:
    """What the docs say a run leaves: its events, its checkpoints and a `runs` line (asked of
    `maxent-grpo runs --json`, the command a user would ask)."""
    command = [sys.executable, "-m", "maxent_grpo.cli", "runs", "--json"]
    command += ["--dir", str(output.parent), "--dir", str(logs)]
    try:
        listed = subprocess.run(command, capture_output=True, text=True, timeout=120)
        runs = [r for r in json.loads(listed.stdout) if r.get("run") == output.name]
    except (subprocess.TimeoutExpired, ValueError):
        runs = []
    final = [c for c in list_checkpoints(output) if c.complete and c.step == steps]
    return {
        "output_dir": str(output),
        "found": {
            "events.jsonl": (output / "events.jsonl").is_file(),
            f"checkpoint-{steps} (complete)": bool(final),
            "runs line": bool(runs) and runs[0].get("step") == steps,
        },
    }


def _training_records(events: list[dict], values: dict, node) -> dict:
    """Rewards, tools and pushes as the uninterrupted rehearsal's step events logged them."""
    metrics = [e.get("metrics") or {} for e in events]
    failures, spread = {}, {}
    for m in metrics:
        for key, value in m.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "rewards" and parts[2] == "failures":
                failures[parts[1]] = failures.get(parts[1], 0) + value
            if len(parts) == 3 and parts[0] == "rewards" and parts[2] == "std":
                spread[parts[1]] = spread.get(parts[1], False) or bool(value and value > 0)
    found: dict = {
        "training_failures": failures,
        "spread": spread,
        "zero_std": [m["frac_reward_zero_std"] for m in metrics if "frac_reward_zero_std" in m],
    }
    out: dict = {"rewards_training": found}
    if values.get("tools") or values.get("environment"):
        calls = [m["tools/call_frequency"] for m in metrics if "tools/call_frequency" in m]
        out["tools_training"] = {"calls_per_completion": sum(calls) / len(calls) if calls else 0}
    if values.get("use_vllm") and values.get("vllm_mode") == "server":
        out["push"] = _push(metrics)
    elif node is not None and not node.vllm and values.get("vllm_mode") == "server":
        why = "not run: no vLLM CPU server in this rehearsal (no vLLM CPU build, or --no-server)"
        out["push"] = {"skipped": why}
    return out


def _push(metrics: list[dict]) -> dict:
    diffs = [m[k] for m in metrics for k in ["sampling/sampling_logp_difference/max"] if k in m]
    syncs = sum(1 for m in metrics if "vllm/weight_sync_seconds" in m)
    if not diffs:
        return {
            "skipped": "TRL logged no logprob comparison (vllm_importance_sampling_correction"
            " is off)"
        }
    return {"syncs": syncs, "max_logp_diff": diffs, "tolerance": TOLERANCE}


def rehearse_first(request, args) -> int:
    """`sbatch|submit|sweep --rehearse`: the rehearsal for the requested allocation; non-zero
    when a row fails (then nothing is queued)."""
    code = main(request, args.gpus, args.nodes, args.rehearse_steps, None)
    if code:
        print(
            f"not queued: the rehearsal of {request.recipe} failed (the fix lines above)",
            file=sys.stderr,
        )
    return code
