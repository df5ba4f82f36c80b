"""`maxent-grpo runs`: one row per run, from its events and what its output directory holds.

Nothing here starts, asks or changes anything: no Slurm commands, no model imports.
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field

from maxent_grpo.methods import METHODS
from maxent_grpo.rundir.checkpoints import RUN_MARKER
from maxent_grpo.rundir.events import events_path, read_sparse
from maxent_grpo.rundir.ledger import latest_scores, pending
from maxent_grpo.runs.sources import (
    OutputDir,
    RunLog,
    discover,
    mtime,
    newest_trainer_state,
    open_run_logs,
)
from maxent_grpo.runs.state import (
    Attempt,
    age_text,
    decide_state,
    detect_method,
    resume_points,
    split_attempts,
)

# An attempt whose processes cannot be seen from here (under Slurm, on another node) counts as
# running while its events or logs were written this recently.
ACTIVE_WITHIN_S = 15 * 60
REASON_CHARS = 200
COLUMNS = (
    "RUN",
    "METHOD",
    "STATE",
    "JOB",
    "ATT",
    "STEP",
    "REWARD",
    "CHECKPOINT",
    "EVAL",
    "AGE",
    "DETAIL",
)

METHOD_LABELS = {name: method.label for name, method in METHODS.items()}


@dataclass
class RunInfo:
    run: str
    method: str | None = None  # a name of maxent_grpo.methods.METHODS, or None
    state: str = "unknown"
    reason: str = ""
    outcome: str | None = None  # the latest attempt's outcome class, as written
    outcomes: dict[str, int] = field(default_factory=dict)  # attempts per outcome class
    jobs: list[str] = field(default_factory=list)
    attempts: int = 0
    step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    loss: float | None = None  # the last logged training loss: REWARD shows it without a reward
    checkpoint: str | None = None  # newest complete checkpoint directory name
    evals: dict[str, dict] = field(default_factory=dict)  # benchmark -> its newest step, score
    evals_queued: int = 0  # benchmark evaluations queued and not finished
    resumed_from: list[int] = field(default_factory=list)  # one step per resumed attempt
    last_activity: float | None = None  # epoch seconds
    output_dir: str | None = None
    log: str | None = None  # latest train log
    rollouts: str | None = None  # the last step's rollout counts, when filters are on
    time_split: str | None = None  # where the last step's time went (train/step_time.py)
    servers: str | None = None  # vLLM servers lost and back (launch/server_group.py)

    def age(self, now: float) -> float | None:
        return None if self.last_activity is None else max(0.0, now - self.last_activity)

    def to_dict(self, now: float | None = None) -> dict:
        data = asdict(self)
        data["age_s"] = self.age(now if now is not None else time.time())
        return data


class Processes:
    """Which logs live processes of this machine hold open: /proc is scanned once, and only
    for a run whose latest attempt has no outcome."""

    def __init__(self, open_logs: Collection[str] | None | str):
        self._held = None if open_logs == "scan" else open_logs
        self._scanned = open_logs != "scan"
        self.host = socket.gethostname()

    def live(self, logs: Sequence[RunLog], attempt: Attempt | None) -> bool | None:
        """True: a process holds one of the attempt's logs; False: none does and the attempt
        ran on this machine; None: cannot be told from here."""
        if not logs:
            return None
        if not self._scanned:
            self._held, self._scanned = open_run_logs(), True
        if self._held is None:
            return None
        if any(os.path.realpath(log.path) in self._held for log in logs):
            return True
        host = ((attempt and attempt.start) or {}).get("host")
        local = host == self.host if host else all(log.job is None for log in logs)
        return False if local else None


def attempt_logs(logs: Sequence[RunLog], attempt: Attempt | None) -> list[RunLog]:
    """The logs of the latest attempt: those made since its start, else the newest train log."""
    if attempt is not None and attempt.start is not None and "time" in attempt.start:
        # (less a ms: the event's time is rounded to ms, the log's name is cut to the second)
        since = time.strftime("%Y%m%d-%H%M%S", time.localtime(attempt.start["time"] - 0.001))
        return [log for log in logs if log.stamp >= since]
    train = [log for log in logs if log.role == "train"]
    return train[-1:]


def _progress(info: RunInfo, out: OutputDir | None, steps: list[dict]) -> None:
    """STEP, REWARD, CHECKPOINT: the step events first, the trainer state for what they lack."""
    if steps:
        info.step = steps[-1].get("step")
        info.max_steps = steps[-1].get("max_steps")
        info.reward = _last(steps, "reward")
        info.loss = _last(steps, "loss")
        counted = [s["metrics"] for s in steps if "rollouts/rounds" in (s.get("metrics") or {})]
        info.rollouts = _rollouts(counted[-1]) if counted else None
        timed = [s["metrics"] for s in steps if "time/step_s" in (s.get("metrics") or {})]
        info.time_split = time_split(timed[-1]) if timed else None
    if out is None:
        return
    if (last := out.last_complete) is not None:
        info.checkpoint = f"checkpoint-{last[0]}"
    if info.max_steps is None or info.step is None:
        state = newest_trainer_state(out)
        if state is not None:
            if info.step is None or (state.global_step or 0) > info.step:
                info.step, info.reward, info.loss = state.global_step, state.reward, state.loss
            info.max_steps = info.max_steps or state.max_steps
    if info.step is None and out.marker:
        info.step = out.marker.get("global_step")


def _last(steps: list[dict], key: str) -> float | None:
    """The newest step event's value of `key`, among those that logged it."""
    found = [s["metrics"][key] for s in steps if key in (s.get("metrics") or {})]
    return found[-1] if found else None


