"""Child processes of a run: each in its own process group, logged to a file, always reaped.

Every child is started with start_new_session=True, and stopping it stops every process it
spawned: its process group, and every descendant seen so far wherever it went. A killpg is
not enough: torchrun's agent starts each worker in a session of its own, and a worker whose
agent died is no descendant any more (it is re-parented to init), so the child remembers the
processes of its tree each time it looks (`members()`, called by the launcher's wait loop).
"""

from __future__ import annotations

import ctypes
import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path


def free_port() -> int:
    """A port the OS says is free now (two jobs on one node never pick the same fixed one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    except OSError:
        return None


# Loaded here, not in the child: nothing may be imported between fork and exec.
_LIBC = _libc()
_PR_SET_PDEATHSIG = 1


def _child_signals(stop_signal: int) -> None:
    """In the child, before exec: ignore SIGUSR1/SIGUSR2 (the disposition survives exec), and
    get `stop_signal` when the launcher dies (Linux: PR_SET_PDEATHSIG, kept across exec).

    Slurm's warning signals are for the launcher, which turns them into a checkpoint request;
    their default action would kill accelerate's launcher or vLLM outright. A launcher killed
    with SIGKILL (no handler runs) so still stops its run, gracefully: the SIGTERM reaches
    accelerate's agent, which forwards it to the trainers, which save and exit.

    A child stopped by another signal than SIGTERM (a server: server_child) keeps SIGTERM
    blocked, a mask that exec and every process it spawns inherit, whatever handler they
    install (vLLM installs its own): Slurm's SIGTERM reaches every process of a job it
    requeues, preempts or ends, and a server that stopped on it left the trainers unable to
    end the step they were saving at (bench/chaos.py, seed 5296057401). The launcher stops
    it with `stop_signal` once the trainers are done; Slurm's SIGKILL still ends it.
    """
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    # The stop signal reaches the child whatever the launcher inherited: a shell's `cmd &`
    # ignores SIGINT for it, an ignored or blocked signal survives exec, and a server that
    # ignored its SIGINT stopped only by the SIGKILL after the grace.
    signal.signal(stop_signal, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {stop_signal})
    if stop_signal != signal.SIGTERM:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, stop_signal, 0, 0, 0)


# How the launcher stops a server it runs on its node: SIGINT, which vLLM (its API server,
# engine and workers) and the reward-model server take as they took SIGTERM.
SERVER_STOP = signal.SIGINT
SHELTER = "maxent_grpo.launch.shelter"


def _is_python(program: str) -> bool:
    """An interpreter's path (python, python3.11, the venv's): not a wrapper such as taskset,
    whose own -c (a CPU list) would read as Python's."""
    name = Path(program).name
    return (
        program == sys.executable
        or name.startswith("python")
        and name[6:].strip("0123456789.") == ""
    )


def server_child(name: str, command: tuple[str, ...], log_path: Path, env: Mapping[str, str]):
    """A server's process. A Python program on this node runs under the shelter (SIGTERM
    blocked for good: launch/shelter.py) and is stopped with SERVER_STOP; anything else, a
    server on another node through srun included, is stopped with SIGTERM, which srun
    forwards to its task (one SIGINT only makes srun print the step's state): Slurm's own
    SIGTERM still reaches such a server on its node."""
    if len(command) > 2 and command[1] in ("-m", "-c") and _is_python(command[0]):
        sheltered = (command[0], "-m", SHELTER, *command[1:])
        return Child(name, sheltered, log_path, env=env, stop_signal=SERVER_STOP)
    return Child(name, command, log_path, env=env)


# Set in the trainers' environment by the launcher (launch/attempt.py): each training process
# asks to be stopped when its parent dies (stop_with_parent).
STOP_WITH_PARENT = "MAXENT_GRPO_STOP_WITH_PARENT"


def stop_with_parent(environ=os.environ, signum: int = signal.SIGTERM) -> bool:
    """In a training process the launcher started: `signum` (SIGTERM, a graceful stop at the
    next step boundary) when its parent dies (Linux: PR_SET_PDEATHSIG). Returns whether it
    was asked for.

    The launcher's own parent-death SIGTERM reaches accelerate's launcher only. With two
    ranks, torchrun's agent (which starts its workers from its main thread: the signal fires
    when the thread that forked ends) forwards it to the workers; with one, accelerate's
    simple launcher just dies, and its trainer, re-parented, trained on outside the job
    (seeds 3242996796, 2909567359, 3843838547 under Slurm's proctrack/linuxproc). Off unless
    the launcher asked (STOP_WITH_PARENT): `nohup python src/grpo.py &` must outlive its
    shell. A parent that died before the prctl sends nothing: this process then signals
    itself, as the parent's death would have.
    """
    if environ.get(STOP_WITH_PARENT) != "1" or _LIBC is None:
        return False
    parent = os.getppid()
    if _LIBC.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        return False
    if parent == 1 or os.getppid() != parent:  # re-parented already: no signal will come
        os.kill(os.getpid(), signum)
    return True


