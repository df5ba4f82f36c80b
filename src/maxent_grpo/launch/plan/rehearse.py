"""A rehearsal's decisions, pure: how a recipe shrinks to this machine, and the passport's rows.

`shrink` takes the recipe's values as they are and changes only what cannot run on a login
node (no GPU, no Slurm), one line per change: the model becomes the tiny local one, the plan two
CPU training processes (a CPU vLLM server where the recipe uses a server and vLLM's CPU build is
installed, synced through the disk instead of NCCL), lengths are capped, a hub dataset the node
cannot reach becomes the built-in one. `passport` turns what the rehearsal recorded (launch/
rehearse.py) into one row per claim, each failing row with the one line that says what to fix.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.tiny_model import CONTEXT

TRAINERS = 2  # CPU training processes of a rehearsal
COMPLETION_CAP = 32  # max_completion_length of a rehearsal (single turn)
EPISODE_CAP = 96  # the same with tools or an environment: every turn and tool result
DATA_ROWS = 64  # rows of the built-in dataset that stands in for an unreachable hub one
PROBE = "maxent_grpo.rewards.rehearsal:record_draws"  # records each step's prompts (None)
_LOCAL_PREFIXES = ("builtin:", "./", "/", "../")


@dataclass(frozen=True)
class Node:
    """What this machine offers a rehearsal."""

    tiny_model: str  # the tiny local model's directory
    vllm: bool  # vLLM's CPU build is installed
    hub: bool  # the hub can be reached
    tool_template: str = ""  # a chat template that renders tool calls (TRL's Qwen2.5 one)


@dataclass(frozen=True)
class Shrunk:
    values: dict
    changes: tuple[str, ...]


def _is_local_source(name: str) -> bool:
    """data/sources.py's rule: builtin, a path prefix, a data file's suffix, or on disk."""
    suffix = Path(name).suffix.lower() in (".json", ".jsonl", ".csv", ".parquet", ".txt")
    return name.startswith(_LOCAL_PREFIXES) or suffix or Path(name).exists()


def shrink(values: dict, node: Node, steps: int) -> Shrunk:
    """The recipe's `values` changed for a rehearsal of `steps` steps on `node`."""
    out = dict(values)
    changes: list[str] = []

    def change(key: str, value, why: str) -> None:
        if out.get(key, None) != value:
            changes.append(f"{key}: {out.get(key)!r} -> {value!r} ({why})")
            out[key] = value

    def drop(key: str, why: str) -> None:
        if key in out:
            changes.append(f"{key}: {out.pop(key)!r} -> removed ({why})")

    if os.path.abspath(str(out.get("model_name_or_path"))) != node.tiny_model:
        change("model_name_or_path", node.tiny_model, "the tiny local model; its tokenizer too")
    if "chat_template" in out:
        changes.append("chat_template: the recipe's own, kept (rendered by the tiny tokenizer)")
    elif (out.get("tools") or out.get("environment")) and node.tool_template:
        out["chat_template"] = node.tool_template
        changes.append(
            "chat_template: the model's -> TRL's qwen2_5.jinja (the tiny tokenizer's own "
            "cannot render tool calls; the recipe's model is not on this disk)"
        )
    drop("model_revision", "a local model")
    drop("init_from", "the rehearsal starts from the tiny model")
    change("dtype", "float32", "CPU")
    _shrink_data(out, node, change, drop)
    _shrink_layout(out, node, change, drop)
    _shrink_batch(out, change)
    tools = bool(out.get("tools") or out.get("environment"))
    cap = EPISODE_CAP if tools else COMPLETION_CAP
    change("max_completion_length", min(int(out.get("max_completion_length") or 256), cap), "cap")
    change("max_steps", steps, "a few steps")
    drop("num_train_epochs", "max_steps rules")
    change("save_strategy", "steps", "checkpoints at the stop signal and the end")
    change("save_steps", steps, "checkpoints at the stop signal and the end")
    for key, value in (("report_to", "none"), ("log_completions", False), ("push_to_hub", False)):
        if key in out:
            change(key, value, "nothing leaves this machine")
    _add_probe(out, changes)
    return Shrunk(out, tuple(changes))


