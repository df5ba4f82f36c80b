"""What is on disk for each run: output directories, train log files, live processes.

Read-only and cheap: directory listings, `stat`s, a checkpoint's trainer_state.json by its head
and tail, and (Linux) /proc to see which train logs a live process holds open. Log files are
found by their names (`launch/attempt.py: log_path`) and never read: what happened is in the events.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from maxent_grpo.rundir.checkpoints import CHECKPOINT_MARKER, RUN_MARKER, STOP_REQUEST
from maxent_grpo.rundir.events import EVENTS_FILE

LOG_NAME_RE = re.compile(
    r"^(?P<run>.+?)_(?:job(?P<job>\d+)_)?(?P<stamp>\d{8}-\d{6})_(?P<role>train|vllm)\.log$"
)
_CHECKPOINT_DIR_RE = re.compile(r"^checkpoint-(\d+)$")
# trainer_state.json files larger than this are read by their head and tail only.
SMALL_STATE_BYTES = 16 * 1024
STATE_TAIL_BYTES = 32 * 1024
RUN_FILES = {RUN_MARKER, "trainer_state.json", STOP_REQUEST, "training_args.bin", EVENTS_FILE}


def read_tail(path: str | os.PathLike, nbytes: int) -> str:
    """The last nbytes of a file as text, starting at a line boundary when cut."""
    with open(path, "rb") as handle:
        size = handle.seek(0, os.SEEK_END)
        start = max(0, size - nbytes)
        handle.seek(start)
        data = handle.read()
    if start > 0:
        cut = data.find(b"\n")
        data = data[cut + 1 :] if cut >= 0 else b""
    return data.decode("utf-8", errors="replace")


def mtime(path: str | os.PathLike) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


# --------------------------------------------------------------------------- train logs


@dataclass(frozen=True)
class RunLog:
    """An attempt's train or vLLM server log, known by its name (`launch/attempt.py: log_path`):
    `<run>_[job<ID>_]<YYYYmmdd-HHMMSS>_<train|vllm>.log`, the time when the attempt made it."""

    path: Path
    run: str
    job: str | None
    stamp: str
    role: str
    mtime: float


def parse_log_name(name: str) -> tuple[str, str | None, str, str] | None:
    """(run, job, stamp, role) of a log file name the launcher made, else None."""
    match = LOG_NAME_RE.match(name)
    return (match["run"], match["job"], match["stamp"], match["role"]) if match else None


def open_run_logs() -> set[str] | None:
    """Real paths of the train and vLLM logs some live process of this machine holds open.

    The launcher keeps its attempt's logs open while the server and training run (and a
    trainer whose output is redirected to a log holds it as stdout). None without /proc.
    """
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    found: set[str] = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.endswith(("_train.log", "_vllm.log")):
                found.add(target)
    return found


# --------------------------------------------------------------------------- output dirs


def looks_like_run_dir(names: Iterable[str]) -> bool:
    names = set(names)
    return bool(names & RUN_FILES) or any(_CHECKPOINT_DIR_RE.match(n) for n in names)


@dataclass
class OutputDir:
    path: Path
    names: frozenset[str]
    marker: dict | None = None  # the completion marker's content
    checkpoints: list[tuple[int, bool, float]] = field(default_factory=list)  # step, done, mtime

    @property
    def last_complete(self) -> tuple[int, float] | None:
        done = [(step, when) for step, complete, when in self.checkpoints if complete]
        return max(done) if done else None

    @property
    def stop_requested(self) -> bool:
        return STOP_REQUEST in self.names


def read_output_dir(path: Path, names: Iterable[str] | None = None) -> OutputDir:
    path = Path(path)
    out = OutputDir(path, frozenset(os.listdir(path) if names is None else names))
    if RUN_MARKER in out.names:
        try:
            out.marker = json.loads((path / RUN_MARKER).read_text())
        except (OSError, ValueError):
            out.marker = {}
    for name in out.names:
        if match := _CHECKPOINT_DIR_RE.match(name):
            done = mtime(path / name / CHECKPOINT_MARKER)
            out.checkpoints.append((int(match[1]), done is not None, done or 0.0))
    out.checkpoints.sort()
    return out


@dataclass
class TrainerState:
    """What trainer_state.json says: exact, but written at checkpoints and at the end only."""

    global_step: int | None = None
    max_steps: int | None = None
    reward: float | None = None  # the last logged mean reward
    loss: float | None = None  # the last logged training loss (SFT logs no reward)


_NUMBER = r"(-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|NaN|-?Infinity)"


def read_trainer_state(path: str | os.PathLike) -> TrainerState | None:
    """global_step, max_steps and the last logged reward of a trainer_state.json.

    Long runs log MBs of history: files over SMALL_STATE_BYTES are read by their head and
    tail only. HF writes the JSON with sorted keys and indent=2, so global_step comes before
    log_history and max_steps after it.
    """
    try:
        if os.path.getsize(path) > SMALL_STATE_BYTES:
            with open(path, "rb") as handle:
                head = handle.read(4096).decode("utf-8", errors="replace")
            tail = read_tail(path, STATE_TAIL_BYTES)
            if step := re.search(r'"global_step": (\d+)', head):
                out = TrainerState(global_step=int(step[1]))
                if found := re.search(r'"max_steps": (\d+)', tail):
                    out.max_steps = int(found[1])
                if rewards := re.findall(r'"reward": ' + _NUMBER, tail):
                    out.reward = float(rewards[-1])
                if losses := re.findall(r'"loss": ' + _NUMBER, tail):
                    out.loss = float(losses[-1])
                return out
        state = json.loads(Path(path).read_text())
        history = state.get("log_history") or []
        rewards = [e["reward"] for e in history if "reward" in e]
        losses = [e["loss"] for e in history if "loss" in e]
        return TrainerState(
            state.get("global_step"),
            state.get("max_steps"),
            rewards[-1] if rewards else None,
            losses[-1] if losses else None,
        )
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        return None


def newest_trainer_state(out: OutputDir) -> TrainerState | None:
    """The final trainer state, else the newest complete checkpoint's."""
    paths = []
    if "trainer_state.json" in out.names:
        paths.append(out.path / "trainer_state.json")
    if (last := out.last_complete) is not None:
        paths.append(out.path / f"checkpoint-{last[0]}" / "trainer_state.json")
    states = [s for s in map(read_trainer_state, paths) if s is not None]
    return max(states, key=lambda s: s.global_step or 0, default=None)


