"""`maxent-grpo runs`: one row per training run, from what the toolkit already writes.

Nothing here starts, asks or changes anything: no Slurm commands, no model imports. A run is
found under the given directories (default `outputs/` and `logs/`) as

- an output directory (`outputs/<run>/`: completion marker, `checkpoint-N/` with their
  completion markers, `trainer_state.json`, `training_args.bin`, the stop-request file), and/or
- its train logs, one per attempt: `<run>_[job<ID>_]<YYYYmmdd-HHMMSS>_train.log`, and
- under Slurm, the launcher's own lines in `slurm_<jobid>.out` ("training exited with code N",
  "log: <train log>", "requeueing <id>", "not requeued: ...", "error: ...").

Only the tail of each log is read (TAIL_BYTES), so a table over hundreds of runs with
multi-GB logs takes well under a second. The state rules are in `decide_state` and in
docs/runs.md.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from maxent_grpo.train.checkpoints import CHECKPOINT_MARKER, RUN_MARKER, STOP_REQUEST

TAIL_BYTES = 32 * 1024  # a log's tail: the exit lines and the last steps' metrics
LONG_TAIL_BYTES = 512 * 1024  # read when the short tail has no step (long tracebacks, noise)
HEAD_BYTES = 256 * 1024
# A Slurm attempt (whose processes run on another node) counts as running while its log was
# written this recently and has no exit line. Local attempts are checked against live processes.
ACTIVE_WITHIN_S = 15 * 60
# trainer_state.json files larger than this are read by their head and tail only.
SMALL_STATE_BYTES = 16 * 1024
STATE_TAIL_BYTES = 32 * 1024

STATES = ("running", "requeued", "completed", "failed", "stopped", "unknown")
METHOD_NAMES = {"grpo": "GRPO", "maxent": "MaxEnt"}

LOG_NAME_RE = re.compile(
    r"^(?P<run>.+?)_(?:job(?P<job>\d+)_)?(?P<stamp>\d{8}-\d{6})_(?P<role>train|vllm)\.log$"
)
SLURM_OUT_RE = re.compile(r"^slurm_(?P<job>\d+)\.out$")
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint-(\d+)$")

# Trainer lines (train log). A rank prefix "[rank1]: " may precede any of them.
_PREFIX = r"^(?:\[rank\d+\]:\s?)?"
_COMPLETE_RE = re.compile(r"maxent_grpo: (?:Training complete|.* already holds a completed run)")
_STOPPED_RE = re.compile(r"maxent_grpo: Stopped on request after step (\d+)")
RESUME_RE = re.compile(r"maxent_grpo: Resuming from (\S*?checkpoint-(\d+))\s*$")
_ERROR_RE = re.compile(_PREFIX + r"(error: .+?)\s*$")
_TRACEBACK_RE = re.compile(_PREFIX + r"Traceback \(most recent call last\):")
_RANK_RE = re.compile(r"^\[rank\d+\]:\s?")
_EXCEPTION_RE = re.compile(r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*)(?::(.*))?$")
_EXCEPTION_SUFFIXES = ("Error", "Exception", "Interrupt", "Exit", "Failure", "Iteration")
_CONTEXT_LINES = ("During handling of the above exception", "The above exception was the direct")
_ELASTIC_EXITCODE_RE = re.compile(
    r"^\s*exitcode\s*:\s*(-?\d+)[^(]*(?:\(pid: \d+\))?\s*(?:\((\w+)\))?"
)
_ROOT_CAUSE_RE = re.compile(r"^Root Cause \(first observed failure\):")
# What accelerate's launcher raises when a training process fails (2+ processes: torch
# elastic's ChildFailedError; 1 process: CalledProcessError): the trainer's own error, if it
# printed one, is the reason, not these.
_WRAPPER_EXCEPTIONS = ("ChildFailedError", "CalledProcessError")
_CALLED_PROCESS_RE = re.compile(
    r"(?:returned non-zero exit status (-?\d+)|died with <Signals\.(\w+): (\d+)>)"
)
_METRIC_ITEM_RE = re.compile(r"'([^']+)': (?:'([^']*)'|([^,}]+))")
# Training progress bar: "  45%|####5     | 9/20 [00:06<00:06,  1.67it/s]" (no label before).
_PROGRESS_RE = re.compile(r"^\s*\d+%\|[^|]*\|\s*(\d+)/(\d+) \[")

# Launcher lines (stdout of `maxent-grpo run`: slurm_<jobid>.out under sbatch).
_EXITED_RE = re.compile(r"^training exited with code (\S+) after")
_LOG_LINE_RE = re.compile(r"^log: (\S+_train\.log)\s*$")
_REQUEUE_RE = re.compile(r"^requeueing (\S+)")
_NOT_REQUEUED_RE = re.compile(r"^not requeued: (.+)$")
_STOP_LINE_RE = re.compile(r"^stopped \((.*)\); resume point: (.+)$")
_MODEL_RE = re.compile(r"^model: (.+)$")
_LAUNCHER_ERROR_RE = re.compile(r"^(error: .+?)\s*$")

REASON_CHARS = 200
KILLED = "killed: the log ends without an exit line (SIGKILL, out of memory, node lost?)"


# --------------------------------------------------------------------------- reading


def read_tail(path: str | os.PathLike, nbytes: int = TAIL_BYTES) -> str:
    """The last nbytes of a file as text, starting at a line boundary when cut."""
    with open(path, "rb") as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        start = max(0, size - nbytes)
        handle.seek(start)
        data = handle.read()
    if start > 0:
        cut = min((i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0), default=-1)
        data = data[cut + 1 :] if cut >= 0 else b""
    return data.decode("utf-8", errors="replace")


def read_head(path: str | os.PathLike, nbytes: int = HEAD_BYTES) -> str:
    with open(path, "rb") as handle:
        return handle.read(nbytes).decode("utf-8", errors="replace")


def segments(text: str) -> list[str]:
    """Lines of a log, with progress-bar redraws (carriage returns) as separate lines."""
    return [s for s in text.replace("\r", "\n").split("\n") if s and not s.isspace()]


# --------------------------------------------------------------------------- log names


@dataclass(frozen=True)
class LogName:
    run: str
    job: str | None
    stamp: str
    role: str


def parse_log_name(name: str) -> LogName | None:
    """`<run>_[job<ID>_]<YYYYmmdd-HHMMSS>_<train|vllm>.log` -> its parts (None otherwise)."""
    match = LOG_NAME_RE.match(name)
    if not match:
        return None
    return LogName(match["run"], match["job"], match["stamp"], match["role"])


# --------------------------------------------------------------------------- train log text


def parse_metrics_line(line: str) -> dict[str, float] | None:
    """The trainer's per-step dict line ({'loss': '0.1', ...}; values are %.4g strings).

    Parsed with a regex, not literal_eval (10x faster); unquoted numbers are accepted too.
    """
    line = line.strip()
    if not (line.startswith("{'") and line.endswith("}")):
        return None
    metrics = {}
    for key, quoted, bare in _METRIC_ITEM_RE.findall(line):
        try:
            metrics[key] = float(quoted or bare)
        except ValueError:
            continue
    return metrics or None


def parse_progress(line: str) -> tuple[int, int] | None:
    """(step, total) of an unlabeled tqdm bar (the training bar), else None."""
    match = _PROGRESS_RE.match(line)
    return (int(match[1]), int(match[2])) if match else None


@dataclass
class LogSummary:
    """What a train log (or its tail) says about one attempt."""

    outcome: str | None = None  # "complete" | "stopped" | "failed" | None (no exit line)
    reason: str | None = None  # failed: the error line / exception line; stopped: its line
    stopped_step: int | None = None
    step: int | None = None  # last training step seen in the progress bar
    max_steps: int | None = None
    reward: float | None = None  # mean reward of the last logged step
    reward_step: int | None = None
    metric_keys: frozenset[str] = frozenset()
    resumed_from: int | None = None  # "Resuming from .../checkpoint-N"
    entry_script: str | None = None  # grpo.py / maxent-grpo.py, when a traceback names it


def _exception_name(body: str) -> str | None:
    """The exception's class name if `body` is the last line of a traceback, else None."""
    match = _EXCEPTION_RE.match(body.strip())
    if not match:
        return None
    name = match[1].rsplit(".", 1)[-1]
    if match[2] is None and not name.endswith(_EXCEPTION_SUFFIXES):
        return None  # a bare word: only exception-like names count
    return name