def _rollouts(metrics: dict) -> str:
    """`rollouts: 3/8 groups kept, 2 rounds, 1 carried` of a step with rollout filters."""
    text = (
        f"rollouts: {metrics['rollouts/groups_kept']:g}/{metrics['rollouts/groups_generated']:g}"
        f" groups kept, {metrics['rollouts/rounds']:g} rounds, "
        f"{metrics['rollouts/carried_in']:g} carried"
    )
    return text + (", skipped" if metrics.get("rollouts/skipped") else "")


TIME_PARTS = (("generation", "gen"), ("rewards", "rewards"), ("training", "train"))
TIME_PARTS += (("sync", "sync"), ("other", "other"))


def time_split(metrics: dict) -> str:
    """`time: 4.1s/step, gen 62% rewards 3% train 30% sync 1% other 4%; busy: trainers 38%,
    server 63%` of a step's `time/*` metrics."""
    step = metrics["time/step_s"] or 1.0
    shares = " ".join(
        f"{short} {metrics.get(f'time/{part}_s', 0) / step:.0%}" for part, short in TIME_PARTS
    )
    busy = (
        [f"trainers {metrics['time/trainer_busy']:.0%}"] if "time/trainer_busy" in metrics else []
    )
    if "time/server_busy" in metrics:
        busy.append(f"server {metrics['time/server_busy']:.0%}")
    text = f"time: {metrics['time/step_s']:.3g}s/step, {shares}"
    return text + (f"; busy: {', '.join(busy)}" if busy else "")


def _attempts(info: RunInfo, attempts: list[Attempt], logs: Sequence[RunLog]) -> None:
    """ATT and JOB: the launcher's attempt_start events, else the train logs' names."""
    started = [a for a in attempts if a.start is not None]
    if started:
        info.attempts = len(started)
        info.jobs = list(dict.fromkeys(a.job for a in started if a.job))
    else:
        train = [log for log in logs if log.role == "train"]
        info.attempts = len(train)
        info.jobs = list(dict.fromkeys(log.job for log in train if log.job))


def run_info(
    name: str,
    logs: Sequence[RunLog],
    out: OutputDir | None,
    now: float,
    active_within: float,
    processes: Processes,
) -> RunInfo:
    """One row: the run's events, output directory and logs put together."""
    events = read_sparse(out.path) if out is not None else []
    attempts = split_attempts(events)
    latest = attempts[-1] if attempts else None
    steps = [e for e in events if e["event"] == "step"]
    info = RunInfo(run=name, output_dir=str(out.path) if out else None)
    _attempts(info, attempts, logs)
    _progress(info, out, steps)
    info.resumed_from = resume_points(events)
    _evaluations(info, events)
    info.servers = server_text(events)
    marker = out.marker if out is not None else None
    info.method = detect_method(marker, latest, steps, out)
    mine = attempt_logs(logs, latest)
    train = [log for log in logs if log.role == "train"]
    info.log = str(train[-1].path) if train else None
    written = [t for t in (out and mtime(events_path(out.path)), *(g.mtime for g in mine)) if t]
    live = None
    if marker is None and (latest is None or latest.outcome is None):
        live = processes.live(mine, latest)
    info.state, info.reason = decide_state(
        marker=marker is not None,
        attempt=latest,
        live=live,
        age=now - max(written) if written else None,
        active_within=active_within,
        stop_requested=out is not None and out.stop_requested,
    )
    if latest is not None and latest.outcome is not None:
        info.outcome = latest.outcome.get("outcome")
    info.outcomes = outcome_counts(attempts)
    info.last_activity = _last_activity(out, written)
    return info


def _evaluations(info: RunInfo, events: list[dict]) -> None:
    """EVAL: each benchmark's newest score (rundir/ledger.py), and the evaluations queued."""
    scores = latest_scores(events)
    info.evals = {name: {"step": step, "score": score} for name, (step, score) in scores.items()}
    info.evals_queued = pending(events)


