"""One attempt of a run in this allocation: (server) -> accelerate launch -> wait -> outcome.

training.sh (local or under sbatch), the submitit launcher and `maxent-grpo run` all run one
`Attempt` of a request prepared by launch/launcher.py. Effects live here (processes, signals,
files, the run's event log); how it ends (outcome, requeue) in launch/finish.py, the outcome
rules in launch/outcomes.py, the stop and checkpoint files in rundir/checkpoints.py.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from maxent_grpo.errors import EXIT_USER_ERROR, UserError
from maxent_grpo.faults import failpoint
from maxent_grpo.launch import attempt_phase as phase
from maxent_grpo.launch.attempt_phase import (
    CHECKPOINT,
    FORCE,
    NOTE,
    PREPARING,
    STOP_ASKED,
    STOP_NOW,
    asks_about_nodes,
    signal_event,
    transition,
)
from maxent_grpo.launch.finish import Ending
from maxent_grpo.launch.init_from import with_init
from maxent_grpo.launch.launcher import Prepared, RunRequest, prepare
from maxent_grpo.launch.outcomes import (
    STOP_CLASSES,
    Outcome,
    crash_outcome,
    log_tail,
    node_failed,
    previous_outcome,
)
from maxent_grpo.launch.overrides import server_environ
from maxent_grpo.launch.plan import Plan
from maxent_grpo.launch.processes import STOP_WITH_PARENT, Child
from maxent_grpo.launch.resume import (
    changed_keys,
    check_max_steps,
    refuse_changes,
    settings_of,
    with_recorded,
)
from maxent_grpo.launch.reward_server import RewardModelServer
from maxent_grpo.launch.server import launch_server
from maxent_grpo.launch.server_group import launch_servers
from maxent_grpo.launch.slurm import (
    job_record,
    slurm_job,
    user_error_marker,
)
from maxent_grpo.launch.stacks import stop_hung
from maxent_grpo.launch.watch import Watched, crash_grace_s, watch_training
from maxent_grpo.launch.watchdog import Watchdog
from maxent_grpo.rundir.checkpoints import (
    clear_run_complete,
    clear_stop_request,
    last_complete_checkpoint,
    request_stop,
    run_is_complete,
    stop_requested,
)
from maxent_grpo.rundir.events import emit, events_path
from maxent_grpo.rundir.heartbeat import clear_heartbeats, heartbeat_dir
from maxent_grpo.rundir.settings import RunSettings, read_settings, write_settings
from maxent_grpo.server_auth import new_token, with_token
from maxent_grpo.vllm_health import ServerError, ServerWaitCancelled

# How long the trainers may take to finish a step and save after a SIGTERM reached every
# process (Slurm preemption, scancel): torchrun's agent waits this long before it SIGKILLs
# its workers (TORCH_ELASTIC_SHUTDOWN_TIMEOUT, unless set), and so does the launcher.
STOP_DRAIN_S = 300


def declared_output_dir(request: RunRequest) -> Path | None:
    """The output_dir a request names, read without parsing: even a broken recipe has one."""
    if request.run_name:
        return Path("outputs") / request.run_name
    overrides = list(request.overrides)
    for i, arg in enumerate(overrides):
        if arg.startswith("--output_dir="):
            return Path(arg.split("=", 1)[1])
        if arg == "--output_dir" and i + 1 < len(overrides):
            return Path(overrides[i + 1])
    try:
        output_dir = yaml.safe_load(Path(request.recipe).read_text()).get("output_dir")
        return Path(output_dir) if output_dir else None
    except Exception:  # noqa: BLE001 - an unreadable recipe names no output_dir
        return None


def _output_name(request: RunRequest) -> str:
    """The run name of a request (its output_dir's name), even from a broken recipe."""
    output_dir = declared_output_dir(request)
    return (output_dir.name if output_dir else "") or Path(request.recipe).stem


def log_path(logs_dir: Path, run_name: str, role: str, environ=os.environ) -> Path:
    """logs/<run>_<jobid>_<time>_<role>.log: one file per attempt, never truncated."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    parts = [run_name, f"job{job}" if job else None, stamp, role]
    return Path(logs_dir) / ("_".join(p for p in parts if p) + ".log")


class _Signals:
    """Route SIGUSR1/SIGTERM/SIGINT to the attempt while it runs: what each does in each of
    the attempt's states is launch/attempt_phase.py's table; here, its effects."""

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self, attempt: Attempt):
        self.attempt = attempt
        self._previous = {}

    def __enter__(self):
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, _frame):
        attempt = self.attempt
        failed = asks_about_nodes(attempt.state, signum) and attempt.node_failed()
        for action in attempt.move(signal_event(signum, failed)):
            self._do(action, signum)

    def _do(self, action: str, signum: int) -> None:
        attempt, name = self.attempt, signal.Signals(signum).name
        if action == NOTE:  # training is over: nothing to checkpoint or stop
            print(f"{name} received after training ended", flush=True)
            attempt.late_signal = signum
        elif action == FORCE:
            print(f"{name} again: stopping everything now", flush=True)
            attempt.forced = name
            if attempt.trainer is not None:
                attempt.trainer.mute()  # the log keeps the killed processes' tracebacks
            attempt.abort()
        elif action == STOP_NOW:
            # Slurm ends the job for a failed node and SIGKILLs what is left after KillWait;
            # the ranks cannot checkpoint without their peer: stop them now, record the outcome.
            print(f"{name} received: a node of the job failed; stopping training now", flush=True)
            attempt.request_stop(f"{name} received", signum)
            attempt.abort(grace=1)
        else:
            print(f"{name} received: checkpointing at the next step boundary", flush=True)
            attempt.request_stop(f"{name} received", signum)

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


# Held while the state changes (the stop signals and submitit's checkpoint signal), so that a
# handler's own transition cannot fall between the read of the state and its write.
_HELD_SIGNALS = {*_Signals.HANDLED, signal.SIGUSR2}


class Attempt:
    """One attempt of a training run in this allocation: run() returns the exit code.

    Its flow is launch/attempt_phase.py's table: `state` moves only by `move(event)`, and the
    methods below carry out the actions the table names (one method per action, ACTIONS).
    requeue_on_stop: after a graceful stop under Slurm, `scontrol requeue` this job (or
    array task). The submitit launcher turns it off for the stops submitit asks for (it
    requeues those by itself).
    Writes the run's event log (rundir/events.py): attempt_start, plan, stop_request, outcome.
    """

    def __init__(self, request: RunRequest, environ=os.environ, requeue_on_stop: bool = True):
        self.request = request
        self.environ = environ
        self.requeue_on_stop = requeue_on_stop
        self.state = PREPARING
        self.ending: Ending | None = None  # launch/finish.py's, once output_dir is known
        self.job = slurm_job(environ)
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None
        self.late_signal: int | None = None  # a stop signal that came while finishing
        self.forced: str | None = None  # the repeated signal that stopped everything at once
        self.output_dir: Path | None = None
        self.train_log: Path | None = None
        self.trainer: Child | None = None
        self.server = None
        self.reward_server = None  # reward_model_gpus: launch/reward_server.py
        # What the actions hand each other along the flow.
        self.marker: Path | None = None  # the array's user-error marker (launch/slurm.py)
        self.prepared: Prepared | None = None
        self.previous: dict | None = None  # the previous attempt's outcome
        self.watched = Watched(None)  # how the wait for training ended
        self.error: UserError | None = None  # the user error, or the server killed at start
        self.outcome: Outcome | None = None
        self.code: int | None = None  # the exit code
        self.run_name = ""
        self._started_at = 0.0

    @property
    def requeued(self) -> bool:
        """Whether the job runs again (Slurm requeued it, or accepted our requeue)."""
        return self.ending is not None and self.ending.requeued

    def move(self, event: str) -> tuple[str, ...]:
        """Take the table's transition for `event`; returns the actions it names. The stop
        signals are held meanwhile: a handler's own move then cannot be overwritten."""
        held = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
        try:
            self.state, actions = transition(self.state, event)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        return actions

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Graceful stop: the trainers save a complete checkpoint and exit."""
        first = self.stop_reason is None
        if first:
            self.stop_reason, self.stop_signal = reason, signum
        if self.output_dir is not None:
            try:
                request_stop(self.output_dir, reason)
            except OSError as exc:  # a signal handler must not raise into the wait loop
                print(f"warning: cannot write the stop request: {exc}", flush=True)
            if first:
                emit(self.output_dir, "stop_request", reason=reason)

    def ask_stop(self, reason: str, signum: int | None = None) -> None:
        """A graceful stop asked in this process (a signal before the handlers, submitit)."""
        if CHECKPOINT in self.move(STOP_ASKED):
            self.request_stop(reason, signum)

    def abort(self, grace: float = 5) -> None:
        """Immediate stop: every process of the run, now."""
        for child in (self.trainer, self.server, self.reward_server):
            if child is not None:
                child.stop(grace=grace)

    def node_failed(self) -> bool:
        """Whether Slurm reports a failed node of this job (srun's line, the job's record)."""
        if self.job is None or self.train_log is None:
            return False
        return node_failed(log_tail(self.train_log), job_record(self.job, timeout=2))

    def stop_gracefully(self, reason: str, timeout: float) -> None:
        """Ask for a checkpoint, wait up to `timeout` s for the trainers, then stop all."""
        self.ask_stop(reason)
        # The whole tree: workers may outlive accelerate's launcher while they save.
        if self.trainer is not None and not self.trainer.wait_group(timeout, poll=0.5):
            print(f"trainers still running after {timeout:g}s; stopping them", flush=True)
        self.abort()

    def run(self, early_signals: Sequence[int] = ()) -> int:
        """early_signals: stop signals that arrived before this process could handle them
        (read once the attempt's own handlers are set, so none falls between the two)."""
        with _Signals(self):
            for signum in early_signals:
                self.ask_stop(f"{signal.Signals(signum).name} received", signum)
            self._drive(self._prepare_run())
            return self.code

    def _drive(self, event: str | None) -> None:
        """Move through the table from `event` until no action names a next event (a
        terminal state): each action's method may return the event that it ended with."""
        while event is not None:
            actions, event = self.move(event), None
            for action in actions:
                event = getattr(self, ACTIONS[action])() or event

    def _prepare_run(self) -> str:
        """The preparing state's work; returns the event it ends with."""
        self.marker = user_error_marker(self.request.logs_dir, self.job)
        if self.marker is not None and self.marker.is_file():
            return phase.MARKED_FAILED  # an earlier task of this array failed for good
        try:
            recorded = self._recorded_settings()
            self.prepared = self._prepare(self.marker)
            self.output_dir = Path(self.prepared.keys.output_dir)
            self.ending = Ending(
                self.job, self.output_dir, self.requeue_on_stop, lambda: self.late_signal
            )
            self._check_resume(self.prepared.keys, recorded)
        except UserError as exc:
            self.error = exc
            return phase.REFUSED
        return phase.ALREADY_COMPLETE if run_is_complete(self.output_dir) else phase.PREPARED

    def _prepare(self, marker: Path | None) -> Prepared:
        """prepare(), leaving a user error where later attempts and `maxent-grpo runs` see it.
        init_from is resolved here, at job start (launch/init_from.py)."""
        self.init_from = None
        try:
            self.request, self.init_from = with_init(self.request)
            return prepare(self.request, self.environ)
        except UserError as exc:
            if marker is not None:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"{exc}\n")
            # A start refused before anything ran (a flag typo, a missing file) leaves no run
            # behind: the line above is all there is. A run that exists already gets the error
            # where `maxent-grpo runs` looks: its event log and a train log of this attempt.
            if not self._run_exists():
                raise
            self._emit_user_error(str(exc))
            name = self.request.run_name or _output_name(self.request)
            error_log = log_path(self.request.logs_dir, name, "train", self.environ)
            error_log.parent.mkdir(parents=True, exist_ok=True)
            with open(error_log, "a") as log:
                log.write(f"error: {exc}\n")
            raise

    def _say_marked(self) -> None:
        # Retrying cannot fix it: the same line, exit 2.
        print(f"error: {self.marker.read_text().strip()}", file=sys.stderr)
        self.code = EXIT_USER_ERROR

    def _say_complete(self) -> None:
        print(f"{self.output_dir} already holds a completed run; nothing to do.")
        self.code = 0

    def _refuse(self) -> None:
        raise self.error

    def _begin(self) -> None:
        """The last attempt's stop request and heartbeats go; this one's start is recorded."""
        clear_stop_request(self.output_dir)  # a request from the previous attempt
        clear_heartbeats(self.output_dir)  # and its heartbeats and exit reports
        self.previous = previous_outcome(self.output_dir)
        self._emit_start(self.prepared.keys, self.prepared.plan)
        if self.init_from is not None:
            source, path = self.init_from
            print(f"init_from {source}: starting from {path}", flush=True)
            emit(self.output_dir, "init_from", source=source, path=str(path))
        print(self.prepared.describe(), flush=True)
        self.run_name = self.request.run_name or self.output_dir.name
        self.train_log = log_path(self.request.logs_dir, self.run_name, "train", self.environ)
        self._started_at = time.monotonic()

    def _record_stop(self) -> None:
        """The stop asked while preparing, written again now that _begin cleared the last
        attempt's stop request and recorded this attempt's start."""
        request_stop(self.output_dir, self.stop_reason)
        emit(self.output_dir, "stop_request", reason=self.stop_reason)

    def _start(self) -> str:
        """Start the servers and trainers and watch them; the event their end is."""
        try:
            self.watched = self._start_and_wait(self.prepared.keys, self.prepared.plan)
        except ServerWaitCancelled as exc:
            print(f"stopped: {exc}", flush=True)
            return phase.START_CANCELLED
        except UserError as exc:
            self.error = exc
            if isinstance(exc, ServerError) and exc.outcome != "user_error":
                return phase.SERVER_KILLED  # killed while starting: retried, not the recipe's
            return phase.START_REFUSED
        except BaseException:  # not an event of the table: stop what runs, then say it
            self._end_processes()
            raise
        watched = self.watched
        if watched.hang is not None:
            return phase.HANG
        if watched.server_died or watched.reward_server_died:
            return phase.SERVER_LOST
        return phase.TRAINERS_EXITED

    def _record_user_error(self) -> None:
        self.ending.emit_outcome("user_error", str(self.error), EXIT_USER_ERROR)

    def _give_up(self) -> str:
        return phase.REFUSED

    def _classify(self) -> str:
        elapsed = time.monotonic() - self._started_at
        if self.forced:  # the exit code is the kill's, not a failure of training
            print(f"training stopped by the second {self.forced} after {elapsed:.1f}s")
        else:
            print(f"training exited with code {self.watched.code} after {elapsed:.1f}s")
        print(f"log: {self.train_log}")
        self.outcome, self.stop_reason = self.ending.classify(
            self.watched, self.previous, self.train_log, self.stop_reason, self.stop_signal
        )
        return phase.CLASSIFIED

    def _classify_crash(self) -> str:
        killed = self.error
        print(f"error: {killed}", file=sys.stderr, flush=True)
        self.outcome = crash_outcome(str(killed), self.previous, killed.outcome)
        return phase.CLASSIFIED

    def _finish(self) -> str:
        """Record the outcome; the job requeued or the failure remembered (launch/finish.py).
        Returns what it did, as the table's event."""
        outcome, max_requeues = self.outcome, self.prepared.keys.max_requeues
        self.code = self.ending.finish(outcome, max_requeues, self.marker, self.stop_reason)
        if outcome.kind == "completed":
            return phase.RUN_COMPLETED
        if self.ending.requeued:
            return phase.JOB_REQUEUED
        return phase.RUN_STOPPED if outcome.kind in STOP_CLASSES else phase.RUN_FAILED

    def _recorded_settings(self) -> RunSettings | None:
        """The settings this run started with; their overrides go under this request's."""
        output_dir = declared_output_dir(self.request)
        recorded = read_settings(output_dir) if output_dir is not None else None
        if recorded is not None and recorded.overrides:
            print(
                f"{output_dir} started with -- {' '.join(recorded.overrides)}: "
                "kept unless this command sets them",
                flush=True,
            )
        self.request = with_recorded(self.request, recorded)
        return recorded

    def _check_resume(self, keys, recorded: RunSettings | None) -> None:
        """Refuse a change the start did not accept, or a max_steps behind the checkpoint;
        record the settings at the first start and when a change is accepted."""
        changed = changed_keys(recorded, keys) if recorded is not None else []
        if changed and not self.request.accept_changes:
            raise refuse_changes(self.output_dir, changed)
        checkpoint = last_complete_checkpoint(self.output_dir)
        step = int(checkpoint.name.split("-")[-1]) if checkpoint else None
        check_max_steps(self.output_dir, keys.max_steps, step)
        raised = any(key == "max_steps" and new > old for key, old, new in changed)
        if raised and checkpoint is not None and run_is_complete(self.output_dir):
            # A finished run given more steps trains on from its last checkpoint.
            print(f"{self.output_dir}: max_steps raised; training on from {checkpoint}")
            clear_run_complete(self.output_dir)
        if recorded is None or changed:
            write_settings(self.output_dir, settings_of(keys, self.request))

    def _run_exists(self) -> bool:
        """Whether an earlier attempt of this run left its event log."""
        output_dir = declared_output_dir(self.request)
        return output_dir is not None and events_path(output_dir).is_file()

    def _emit_user_error(self, reason: str) -> None:
        output_dir = declared_output_dir(self.request)
        if output_dir is None:
            return  # no output_dir known: the log line is all there is
        try:
            emit(output_dir, "outcome", outcome="user_error", reason=reason, code=2, step=None)
        except OSError:
            pass  # e.g. the unwritable output_dir the error is about

    def _emit_start(self, recipe, plan: Plan) -> None:
        job = self.job
        attempt = job.attempt if job is not None else 0
        emit(
            self.output_dir,
            "attempt_start",
            method=recipe.method,
            recipe=recipe.path,
            job=(job.array_job_id or job.job_id) if job else None,
            attempt=attempt,
            host=socket.gethostname(),
        )
        server = plan.server
        emit(
            self.output_dir,
            "plan",
            device=plan.device,
            train_processes=plan.train.num_processes,
            nodes=list(plan.train.nodes),
            server=server and {"node": server.node, "port": server.port, "device": server.device},
        )

    def _start_and_wait(self, recipe, plan: Plan) -> Watched:
        # The recipe's env: block reaches the run's processes, under the plan's own variables;
        # a fresh token per attempt, which every server started below asks its clients for.
        environ = with_token({**self.environ, **recipe.env}, new_token())
        if self.stop_reason is not None:  # asked to stop before anything started
            return Watched(None)
        crash_grace = crash_grace_s(environ)  # a bad value stops here, before any process
        if plan.reward_model is not None:  # waited for below, while vLLM boots beside it
            reward_log = log_path(
                self.request.logs_dir, self.run_name, "reward_model", self.environ
            )
            self.reward_server = RewardModelServer(plan.reward_model, reward_log, environ).start()
        if plan.server is not None:
            server_log = log_path(self.request.logs_dir, self.run_name, "vllm", self.environ)
            # PYTHONFAULTHANDLER: a hang's SIGABRT prints the server's stacks (stacks.py).
            server_env = {"PYTHONFAULTHANDLER": "1", **server_environ(environ)}
            # Not waited for here: the trainers load the model and data while it boots, and
            # watch_training stops everything if its start-up fails.
            if plan.more_servers:  # vllm_nodes > 1: a server per node, restarted when lost
                event = functools.partial(emit, self.output_dir)
                self.server = launch_servers(plan.servers, server_log, server_env, event)
            else:
                self.server = launch_server(plan.server, server_log, server_env)
        if self.reward_server is not None:  # healthy before the trainers' first scoring
            self.reward_server.wait_until_healthy(cancelled=lambda: self.stop_signal)
        env = {"TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(STOP_DRAIN_S), **environ}
        # STOP_WITH_PARENT: each trainer stops when its parent (accelerate, torchrun) dies.
        env.update({**plan.train.env, "PYTHONUNBUFFERED": "1", STOP_WITH_PARENT: "1"})
        health = tuple(url for server in self.servers() for url in server.hang_urls)
        watchdog = Watchdog(
            heartbeat_dir(self.output_dir),
            plan.train.num_processes,
            recipe.launch.hang_timeout,
            health,
        )
        self.trainer = Child("train", plan.train.command, self.train_log, env=env, echo=True)
        return watch_training(
            self.trainer,
            self.servers(),
            watchdog,
            cancelled=lambda: self.stop_signal,
            crash_grace=crash_grace,
            on_started=lambda: self.move(phase.SERVERS_UP),
        )

    def servers(self) -> tuple:
        """The run's servers that were started: launch/watch.py Servers."""
        return tuple(s for s in (self.server, self.reward_server) if s is not None)

    def _end_processes(self) -> None:
        """Stop whatever of the run is left; after a hang, first dump every stack; after a
        stop request, first let the trainers finish their checkpoint (they may outlive
        accelerate's launcher after a SIGTERM)."""
        failpoint("teardown")
        if self.watched.hang is not None:
            beats = heartbeat_dir(self.output_dir)
            stop_hung(self.watched.hang, self.trainer, self.servers(), self.train_log, beats)
        elif self.trainer is not None and (self.stop_reason or stop_requested(self.output_dir)):
            if not self.trainer.wait_group(STOP_DRAIN_S):
                print(f"trainers still running {STOP_DRAIN_S}s after the stop; stopping them")
        self.abort()


# The method that carries out each action of launch/attempt_phase.py's table (the signal
# actions are _Signals'); a method may return the event it ended with.
ACTIONS = {
    phase.SAY_MARKED: "_say_marked",
    phase.SAY_COMPLETE: "_say_complete",
    phase.REFUSE: "_refuse",
    phase.BEGIN: "_begin",
    phase.RECORD_STOP: "_record_stop",
    phase.START: "_start",
    phase.RECORD_USER_ERROR: "_record_user_error",
    phase.GIVE_UP: "_give_up",
    phase.END_PROCESSES: "_end_processes",
    phase.CLASSIFY: "_classify",
    phase.CLASSIFY_CRASH: "_classify_crash",
    phase.FINISH: "_finish",
}


def run_attempt(request: RunRequest, environ=os.environ, early_signals=()) -> int:
    """Run one attempt of a training job in this allocation; returns the exit code."""
    return Attempt(request, environ).run(early_signals)