def summarize_log(text: str) -> LogSummary:
    """Scan a train log's text (usually its tail) for progress, metrics and how it ended."""
    summary = LogSummary()
    stopped: tuple[int, str] | None = None  # (index, line)
    complete_at = -1
    last_error: tuple[int, str] | None = None
    last_exception: tuple[int, str] | None = None
    wrapper_at = -1
    root_exit: tuple[str, str | None] | None = None
    in_traceback: set[str] = set()
    in_root_cause = False
    last_bar: tuple[int, int] | None = None
    train_total: int | None = None
    keys: set[str] = set()
    last_metrics: tuple[str, int | None] | None = None
    maxent_metrics = False
    progress_at = -1

    for index, line in enumerate(segments(text)):
        bar = parse_progress(line)
        if bar is not None:
            progress_at, last_bar = index, bar
            if train_total is None or bar[1] == train_total:
                summary.step, summary.max_steps = bar
            continue
        if line.lstrip().startswith("{'") and "'loss': " in line:
            # Per-step metrics; only the last one is parsed (literal_eval is the slow part).
            progress_at = index
            last_metrics = (line, summary.step if last_bar is None else last_bar[0])
            maxent_metrics = maxent_metrics or "'maxent/" in line
            if last_bar is not None:
                train_total = last_bar[1]
                summary.step, summary.max_steps = last_bar
            continue
        if "maxent_grpo: " in line:
            if match := RESUME_RE.search(line):
                if summary.resumed_from is None:
                    summary.resumed_from = int(match[2])
                continue
            if match := _STOPPED_RE.search(line):
                stopped = (index, line.split("maxent_grpo: ", 1)[1].strip())
                summary.stopped_step = int(match[1])
                continue
            if _COMPLETE_RE.search(line):
                complete_at = index
                continue
        if match := _ERROR_RE.match(line):
            last_error = (index, match[1])
            continue
        rank = _RANK_RE.match(line)
        source = rank[0] if rank else ""  # ranks' tracebacks interleave: one state each
        if _TRACEBACK_RE.match(line):
            in_traceback.add(source)
            continue
        if source in in_traceback:
            body = line[len(source) :]
            if body[:1] in (" ", "\t") or body.startswith(_CONTEXT_LINES):
                if "grpo.py" in body and summary.entry_script is None:
                    found = re.search(r"([\w-]*grpo)\.py", body)
                    if found:
                        summary.entry_script = f"{found[1]}.py"
                continue
            name = _exception_name(body)
            if name is not None:
                in_traceback.discard(source)
                if name in _WRAPPER_EXCEPTIONS:
                    wrapper_at = index
                    if code := _CALLED_PROCESS_RE.search(body):
                        root_exit = (code[1], None) if code[1] else (f"-{code[3]}", code[2])
                else:
                    last_exception = (index, body.strip())
                continue
        if _ROOT_CAUSE_RE.match(line):
            in_root_cause = True
            continue
        if in_root_cause and (match := _ELASTIC_EXITCODE_RE.match(line)):
            root_exit = (match[1], match[2])
            in_root_cause = False

    if last_metrics is not None:
        metrics = parse_metrics_line(last_metrics[0]) or {}
        keys = set(metrics) | ({"maxent/"} if maxent_metrics else set())
        if "reward" in metrics:
            summary.reward, summary.reward_step = metrics["reward"], last_metrics[1]
    summary.metric_keys = frozenset(keys)
    # Training that went on after an error or a traceback was not stopped by it.
    if last_error is not None and last_error[0] < progress_at:
        last_error = None
    if last_exception is not None and last_exception[0] < progress_at:
        last_exception = None
    if wrapper_at < progress_at:
        wrapper_at = -1
    failure_at = max(
        last_error[0] if last_error else -1,
        last_exception[0] if last_exception else -1,
        wrapper_at,
    )
    if complete_at >= 0 and complete_at > failure_at:
        summary.outcome = "complete"
    elif stopped is not None and stopped[0] > max(
        last_error[0] if last_error else -1, last_exception[0] if last_exception else -1
    ):
        # (accelerate's launcher then reports the trainers' exit code 85 as a failure: the
        # ChildFailedError after a stop is not one)
        summary.outcome, summary.reason = "stopped", stopped[1]
    elif last_error is not None:
        summary.outcome, summary.reason = "failed", last_error[1]
    elif last_exception is not None:
        summary.outcome, summary.reason = "failed", last_exception[1]
    elif wrapper_at >= 0 or root_exit is not None:
        code, name = root_exit or ("?", None)
        summary.outcome = "failed"
        summary.reason = f"a training process exited with code {code}" + (
            f" ({name})" if name else ""
        )
    return summary


