"""`maxent-grpo logs RUN`: one attempt's logs, by component, the run's failure line on top.

The launcher writes each attempt's logs as `<run>_[job<ID>_]<YYYYmmdd-HHMMSS>_<component>.log`
(`launch/attempt.py: log_path`): `train` (the trainers), `vllm` (the first vLLM server),
`vllm-server1`, ... (the others of `vllm_nodes`), `-restartN` for a server's restarts, and
`reward_model`. One attempt's files share the job and the time stamp of its start; the last
attempt is the latest stamp. What the attempt ended with is in the run's events
(`outcome`), not in a log: a failed attempt's class and reason are printed first.
"""

from __future__ import annotations

import glob
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.errors import UserError
from maxent_grpo.rundir.events import read_events
from maxent_grpo.runs.state import OUTCOME_STATES

LOG_RE = re.compile(
    r"^(?P<run>.+?)_(?:job(?P<job>\d+)_)?(?P<stamp>\d{8}-\d{6})_(?P<component>[a-z_]+(?:-[a-z0-9]+)*)\.log$"
)
DEFAULT_DIRS = ("outputs", "logs")
FOLLOW_EVERY_S = 0.5
# -f stops once the attempt has its outcome event and its logs stop growing, or when its logs
# have not grown for this long (a launcher killed with SIGKILL writes no outcome).
FOLLOW_QUIET_S = 600.0


@dataclass(frozen=True)
class AttemptLogs:
    run: str
    job: str | None
    stamp: str
    files: dict[str, Path]  # component -> log


def attempts(run: str, dirs: Sequence[Path]) -> list[AttemptLogs]:
    """The run's attempts found in `dirs` (their log files), oldest first."""
    found: dict[tuple[str | None, str], dict[str, Path]] = {}
    for folder in dirs:
        for path in sorted(Path(folder).glob(f"{glob.escape(run)}_*.log")):
            match = LOG_RE.match(path.name)
            if match and match["run"] == run:
                found.setdefault((match["job"], match["stamp"]), {})[match["component"]] = path
    keys = sorted(found, key=lambda key: (key[1], key[0] or ""))
    return [AttemptLogs(run, job, stamp, found[(job, stamp)]) for job, stamp in keys]


def failure_line(output_dir: Path | None) -> str | None:
    """The last attempt's outcome when it is a failure ('failed (crash): ...'), else None."""
    if output_dir is None or not (output_dir / "events.jsonl").is_file():
        return None
    outcome = None
    for event in read_events(output_dir):
        if event["event"] == "attempt_start":
            outcome = None
        elif event["event"] == "outcome":
            outcome = event
    if outcome is None or outcome.get("outcome") in OUTCOME_STATES:
        return None
    return f"failed ({outcome.get('outcome')}): {outcome.get('reason') or 'no reason recorded'}"


def _output_dir(run: str, dirs: Sequence[Path]) -> Path | None:
    for candidate in (Path(run), *(Path(d) / run for d in dirs)):
        if (candidate / "events.jsonl").is_file():
            return candidate
    return None


def choose(run: str, dirs: Sequence[Path], component: str | None) -> tuple[AttemptLogs, list]:
    """The last attempt and the logs to show (one component, or all: train first)."""
    name = Path(run).name
    found = attempts(name, dirs)
    if not found:
        where = ", ".join(str(d) for d in dirs)
        raise UserError(f"logs {run}: no logs of run {name!r} under {where}; give --dir LOGS_DIR")
    last = found[-1]
    if component is None:
        order = sorted(last.files, key=lambda c: (c != "train", c))
        return last, [(c, last.files[c]) for c in order]
    if component not in last.files:
        have = ", ".join(sorted(last.files))
        raise UserError(
            f"logs {run} --component {component}: the last attempt ({last.stamp}) has no such "
            f"log; it has: {have}"
        )
    return last, [(component, last.files[component])]


def main(run: str, dirs: Sequence[str] | None, component: str | None, follow: bool) -> int:
    folders = [Path(d) for d in (dirs or DEFAULT_DIRS)]
    last, shown = choose(run, folders, component)
    output_dir = _output_dir(run, folders)
    if (line := failure_line(output_dir)) is not None:
        print(f"{run}: {line}", flush=True)
    job = f" job {last.job}" if last.job else ""
    for comp, path in shown:
        print(f"===== {comp}: {path} (attempt {last.stamp}{job})", flush=True)
        if not follow:
            sys.stdout.write(path.read_text(errors="replace"))
    if follow:
        _follow([p for _, p in shown], output_dir)
    return 0


def _follow(paths: list[Path], output_dir: Path | None) -> None:
    """Print what the logs gain until the attempt ends (bounded: FOLLOW_QUIET_S of silence)."""
    offsets = dict.fromkeys(paths, 0)
    quiet_since = time.monotonic()
    while True:
        grew = False
        for path in paths:
            with path.open("rb") as handle:
                handle.seek(offsets[path])
                chunk = handle.read()
            if chunk:
                grew, offsets[path] = True, offsets[path] + len(chunk)
                prefix = f"[{path.name}] " if len(paths) > 1 else ""
                text = chunk.decode(errors="replace")
                sys.stdout.write("".join(prefix + line for line in text.splitlines(True)))
                sys.stdout.flush()
        now = time.monotonic()
        if grew:
            quiet_since = now
        elif _ended(output_dir) or now - quiet_since > FOLLOW_QUIET_S:
            return
        time.sleep(FOLLOW_EVERY_S)


def _ended(output_dir: Path | None) -> bool:
    """The last attempt wrote its outcome (a run without events: never, the quiet bound ends)."""
    if output_dir is None or not (output_dir / "events.jsonl").is_file():
        return False
    ended = False
    for event in read_events(output_dir):
        ended = event["event"] == "outcome" or (ended and event["event"] != "attempt_start")
    return ended