def _shrink_data(out: dict, node: Node, change, drop) -> None:
    name = out.get("dataset_name")
    if not name or _is_local_source(str(name)) or node.hub:
        return
    change("dataset_name", "builtin:arithmetic", "the hub cannot be reached from here")
    for key in ("dataset_config", "dataset_train_split", "dataset_test_split"):
        drop(key, "the built-in dataset")
    change("dataset_num_rows", DATA_ROWS, "the built-in dataset")
    change("dataset_prompt_column", "problem", "the built-in dataset's column")
    change("dataset_answer_column", "solution", "the built-in dataset's column")


def _shrink_layout(out: dict, node: Node, change, drop) -> None:
    change("num_processes", TRAINERS, "the plan scaled to CPU processes")
    drop("accelerate_config", "plain data parallel over gloo on CPU")
    change("use_cpu", True, "no GPU")
    change("bf16", False, "CPU")
    if "fp16" in out:
        change("fp16", False, "CPU")
    server = out.get("use_vllm") and out.get("vllm_mode") == "server"
    if out.get("use_vllm") and not (server and node.vllm):
        why = "generation in the trainers: no vLLM CPU server here (or --no-server)"
        change("use_vllm", False, why)
        return
    if not server:
        return
    change("vllm_server_device", "cpu", "vLLM's CPU build")
    sync = "lora" if out.get("vllm_weight_sync") == "lora" else "disk"
    change("vllm_weight_sync", sync, "NCCL needs CUDA: weights go through the disk")
    change("vllm_server_dtype", "float32", "the trainer's dtype")
    change("vllm_server_enforce_eager", True, "starts in half the time")
    change("vllm_server_gpu_memory_utilization", 0.1, "of NUMA node 0's memory")
    # At most the tiny model's whole context: a recipe's tool schemas alone
    # can fill 512 tokens; a recipe's own smaller limit is kept (what it would meet itself).
    limit = min(out.get("vllm_max_model_length") or CONTEXT, CONTEXT)
    change("vllm_max_model_length", limit, "the tiny model's context")
    for key in ("vllm_tensor_parallel_size", "vllm_data_parallel_size", "vllm_nodes"):
        drop(key, "one CPU server")


def _shrink_batch(out: dict, change) -> None:
    """A per-device batch of at most one group, that divides into groups on TRAINERS processes
    (TRL's rule: batch x processes x accumulation is a multiple of num_generations)."""
    generations = int(out.get("num_generations") or 8)
    accumulation = int(out.get("gradient_accumulation_steps") or 1)
    batch = int(out.get("per_device_train_batch_size") or 8)
    if batch > generations or (batch * TRAINERS * accumulation) % generations:
        change("per_device_train_batch_size", generations, f"groups of {generations} on 2 CPUs")
    for key in ("generation_batch_size", "steps_per_generation"):
        if key in out:
            change(key, None, "follows the rehearsal's batch")
            out.pop(key)


def _add_probe(out: dict, changes: list[str]) -> None:
    funcs = list(out.get("reward_funcs") or [])
    out["reward_funcs"] = [*funcs, PROBE]
    if out.get("reward_weights") is not None:
        out["reward_weights"] = [*out["reward_weights"], 1.0]
    changes.append(
        f"reward_funcs: + {PROBE} (records the prompts of each step; scores None, which "
        "TRL leaves out of the sum)"
    )