def summarize_log_file(path: str | os.PathLike) -> LogSummary:
    """summarize_log of a file's tail: TAIL_BYTES, or LONG_TAIL_BYTES when that shows no step."""
    try:
        text = read_tail(path, TAIL_BYTES)
        summary = summarize_log(text)
        if (summary.step is None or summary.reward is None) and len(text) >= TAIL_BYTES // 2:
            summary = summarize_log(read_tail(path, LONG_TAIL_BYTES))
        return summary
    except OSError:
        return LogSummary()


# --------------------------------------------------------------------------- launcher output


@dataclass
class LauncherRecord:
    """The launcher's lines about one finished attempt (from slurm_<jobid>.out)."""

    exit_code: str | None = None
    log: str | None = None  # train log file name
    requeued: str | None = None  # the requeue target
    not_requeued: str | None = None
    stop_line: str | None = None
    completed: bool = False
    error: str | None = None


def parse_launcher_output(text: str) -> tuple[dict[str, LauncherRecord], str | None]:
    """Records keyed by train log file name, and the last error line of the whole text.

    The launcher prints "training exited with code N after Xs", "log: <path>", then one of
    "model: ...", "stopped (...); resume point: ...", "requeueing <id>", "not requeued: ...".
    """
    records: dict[str, LauncherRecord] = {}
    current: LauncherRecord | None = None
    last_error = None
    for line in segments(text):
        line = line.strip()
        if match := _LAUNCHER_ERROR_RE.match(line):
            last_error = match[1]
            if current is not None:
                current.error = match[1]
            continue
        if match := _EXITED_RE.match(line):
            current = LauncherRecord(exit_code=match[1])
            continue
        if current is None:
            continue
        if match := _LOG_LINE_RE.match(line):
            current.log = Path(match[1]).name
            records[current.log] = current
        elif match := _REQUEUE_RE.match(line):
            current.requeued = match[1]
        elif match := _NOT_REQUEUED_RE.match(line):
            current.not_requeued = match[1]
        elif _STOP_LINE_RE.match(line):
            current.stop_line = line
        elif _MODEL_RE.match(line):
            current.completed = True
        else:
            current = None  # the next attempt's output (or anything else) starts
    return records, last_error