class Child:
    """A process group with its output appended to a log file (and optionally echoed).

    Create it from a thread that lives as long as the child (the main thread): the parent-death
    signal fires when the creating thread ends.
    """

    def __init__(
        self,
        name: str,
        command: list[str] | tuple[str, ...],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        echo: bool = False,
        stop_signal: int = signal.SIGTERM,
    ):
        self.name = name
        self.stop_signal = stop_signal
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # Append: a requeued attempt adds to the log instead of truncating it. The child
        # writes to the file itself, never to a pipe of ours: a launcher killed mid-run must
        # not turn every later write of its trainers into a broken pipe (they are saving).
        self._log = open(self.log_path, "ab")
        start = self._log.seek(0, os.SEEK_END)
        self.proc = subprocess.Popen(
            list(command),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            start_new_session=True,
            preexec_fn=functools.partial(_child_signals, stop_signal),
        )
        self._pump = None
        self._done = threading.Event()
        self._muted = threading.Event()
        self._known: dict[int, int] = {}  # pid -> start time of every process seen in the tree
        if echo:
            self._pump = threading.Thread(target=self._echo, args=(start,), daemon=True)
            self._pump.start()

    def _echo(self, offset: int) -> None:
        """Copy what is appended to the log onto our stdout until the child is done."""
        out = sys.stdout.buffer
        with open(self.log_path, "rb") as log:
            log.seek(offset)
            while True:
                finished = self._done.is_set()
                chunk = log.read(1 << 16)
                if chunk and not self._muted.is_set():
                    out.write(chunk)
                    out.flush()
                elif finished:
                    return
                else:
                    time.sleep(0.1)

    def mute(self) -> None:
        """Stop echoing the log (it still gets everything): what a stop the user forced makes
        the children print (torchrun's SignalException traceback) is noise on the terminal."""
        self._muted.set()

    def _end_echo(self) -> None:
        self._done.set()
        if self._pump is not None:
            self._pump.join(timeout=5)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def poll(self) -> int | None:
        return self.proc.poll()

    def stopped(self) -> bool:
        """Whether the leader is stopped (SIGSTOP, a debugger): alive, yet it cannot answer."""
        return self.proc.poll() is None and process_state(self.proc.pid) in ("T", "t")

    def wait_up_to(self, seconds: float) -> int | None:
        """The exit code once the child exits, or None after `seconds` (a poll that returns as
        soon as it exits: a stopped attempt's requeue waits on it)."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def wait(self) -> int:
        code = self.proc.wait()
        self._end_echo()
        return code

    def signal(self, signum: int) -> None:
        """Send `signum` to the group and to every live process of the tree."""
        members = self.members()
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone (PermissionError: only zombies left, on some kernels)
        for pid in members:
            try:
                os.kill(pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def members(self) -> list[int]:
        """Live processes of this child (zombies do not count): its process group, its
        descendants, and the descendants of every process of its tree seen before that is
        still the same process (start time). Workers may outlive the leader, e.g. still saving
        a checkpoint after a SIGTERM, in sessions of their own."""
        table = process_table()
        if table is None:
            return group_members(self.proc.pid)
        roots = [self.proc.pid]
        roots += [pid for pid, start in self._known.items() if table.get(pid, ())[3:4] == (start,)]
        found = set(tree_of(roots, table)) | {
            p for p, row in table.items() if row[2] == self.proc.pid
        }
        for pid in found:
            self._known[pid] = table[pid][3]
        return sorted(pid for pid in found if table[pid][0] != "Z")

    def wait_group(self, timeout: float, poll: float = 0.2) -> bool:
        """Wait up to `timeout` s until no process of the group is left; True if none is."""
        deadline = time.monotonic() + timeout
        while True:
            self.proc.poll()  # reap the leader: a zombie leader would still count in /proc
            if not self.members():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll)

    def stop(self, grace: float = 10.0) -> int | None:
        """`stop_signal` (SIGTERM unless told) to the whole group, then SIGKILL what is left
        after `grace` seconds."""
        if self.proc.poll() is None or self.members():
            self.signal(self.stop_signal)
            self.wait_group(grace)
        # The leader may be gone while its children linger in the group: kill them all.
        self.signal(signal.SIGKILL)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self._end_echo()
        self._log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 20) -> str:
        try:
            data = self.log_path.read_bytes()[-16384:]
        except OSError:
            return ""
        return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


def _stat(pid: str) -> tuple[str, int, int, int] | None:
    """(state, parent, process group, start time) of a process from /proc, None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
    # stime cutime cstime priority nice threads itrealvalue starttime ...": comm may hold
    # spaces and parentheses.
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2]), int(fields[19])


def process_state(pid: int) -> str | None:
    """The state letter of a local process (R, S, D, T for stopped, Z), None when gone."""
    stat = _stat(str(pid))
    return stat[0] if stat is not None else None


def process_table() -> dict[int, tuple[str, int, int, int]] | None:
    """Every process of this machine: pid -> (state, parent, group, start time); None where
    there is no /proc (not Linux)."""
    if not os.path.isdir("/proc"):
        return None
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (stat := _stat(entry)) is not None:
            table[int(entry)] = stat
    return table


def tree_of(roots: list[int], table: Mapping[int, tuple[str, int, int, int]]) -> list[int]:
    """The processes of `table` among `roots` and their descendants."""
    children: dict[int, list[int]] = {}
    for pid, row in table.items():
        children.setdefault(row[1], []).append(pid)
    found, todo = set(), [r for r in roots if r in table]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return sorted(found)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group `pgid` on this machine."""
    table = process_table()
    if table is None:  # not Linux: ask the kernel whether the group exists
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return []
        return [pgid]
    return sorted(p for p, row in table.items() if row[2] == pgid and row[0] != "Z")


def slurm_nodes(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    """The job's node names, in Slurm's order, when the job spans several nodes; else None.

    `scontrol show hostnames` expands a compressed list like "gpu[01-03,07]".
    """
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    count = environ.get("SLURM_JOB_NUM_NODES") or environ.get("SLURM_NNODES") or "1"
    if not nodelist or not count.isdigit() or int(count) < 2:
        return None
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"cannot expand SLURM_JOB_NODELIST={nodelist!r}: {exc}") from None
    return tuple(result.stdout.split()) or None