# --- the passport ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One claim: passed (True), failed (False) or not applicable (None), what was seen, and
    for a failure the one line that says what to fix."""

    name: str
    ok: bool | None
    seen: str
    fix: str = ""

    def as_json(self) -> dict:
        return {"row": self.name, "ok": self.ok, "seen": self.seen, "fix": self.fix}


def exit_code(rows: list[Row]) -> int:
    return 1 if any(row.ok is False for row in rows) else 0


def table(rows: list[Row]) -> str:
    width = max(len(row.name) for row in rows)
    mark = {True: "ok  ", False: "FAIL", None: "n/a "}
    lines = [f"{mark[row.ok]}  {row.name:<{width}}  {row.seen}" for row in rows]
    lines += [f"fix: {row.name}: {row.fix}" for row in rows if row.ok is False]
    return "\n".join(lines)


def passport(record: dict) -> list[Row]:
    """The rows of what a rehearsal recorded (launch/rehearse.py writes `record`)."""
    rows = [_check_row(record["check"])]
    makers = (
        ("rewards", _reward_rows),
        ("prompts", _prompt_row),
        ("tools", _tool_row),
        ("sandbox", _sandbox_row),
        ("push", _push_row),
        ("resume", _resume_rows),
        ("rundir", _rundir_row),
    )
    for key, make in makers:
        if key in record:
            made = make(record[key])
            rows += made if isinstance(made, list) else [made]
    return rows


def _check_row(check: dict) -> Row:
    if check.get("error"):
        return Row("check", False, "the recipe fails check", check["error"])
    return Row("check", True, check.get("verdict", "ok"))


def _reward_rows(rewards: dict) -> list[Row]:
    rows = []
    for name, seen in rewards["probe"].items():
        trained = rewards.get("training_failures", {}).get(name, 0)
        what = f"{seen['calls']} scores on {seen['rows']} real rows, {seen['distinct']} distinct"
        if seen["failures"] or trained:
            fix = (
                f"reward {name} raised on {seen['failures']} of {seen['calls']} probe scores and "
                f"{trained:g} training samples ({seen.get('first_error') or 'see the train log'})"
                "; fix it, or return None for a row it cannot score"
            )
            rows.append(Row(f"reward {name}", False, what, fix))
        elif seen["distinct"] == 0:
            fix = f"reward {name} returned None on every row: it scores nothing on this data"
            rows.append(Row(f"reward {name}", False, what, fix))
        elif seen["distinct"] == 1 and not rewards.get("spread", {}).get(name):
            fix = (
                f"reward {name} gave every completion {seen['value']!r}, the reference answers "
                "too, and had no spread in training: it carries no signal; check its columns "
                "and what it parses"
            )
            rows.append(Row(f"reward {name}", False, what, fix))
        else:
            rows.append(Row(f"reward {name}", True, what + ", no exception"))
    shares = rewards.get("zero_std") or []
    if shares:  # a figure, not a verdict: the untrained tiny model often scores all alike
        share = sum(shares) / len(shares)
        seen = f"{share:.0%} over {len(shares)} steps (the untrained tiny model's completions)"
        rows.append(Row("groups without reward spread", None, seen))
    return rows


def _prompt_row(prompts: dict) -> Row:
    seen = (
        f"{prompts['rows']} prompts through the chat template ({prompts['tokenizer']}), "
        f"longest {prompts['longest']} tokens"
    )
    limit = prompts.get("limit")
    if limit is None:
        return Row("prompts fit", True, seen + "; no prompt limit set (vllm_max_model_length)")
    over = prompts["over"]
    seen += f", limit {limit}: {over / max(prompts['rows'], 1):.0%} over"
    if over:
        fix = (
            f"{over} of {prompts['rows']} prompts pass {limit} tokens "
            f"({prompts.get('why', 'the limit')}), the "
            f"longest {prompts['longest']}: shorten the system prompt or chat template, or raise "
            "vllm_max_model_length"
        )
        return Row("prompts fit", False, seen, fix)
    return Row("prompts fit", True, seen)


def _tool_row(tools: dict) -> Row:
    if tools.get("error"):
        return Row("tools", False, "the recipe's tools do not load here", tools["error"])
    called = ", ".join(f"{k}: {v}" for k, v in tools["probe"].items()) or "none to call"
    seen = f"{', '.join(tools['names'])} loaded; one call each ({called})"
    if tools.get("probe_error"):
        return Row("tools", False, seen, tools["probe_error"])
    rate = tools.get("calls_per_completion")
    if rate is not None:
        seen += f"; in training {rate:.2f} calls per completion"
        seen += ", their tokens masked" if tools.get("masked") else " (masking seen only on calls)"
    return Row("tools", True, seen)


def _sandbox_row(sandbox: dict) -> Row:
    if sandbox["ok"]:
        return Row("code sandbox", True, sandbox["seen"])
    return Row("code sandbox", False, sandbox["seen"], sandbox["fix"])


def _push_row(push: dict) -> Row:
    if push.get("skipped"):
        return Row("weight push landed", None, push["skipped"])
    diffs, tolerance = push["max_logp_diff"], push["tolerance"]
    seen = (
        f"{push['syncs']} pushes; server vs trainer logprobs after each: max |diff| "
        f"{max(diffs, default=0.0):.1e} (tolerance {tolerance:g})"
    )
    if not diffs or push["syncs"] < 1:
        return Row(
            "weight push landed",
            False,
            seen,
            "no push and no logprob comparison was "
            "logged: see the vllm log in the rehearsal's logs/",
        )
    bad = [i + 1 for i, d in enumerate(diffs) if d > tolerance]
    if bad:
        fix = (
            f"after the push of step(s) {bad} the server's logprobs are not the trainer's: "
            "the weights did not land (see the vllm log)"
        )
        return Row("weight push landed", False, seen, fix)
    return Row("weight push landed", True, seen)


def _resume_rows(resume: dict) -> list[Row]:
    if resume.get("skipped"):
        return [Row("resume", None, resume["skipped"])]
    if resume.get("error"):
        return [Row("resume", False, "the rehearsal did not run to its end", resume["error"])]
    saved, first = resume["saved_step"], resume["first_resumed_step"]
    rows = []
    seen = f"stopped by SIGUSR1 (exit {resume['stop_code']}) at step {saved}, resumed at {first}"
    if first != saved + 1:
        fix = (
            f"the resumed attempt started at step {first}, not {saved + 1}: it did not resume "
            f"from checkpoint-{saved} (see 'Resuming from' in the resume's train log)"
        )
        rows.append(Row("resume at saved step + 1", False, seen, fix))
    else:
        rows.append(Row("resume at saved step + 1", True, seen))
    pieces, back = resume["pieces_saved"], resume["pieces_restored"]
    if not pieces:
        rows.append(Row("state pieces back", True, "none registered by this recipe"))
    elif back is None or set(back) != set(pieces):
        fix = (
            f"saved trainer state {pieces}, restored {back}: a piece did not come back "
            "(see 'Restored trainer state' in the resume's train log)"
        )
        rows.append(Row("state pieces back", False, f"{len(pieces)} saved", fix))
    else:
        rows.append(Row("state pieces back", True, f"{', '.join(pieces)}"))
    rows.append(_order_row(resume["draws_uninterrupted"], resume["draws_resumed"]))
    return rows


def _order_row(uninterrupted: dict, resumed: dict) -> Row:
    """Each resumed step's prompts (hashes per process) against the uninterrupted run's."""
    steps = sorted(resumed, key=int)
    if not steps:
        return Row(
            "same prompts, same order",
            False,
            "no prompts recorded after the resume",
            "the probe reward recorded nothing: was the rehearsal's recipe changed?",
        )
    differ = [s for s in steps if uninterrupted.get(s) != resumed[s]]
    prompts = sum(len(p) for s in steps for p in resumed[s].values())
    seen = f"{prompts} prompts of steps {steps[0]}-{steps[-1]} against an uninterrupted rehearsal"
    if differ:
        fix = (
            f"the resumed run drew other prompts (or another order) at step(s) "
            f"{[int(s) for s in differ]} than an uninterrupted run: the data order does not "
            "survive a resume"
        )
        return Row("same prompts, same order", False, seen, fix)
    return Row("same prompts, same order", True, seen)


def _rundir_row(rundir: dict) -> Row:
    missing = [what for what, there in rundir["found"].items() if not there]
    seen = ", ".join(rundir["found"]) + f" in {rundir['output_dir']}"
    if missing:
        return Row("run directory", False, seen, f"not where docs/runs.md says: {missing}")
    return Row("run directory", True, seen)