# --------------------------------------------------------------------------- output dirs


@dataclass
class StateFileSummary:
    global_step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    reward_step: int | None = None
    metric_keys: frozenset[str] = frozenset()


_NUM_RE = re.compile(r"(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|NaN|-?Infinity)")
_STEP_RE = re.compile(r'"step": (\d+)')


def summarize_trainer_state(path: str | os.PathLike) -> StateFileSummary | None:
    """global_step, max_steps and the last logged mean reward of a trainer_state.json.

    Long runs log MBs of history: files over SMALL_STATE_BYTES are read by their head and
    tail only. HF writes the JSON with sorted keys and indent=2, so global_step comes before
    log_history, max_steps after it, and in each log entry "reward" comes before "step".
    Small files (or ones whose head does not look like that) are parsed whole.
    """
    try:
        if os.path.getsize(path) > SMALL_STATE_BYTES:
            head, tail = read_head(path, 4096), read_tail(path, STATE_TAIL_BYTES)
            if match := re.search(r'"global_step": (\d+)', head):
                out = StateFileSummary(global_step=int(match[1]))
                if match := re.search(r'"max_steps": (\d+)', tail):
                    out.max_steps = int(match[1])
                at = tail.rfind('"reward": ')
                reward = _NUM_RE.match(tail, at + len('"reward": ')) if at >= 0 else None
                step = _STEP_RE.search(tail, at) if reward else None
                if reward and step:
                    out.reward, out.reward_step = float(reward[1]), int(step[1])
                out.metric_keys = frozenset(re.findall(r'"(maxent/[\w/]+)"', tail))
                return out
        state = json.loads(Path(path).read_text())
        history = state.get("log_history") or []
        out = StateFileSummary(state.get("global_step"), state.get("max_steps"))
        keys: set[str] = set()
        for entry in history:
            if "loss" in entry:
                keys.update(entry)
            if "reward" in entry:
                out.reward, out.reward_step = float(entry["reward"]), entry.get("step")
        out.metric_keys = frozenset(keys)
        return out
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def method_from_training_args(path: str | os.PathLike) -> str | None:
    """GRPO or MaxEnt from training_args.bin without unpickling it.

    torch.save stores the pickle uncompressed; it names the config class by module and name
    (maxent_grpo.configs.GRPOConfig, maxent_grpo.maxent.config.MaxEntConfig).
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(256 * 1024)
    except OSError:
        return None
    if b"maxent_grpo.maxent" in data or b"MaxEntConfig" in data:
        return "maxent"
    if b"GRPOConfig" in data:
        return "grpo"
    return None


def looks_like_run_dir(names: Iterable[str]) -> bool:
    names = set(names)
    if names & {RUN_MARKER, "trainer_state.json", STOP_REQUEST, "training_args.bin"}:
        return True
    return any(_CHECKPOINT_DIR_RE.match(n) for n in names)


@dataclass
class OutputDir:
    path: Path
    names: frozenset[str]
    marker: dict | None = None
    checkpoints: list[tuple[int, bool, float]] = field(default_factory=list)  # step, done, mtime

    @property
    def last_complete(self) -> tuple[int, float] | None:
        done = [(step, mtime) for step, complete, mtime in self.checkpoints if complete]
        return max(done) if done else None


def read_output_dir(path: Path, names: Iterable[str] | None = None) -> OutputDir:
    if names is None:
        names = os.listdir(path)
    out = OutputDir(Path(path), frozenset(names))
    if RUN_MARKER in out.names:
        try:
            out.marker = json.loads((path / RUN_MARKER).read_text())
        except (OSError, ValueError):
            out.marker = {}
    for name in out.names:
        match = _CHECKPOINT_DIR_RE.match(name)
        if not match:
            continue
        try:
            mtime = os.stat(path / name / CHECKPOINT_MARKER).st_mtime
            complete = True
        except OSError:
            mtime, complete = 0.0, False
        out.checkpoints.append((int(match[1]), complete, mtime))
    out.checkpoints.sort()
    return out


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


# --------------------------------------------------------------------------- live processes


def open_train_logs() -> set[str] | None:
    """Real paths of *_train.log files some live process of this machine holds open.

    The launcher keeps its attempt's train log open until training exits (and a trainer whose
    output is redirected to a log holds it as stdout). None where /proc cannot be read.
    """
    proc = "/proc"
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except OSError:
        return None
    found: set[str] = set()
    for pid in pids:
        fd_dir = f"{proc}/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.endswith("_train.log"):
                found.add(target)
    return found


# --------------------------------------------------------------------------- the table


@dataclass
class Attempt:
    path: Path
    name: LogName
    mtime: float
    summary: LogSummary | None = None
    launcher: LauncherRecord | None = None


@dataclass
class RunInfo:
    run: str
    method: str | None = None  # "grpo" | "maxent" | None
    state: str = "unknown"
    reason: str = ""
    jobs: list[str] = field(default_factory=list)
    attempts: int = 0
    step: int | None = None
    max_steps: int | None = None
    reward: float | None = None
    checkpoint: str | None = None  # newest complete checkpoint directory name
    last_activity: float | None = None  # epoch seconds
    output_dir: str | None = None
    log: str | None = None  # latest train log

    def age(self, now: float) -> float | None:
        return None if self.last_activity is None else max(0.0, now - self.last_activity)

    def to_dict(self, now: float | None = None) -> dict:
        data = asdict(self)
        data["age_s"] = self.age(now if now is not None else time.time())
        return data


def decide_state(
    *,
    marker: bool,
    latest: Attempt | None,
    live: bool | None,
    now: float,
    active_within: float,
    stop_requested: bool,
    has_checkpoint: bool,
) -> tuple[str, str]:
    """(state, detail) of a run. The rules, in order:

    1. completed: the run's completion marker exists (or the latest log says so).
    2. running: the latest attempt has no exit line and either a live process on this
       machine holds its log open (live=True) or, when that cannot be known here (a Slurm
       attempt, whose processes run on other nodes, or no /proc: live=None), the log was
       written within `active_within` seconds.
    3. requeued: the latest attempt stopped on request and the launcher requeued the job.
    4. stopped: the latest attempt stopped on request (checkpoint saved), not requeued; or no
       log but the stop-request file is there.
    5. failed: the last `error: ...` line, else the last exception line, else the exit code
       of a crashed training process; a log that ends without any exit line and nothing live
       is failed as "killed".
    6. unknown: no train log (e.g. `python src/grpo.py` run in a terminal) and no marker.
    """
    if marker:
        return "completed", ""
    if latest is None:
        if stop_requested:
            return "stopped", "stop requested; no train log found"
        if has_checkpoint:
            return "unknown", "no train log found (started without the launcher?)"
        return "unknown", "no train log found"
    summary = latest.summary or LogSummary()
    record = latest.launcher
    if summary.outcome == "complete" or (record is not None and record.completed):
        return "completed", ""
    if summary.outcome == "stopped" or (record is not None and record.stop_line):
        if record is not None and record.requeued:
            return "requeued", f"requeueing {record.requeued}"
        if record is not None and record.not_requeued:
            return "stopped", f"not requeued: {record.not_requeued}"
        return "stopped", summary.reason or (record.stop_line if record else "") or ""
    if summary.outcome == "failed":
        reason = summary.reason or ""
        if record is not None and record.error and not reason.startswith("error:"):
            reason = record.error
        return "failed", reason
    if record is not None:  # the launcher saw training exit without an exit line in the log
        if record.error:
            return "failed", record.error
        return "failed", f"training exited with code {record.exit_code}"
    age = now - latest.mtime
    if live:
        return "running", "stop requested" if stop_requested else ""
    if live is None and age <= active_within:
        return "running", "stop requested" if stop_requested else f"log written {_age(age)} ago"
    return "failed", KILLED


def _discover(dirs: Sequence[str | os.PathLike]):
    logs: dict[str, list[Attempt]] = {}
    vllm_logs: dict[tuple[str, str | None], list[tuple[str, Path]]] = {}
    launcher_files: list[tuple[Path, str | None]] = []  # (file, job id from the name)
    output_dirs: dict[str, OutputDir] = {}
    candidate_dirs: dict[str, list[Path]] = {}

    def add_output_dir(path: Path, names: list[str]) -> None:
        if path.name not in output_dirs:
            output_dirs[path.name] = read_output_dir(path, names)

    for root in dirs:
        root = Path(root)
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        names = [e.name for e in entries]
        if looks_like_run_dir(names):
            add_output_dir(root, names)
            continue
        for entry in entries:
            name = entry.name
            if entry.is_file():
                parsed = parse_log_name(name)
                if parsed is not None:
                    path = Path(entry.path)
                    if parsed.role == "train":
                        attempt = Attempt(path, parsed, entry.stat().st_mtime)
                        logs.setdefault(parsed.run, []).append(attempt)
                    else:
                        vllm_logs.setdefault((parsed.run, parsed.job), []).append(
                            (parsed.stamp, path)
                        )
                elif match := SLURM_OUT_RE.match(name):
                    launcher_files.append((Path(entry.path), match["job"]))
            elif entry.is_dir():
                if name == "submitit":
                    for job_dir in Path(entry.path).glob("*"):
                        for out in job_dir.glob("*_log.out"):
                            launcher_files.append((out, None))
                    continue
                candidate_dirs.setdefault(name, []).append(Path(entry.path))
    for name, paths in candidate_dirs.items():
        for path in paths:
            try:
                names = os.listdir(path)
            except OSError:
                continue
            if looks_like_run_dir(names) or name in logs:
                add_output_dir(path, names)
                break
    return logs, vllm_logs, launcher_files, output_dirs


def collect_runs(
    dirs: Sequence[str | os.PathLike] = ("outputs", "logs"),
    now: float | None = None,
    active_within: float = ACTIVE_WITHIN_S,
    open_logs: Collection[str] | None | str = "scan",
) -> list[RunInfo]:
    """Every run found under `dirs`, newest activity first.

    open_logs: "scan" to look for live processes of this machine holding train logs open
    (Linux /proc, only when a log lacks an exit line), the real paths of such logs (tests),
    or None to rely on log times only.
    """
    now = time.time() if now is None else now
    logs, vllm_logs, launcher_files, output_dirs = _discover(dirs)

    records: dict[str, LauncherRecord] = {}
    orphan_errors: list[tuple[Path, str | None, str, float]] = []
    known_jobs = {a.name.job for attempts in logs.values() for a in attempts if a.name.job}
    for path, job in launcher_files:
        try:
            text = read_tail(path)
            mtime = path.stat().st_mtime
        except OSError:
            continue
        found, last_error = parse_launcher_output(text)
        records.update(found)
        if not found and last_error and job not in known_jobs:
            orphan_errors.append((path, job, last_error, mtime))

    runs: list[RunInfo] = []
    held: Collection[str] | None = None if open_logs == "scan" else open_logs
    scanned = open_logs != "scan"
    for name in sorted(set(logs) | set(output_dirs)):
        attempts = sorted(logs.get(name, []), key=lambda a: (a.name.stamp, a.mtime))
        out = output_dirs.get(name)
        info = RunInfo(run=name, attempts=len(attempts))
        info.jobs = list(dict.fromkeys(a.name.job for a in attempts if a.name.job))
        latest = attempts[-1] if attempts else None
        activity = [a.mtime for a in attempts[-1:]]
        if latest is not None:
            info.log = str(latest.path)
            latest.summary = summarize_log_file(latest.path)
            latest.launcher = records.get(latest.path.name)
        summary = latest.summary if latest is not None else None

        state_summary = None
        stop_requested = False
        if out is not None:
            info.output_dir = str(out.path)
            stop_requested = STOP_REQUEST in out.names
            last = out.last_complete
            if last is not None:
                info.checkpoint = f"checkpoint-{last[0]}"
                activity.append(last[1])
            candidates = []
            if out.marker is not None:
                activity.append(_mtime(out.path / RUN_MARKER) or 0.0)
            if "trainer_state.json" in out.names:
                candidates.append(out.path / "trainer_state.json")
            if last is not None and not (out.marker is not None and candidates):
                # (a finished run's final state already holds every step)
                candidates.append(out.path / f"checkpoint-{last[0]}" / "trainer_state.json")
            for candidate in candidates:
                found = summarize_trainer_state(candidate)
                if found is not None and (
                    state_summary is None
                    or (found.global_step or 0) > (state_summary.global_step or 0)
                ):
                    state_summary = found

        # Progress: the trainer state (exact), unless the log has seen later steps.
        if state_summary is not None:
            info.step, info.max_steps = state_summary.global_step, state_summary.max_steps
            info.reward = state_summary.reward
        if summary is not None and summary.step is not None:
            if info.step is None or summary.step > info.step:
                info.step = summary.step
                info.max_steps = summary.max_steps or info.max_steps
            if summary.reward is not None and (summary.reward_step or 0) >= (
                (state_summary.reward_step or 0) if state_summary else 0
            ):
                info.reward = summary.reward
        if out is not None and out.marker and info.step is None:
            info.step = out.marker.get("global_step")

        info.method = detect_method(out, state_summary, summary)

        live: bool | None = None
        if latest is not None and summary is not None and summary.outcome is None:
            if not scanned:
                held, scanned = open_train_logs(), True
            if held is not None and os.path.realpath(latest.path) in held:
                live = True
            elif held is not None and latest.name.job is None:
                live = False  # a local attempt: its processes would be visible here
        info.state, info.reason = decide_state(
            marker=out is not None and out.marker is not None,
            latest=latest,
            live=live,
            now=now,
            active_within=active_within,
            stop_requested=stop_requested,
            has_checkpoint=info.checkpoint is not None,
        )
        if info.state == "failed" and latest is not None and not info.reason:
            info.reason = "failed"
        if info.state == "failed" and latest is not None and info.reason.startswith("a training"):
            # The trainer died without a message of its own: the vLLM log may say why.
            # The attempt's server log: started just before its train log.
            started = [
                (stamp, path)
                for stamp, path in vllm_logs.get((name, latest.name.job), [])
                if stamp <= latest.name.stamp
            ]
            if started:
                vllm = max(started)[1]
                try:
                    server = summarize_log(read_tail(vllm))
                except OSError:
                    server = LogSummary()
                if server.outcome == "failed" and server.reason:
                    info.reason = f"{info.reason}; vllm: {server.reason}"
        info.last_activity = max(activity) if activity else (_mtime(out.path) if out else None)
        runs.append(info)

    for path, job, error, mtime in orphan_errors:
        # The launcher failed before training started (a user error under sbatch): the
        # Slurm output is all there is, and it does not name the run.
        runs.append(
            RunInfo(
                run=path.stem,
                state="failed",
                reason=error,
                jobs=[job] if job else [],
                last_activity=mtime,
                log=str(path),
            )
        )
    runs.sort(key=lambda r: -(r.last_activity or 0.0))
    return runs


def detect_method(
    out: OutputDir | None, state: StateFileSummary | None, log: LogSummary | None
) -> str | None:
    """Most reliable first: the completion marker, training_args.bin, then metric names."""
    if out is not None:
        if out.marker and out.marker.get("method") in METHOD_NAMES:
            return out.marker["method"]
        args_files = []
        if "training_args.bin" in out.names:
            args_files.append(out.path / "training_args.bin")
        for step, _complete, _mtime in reversed(out.checkpoints):
            args_files.append(out.path / f"checkpoint-{step}" / "training_args.bin")
            break
        for path in args_files:
            found = method_from_training_args(path)
            if found:
                return found
    keys = set(state.metric_keys if state else ()) | set(log.metric_keys if log else ())
    if any(k.startswith("maxent/") for k in keys):
        return "maxent"
    if "loss" in keys or "reward" in keys:
        return "grpo"
    if log is not None and log.entry_script:
        return "maxent" if log.entry_script == "maxent-grpo.py" else "grpo"
    return None


# --------------------------------------------------------------------------- formatting


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 90:
        return f"{seconds:.0f}s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f}m"
    if seconds < 36 * 3600:
        return f"{seconds / 3600:.0f}h"
    return f"{seconds / 86400:.0f}d"


def _reward(value: float | None) -> str:
    if value is None:
        return "-"
    if math.isnan(value):
        return "nan"
    return f"{value:.4g}"


def _jobs(jobs: list[str]) -> str:
    if not jobs:
        return "-"
    if len(jobs) <= 2:
        return ",".join(jobs)
    return f"{jobs[0]},...,{jobs[-1]}"


COLUMNS = ("RUN", "METHOD", "STATE", "JOB", "ATT", "STEP", "REWARD", "CHECKPOINT", "AGE", "DETAIL")


def table_rows(runs: Sequence[RunInfo], now: float | None = None) -> list[tuple[str, ...]]:
    now = time.time() if now is None else now
    rows = []
    for run in runs:
        step = "-" if run.step is None else str(run.step)
        if run.max_steps:
            step = f"{step}/{run.max_steps}"
        reason = run.reason
        if len(reason) > REASON_CHARS:
            reason = reason[: REASON_CHARS - 3] + "..."
        rows.append(
            (
                run.run,
                METHOD_NAMES.get(run.method or "", "?"),
                run.state,
                _jobs(run.jobs),
                str(run.attempts),
                step,
                _reward(run.reward),
                run.checkpoint or "-",
                _age(run.age(now)),
                reason,
            )
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


def main(
    dirs: Sequence[str] | None = None,
    as_json: bool = False,
    active_within: float = ACTIVE_WITHIN_S,
) -> int:
    now = time.time()
    runs = collect_runs(dirs or ("outputs", "logs"), now=now, active_within=active_within)
    if as_json:
        print(json.dumps([r.to_dict(now) for r in runs], indent=2))
    elif not runs:
        print(f"no runs found under {', '.join(dirs or ('outputs', 'logs'))}")
    else:
        try:
            print(format_table(runs, now), flush=True)
        except BrokenPipeError:  # `maxent-grpo runs | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    return 0