def method_from_training_args(out: OutputDir) -> str | None:
    """GRPO, MaxEnt or SFT from training_args.bin without unpickling it.

    torch.save stores the pickle uncompressed; it names the config class by module and name
    (maxent_grpo...GRPOConfig, maxent_grpo...MaxEntConfig, maxent_grpo...SFTConfig).
    """
    paths = [out.path / "training_args.bin"] if "training_args.bin" in out.names else []
    if out.checkpoints:
        paths.append(out.path / f"checkpoint-{out.checkpoints[-1][0]}" / "training_args.bin")
    for path in paths:
        try:
            with open(path, "rb") as handle:
                data = handle.read(256 * 1024)
        except OSError:
            continue
        if b"maxent_grpo.maxent" in data or b"MaxEntConfig" in data:
            return "maxent"
        if b"SFTConfig" in data:
            return "sft"
        if b"GRPOConfig" in data:
            return "grpo"
    return None


# --------------------------------------------------------------------------- discovery


def discover(
    dirs: Sequence[str | os.PathLike],
) -> tuple[dict[str, list[RunLog]], dict[str, OutputDir]]:
    """Logs by run name (oldest first) and output directories by name, under `dirs`.

    A directory given may be one run's output directory, or hold output directories and logs.
    A subdirectory counts as an output directory when it looks like one or is named like a run
    of the logs found.
    """
    logs: dict[str, list[RunLog]] = {}
    outputs: dict[str, OutputDir] = {}
    candidates: list[Path] = []
    for root in map(Path, dirs):
        try:
            entries = list(os.scandir(root))
        except OSError:
            continue
        names = [e.name for e in entries]
        if looks_like_run_dir(names):
            outputs.setdefault(root.name, read_output_dir(root, names))
            continue
        for entry in entries:
            parsed = parse_log_name(entry.name)
            if parsed is not None and entry.is_file():
                log = RunLog(Path(entry.path), *parsed, entry.stat().st_mtime)
                logs.setdefault(log.run, []).append(log)
            elif parsed is None and entry.is_dir():
                candidates.append(Path(entry.path))
    for path in candidates:
        try:
            names = os.listdir(path)
        except OSError:
            continue
        if path.name not in outputs and (looks_like_run_dir(names) or path.name in logs):
            outputs[path.name] = read_output_dir(path, names)
    for found in logs.values():
        found.sort(key=lambda log: (log.stamp, log.mtime))
    return logs, outputs