def server_text(events: list[dict]) -> str | None:
    """DETAIL: how many times the launcher lost a vLLM server and got it back (vllm_nodes >
    1); the trainers' own reports of the same loss (`by: trainer`) are not counted again."""
    kinds = [e["event"] for e in events if e["event"].startswith("server_") and "by" not in e]
    if not kinds:
        return None
    return f"servers: {kinds.count('server_lost')} lost, {kinds.count('server_back')} back"


def outcome_counts(attempts: Sequence[Attempt]) -> dict[str, int]:
    """How many attempts ended with each outcome class (an attempt's last outcome counts)."""
    counts: dict[str, int] = {}
    for attempt in attempts:
        if attempt.outcome is not None:
            kind = str(attempt.outcome.get("outcome"))
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def outcome_text(run: RunInfo) -> str:
    """The latest outcome's class and the state's reason; after several attempts, how many
    ended with each class (`attempts: 2 preempted, 1 hang`)."""
    text, kind = run.reason, run.outcome
    if kind and kind != "completed" and not text.startswith(f"{kind}:"):
        text = f"{kind}: {text}" if text else kind
    if run.attempts > 1 and run.outcomes:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(run.outcomes.items(), key=lambda i: -i[1]))
        text = f"{text} (attempts: {counts})" if text else f"attempts: {counts}"
    return text


def detail_text(run: RunInfo) -> str:
    """DETAIL: outcome_text, then the last step's rollout counts, time split, server events."""
    text = outcome_text(run)
    if run.rollouts:
        text = f"{text}; {run.rollouts}" if text else run.rollouts
    if run.time_split:
        text = f"{text}; {run.time_split}" if text else run.time_split
    if run.servers:
        text = f"{text}; {run.servers}" if text else run.servers
    return text


def _last_activity(out: OutputDir | None, written: list[float]) -> float | None:
    times = list(written)
    if out is not None:
        if (last := out.last_complete) is not None:
            times.append(last[1])
        if out.marker is not None:
            times.append(mtime(out.path / RUN_MARKER) or 0.0)
    if times:
        return max(times)
    return mtime(out.path) if out is not None else None


def collect_runs(
    dirs: Sequence[str | os.PathLike] = ("outputs", "logs"),
    now: float | None = None,
    active_within: float = ACTIVE_WITHIN_S,
    open_logs: Collection[str] | None | str = "scan",
) -> list[RunInfo]:
    """Every run found under `dirs`, newest activity first.

    open_logs: "scan" to look for live processes of this machine holding logs open (Linux
    /proc, only when an attempt has no outcome), the real paths of such logs (tests), or None
    to rely on the time of the last write only.
    """
    now = time.time() if now is None else now
    logs, outputs = discover(dirs)
    processes = Processes(open_logs)
    runs = [
        run_info(name, logs.get(name, []), outputs.get(name), now, active_within, processes)
        for name in sorted(set(logs) | set(outputs))
    ]
    runs.sort(key=lambda r: -(r.last_activity or 0.0))
    return runs


# --------------------------------------------------------------------------- formatting


def _reward(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def _headline(run: RunInfo) -> str:
    """REWARD: the last mean reward; for a run that logs none but a loss (SFT), `loss X`."""
    if run.reward is None and run.loss is not None and run.method not in ("grpo", "maxent"):
        return f"loss {_reward(run.loss)}"
    return _reward(run.reward)


def _jobs(jobs: list[str]) -> str:
    if not jobs:
        return "-"
    if len(jobs) <= 2:
        return ",".join(jobs)
    return f"{jobs[0]},...,{jobs[-1]}"


def _evals(run: RunInfo) -> str:
    """`name score@step` per benchmark, and how many evaluations are still queued."""
    cells = [f"{name} {_reward(e['score'])}@{e['step']}" for name, e in run.evals.items()]
    if run.evals_queued:
        cells.append(f"+{run.evals_queued} queued")
    return ", ".join(cells) or "-"


def table_rows(runs: Sequence[RunInfo], now: float | None = None) -> list[tuple[str, ...]]:
    now = time.time() if now is None else now
    rows = []
    for run in runs:
        step = "-" if run.step is None else str(run.step)
        if run.max_steps:
            step = f"{step}/{run.max_steps}"
        reason = detail_text(run)
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
        method = METHOD_LABELS.get(run.method or "", "?")
        rows.append(
            (run.run, method, run.state, _jobs(run.jobs), str(run.attempts), step)
            + (_headline(run), run.checkpoint or "-", _evals(run), age_text(run.age(now)))
            + (reason,)
        )
    return rows


def format_table(runs: Sequence[RunInfo], now: float | None = None) -> str:
    """A plain-text table, one row per run (no trailing spaces)."""
    rows = [COLUMNS, *table_rows(runs, now)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = []
    for row in rows:
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)
