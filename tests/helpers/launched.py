"""A run started through the real launcher, its process tree, and waits on its event log
(imported as `helpers.launched`).

    run = Launched(tmp_path, recipe_path)            # `maxent-grpo run --config ...`
    run.wait_for_step(3)                             # a step event with step >= 3
    for pid in run.tree(): os.kill(pid, SIGTERM)     # every process of the run
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from helpers.paths import MAXENT_GRPO, REPO
from helpers.runs import child_env


def children(pid: int) -> list[int]:
    """Direct children of a process (from /proc/<pid>/task/*/children)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def tree(root: int) -> list[int]:
    """A process and all its descendants (what `ps --forest` shows under it)."""
    pids, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid not in pids:
            pids.append(pid)
            todo += children(pid)
    return pids


def steps(output_dir: Path) -> list[int]:
    """The steps of the run's `step` events so far."""
    try:
        lines = (Path(output_dir) / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "step":
            found.append(int(event["step"]))
    return found


def outcomes(output_dir: Path) -> list[dict]:
    lines = (Path(output_dir) / "events.jsonl").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.strip()]
    return [e for e in events if e["event"] == "outcome"]


class Launched:
    """`maxent-grpo run --config recipe --logs-dir folder/logs [flags]`, or the command `args`
    (which then names its own logs dir), with output in folder/launcher.out."""

    def __init__(self, folder: Path, recipe: Path | None = None, args=None, flags=(), **env: str):
        self.folder = Path(folder)
        self.output = self.folder / "launcher.out"
        logs = ["--logs-dir", str(self.folder / "logs")]
        command = args or [MAXENT_GRPO, "run", "--config", str(recipe), *logs, *flags]
        self.started = time.monotonic()
        with open(self.output, "ab") as out:
            self.proc = subprocess.Popen(
                command, cwd=REPO, env=child_env(**env), stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def logs(self, role: str = "train") -> str:
        return "".join(
            p.read_text(errors="replace") for p in self.folder.glob(f"logs/*_{role}.log")
        )

    def wait_for_step(self, output_dir: Path, step: int, timeout: float = 240) -> list[int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = steps(output_dir)
            if seen and max(seen) >= step:
                return seen
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"the run ended ({self.proc.returncode}):\n{self.text[-3000:]}"
                )
            time.sleep(0.1)
        raise AssertionError(f"no step {step} after {timeout}s:\n{self.text[-3000:]}")

    def tree(self) -> list[int]:
        return tree(self.proc.pid)

    def signal_all(self, signum: int) -> list[int]:
        """The signal to every process of the run at once (as Slurm does); returns the pids."""
        pids = self.tree()
        for pid in pids:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        return pids

    def wait(self, timeout: float = 300) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            for pid in self.tree():
                os.kill(pid, 9)
            raise
