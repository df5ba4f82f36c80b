"""The in-allocation launcher: recipe -> checks -> plan -> (server) -> accelerate launch -> wait.

training.sh (local or under sbatch), the submitit launcher and `maxent-grpo run` all call
`launch()`. Effects live here; decisions live in plan.py, configs.py and checkpoints.py.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from maxent_grpo.configs import LaunchArguments
from maxent_grpo.errors import EXIT_CHECKPOINTED, EXIT_USER_ERROR, UserError
from maxent_grpo.launch.plan import (
    Environment,
    LaunchRequest,
    Plan,
    Ports,
    make_plan,
    parse_visible_devices,
)
from maxent_grpo.launch.processes import Child, free_port, slurm_nodes
from maxent_grpo.launch.server import ServerWaitCancelled, start_server, wait_for_training
from maxent_grpo.launch.slurm import requeue, should_requeue, slurm_job, user_error_marker
from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model
from maxent_grpo.train.checkpoints import (
    clear_stop_request,
    last_complete_checkpoint,
    request_stop,
    run_is_complete,
    stop_requested,
)

SRC_DIR = Path(__file__).resolve().parents[2]
METHODS = {"grpo": "grpo.py", "maxent": "maxent-grpo.py"}


def recipe_types(method: str):
    from maxent_grpo import configs

    if method == "maxent":
        from maxent_grpo.maxent.config import MAXENT_TYPES

        return MAXENT_TYPES
    return configs.GRPO_TYPES


@dataclass(frozen=True)
class LaunchOptions:
    recipe: str
    method: str = "grpo"
    run_name: str | None = None
    overrides: tuple[str, ...] = ()
    logs_dir: Path = Path("logs")


def environment_from_os(environ=os.environ) -> Environment:
    """What this job was given, read from CUDA_VISIBLE_DEVICES and Slurm's variables."""
    gpus = parse_visible_devices(environ.get("CUDA_VISIBLE_DEVICES"))
    nodes = (
        tuple(environ.get("MAXENT_GRPO_NODES", "").split())
        or slurm_nodes(environ)
        or ("localhost",)
    )
    return Environment(gpus=gpus, nodes=nodes, python=sys.executable)


def _run_overrides(options: LaunchOptions) -> tuple[str, ...]:
    if not options.run_name:
        return options.overrides
    output_dir = str(Path("outputs") / options.run_name)
    return ("--output_dir", output_dir, "--run_name", options.run_name) + options.overrides


def _request(options: LaunchOptions, values, argv: list[str]) -> LaunchRequest:
    return LaunchRequest(
        recipe=options.recipe,
        entry_script=str(SRC_DIR / METHODS[options.method]),
        use_vllm=values.use_vllm,
        vllm_mode=values.vllm_mode,
        vllm_tensor_parallel_size=values.vllm_tensor_parallel_size,
        num_processes=values.num_processes,
        accelerate_config=values.accelerate_config,
        model=values.model_name_or_path or "",
        max_model_len=values.vllm_max_model_length,
        vllm_gpu_memory_utilization=values.vllm_server_gpu_memory_utilization,
        extra_args=tuple(argv[2:]),
        model_revision=values.model_revision,
        trust_remote_code=values.trust_remote_code,
        vllm_server_device=values.vllm_server_device,
        vllm_weight_sync=values.vllm_weight_sync,
        vllm_server_dtype=values.vllm_server_dtype,
        vllm_server_enforce_eager=values.vllm_server_enforce_eager,
        vllm_server_timeout=values.vllm_server_timeout,
        vllm_server_base_url=values.vllm_server_base_url,
    )


def prepare(
    options: LaunchOptions, environ=os.environ, environment: Environment | None = None
) -> tuple[Plan, tuple]:
    """Everything before a process starts: parse, make the tiny model if asked, plan, check.

    environment: the allocation to plan for (default: this machine's, from environ).
    Raises UserError (one line) for anything wrong with the recipe or the allocation.
    """
    from maxent_grpo.configs import parse_recipe, recipe_values
    from maxent_grpo.preflight import check_launch, check_recipe

    types = recipe_types(options.method)
    argv = ["--config", options.recipe, *_run_overrides(options)]
    values = recipe_values(argv, types)
    if values.model_name_or_path and Path(values.model_name_or_path) == DEFAULT_TINY_MODEL_DIR:
        ensure_tiny_model(DEFAULT_TINY_MODEL_DIR)
    ports = Ports(vllm=free_port(), vllm_group=free_port(), main_process=free_port())
    environment = environment or environment_from_os(environ)
    if values.use_cpu:
        # use_cpu: true trains on CPU even where GPUs are visible (e.g. Slurm's fake GPUs).
        environment = dataclasses.replace(environment, gpus=())
    plan = make_plan(environment, _request(options, values, argv), ports)
    check_argv = argv
    if plan.device == "cpu" or not _cuda_here():
        # A GPU recipe is checked on a login node too: parse it as if on CPU (bf16 etc.).
        check_argv = [*argv, "--use_cpu", "true"]
    parsed = parse_recipe(check_argv, types, world_size=plan.train.num_processes)
    script_args, training_args, model_args = parsed[:3]
    mixture = check_recipe(script_args, training_args, model_args)
    check_launch(next(p for p in parsed if isinstance(p, LaunchArguments)))
    parsed = (dataclasses.replace(script_args, dataset_mixture=mixture), *parsed[1:])
    return plan, parsed


def _cuda_here() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def _output_name(recipe: str) -> str:
    """The run name a recipe would get (its output_dir's name), even from a broken recipe."""
    import yaml

    try:
        output_dir = yaml.safe_load(Path(recipe).read_text()).get("output_dir")
        return Path(output_dir).name or Path(recipe).stem
    except Exception:  # noqa: BLE001 - any unreadable recipe falls back to its file name
        return Path(recipe).stem


def log_path(logs_dir: Path, run_name: str, role: str, environ=os.environ) -> Path:
    """logs/<run>_<jobid>_<time>_<role>.log: one file per attempt, never truncated."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID")
    parts = [run_name, f"job{job}" if job else None, stamp, role]
    return Path(logs_dir) / ("_".join(p for p in parts if p) + ".log")


class _Signals:
    """Route SIGUSR1/SIGTERM/SIGINT to the launch while it runs.

    The first signal asks for a graceful stop (checkpoint at the next step boundary, then
    requeue); a second SIGTERM or SIGINT stops everything at once. A repeated SIGUSR1 is a
    no-op: Slurm may deliver its warning more than once.
    """

    HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self, launch: Launch):
        self.launch = launch
        self._previous = {}

    def __enter__(self):
        for signum in self.HANDLED:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, _frame):
        name = signal.Signals(signum).name
        if self.launch.stop_reason is not None and signum != signal.SIGUSR1:
            print(f"{name} again: stopping everything now", flush=True)
            self.launch.abort()
            return
        print(f"{name} received: checkpointing at the next step boundary", flush=True)
        self.launch.request_stop(f"{name} received", signum)

    def __exit__(self, *exc):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Launch:
    """One attempt of a training run in this allocation: run() returns the exit code.

    requeue_on_stop: after a graceful stop under Slurm, `scontrol requeue` this job (or
    array task). The submitit launcher turns it off: submitit requeues by itself.
    """

    def __init__(self, options: LaunchOptions, environ=os.environ, requeue_on_stop: bool = True):
        self.options = options
        self.environ = environ
        self.requeue_on_stop = requeue_on_stop
        self.job = slurm_job(environ)
        self.stop_reason: str | None = None
        self.stop_signal: int | None = None
        self.output_dir: Path | None = None
        self.trainer: Child | None = None
        self.server = None

    def request_stop(self, reason: str, signum: int | None = None) -> None:
        """Graceful stop: the trainers save a complete checkpoint and exit."""
        if self.stop_reason is None:
            self.stop_reason, self.stop_signal = reason, signum
        if self.output_dir is not None:
            request_stop(self.output_dir, reason)

    def abort(self) -> None:
        """Immediate stop: every process of the run, now."""
        for child in (self.trainer, self.server):
            if child is not None:
                child.stop(grace=5)

    def stop_gracefully(self, reason: str, timeout: float) -> None:
        """Ask for a checkpoint, wait up to `timeout` s for the trainers, then stop all."""
        self.request_stop(reason)
        deadline = time.monotonic() + timeout
        while self.trainer is not None and self.trainer.poll() is None:
            if time.monotonic() > deadline:
                print(f"trainers still running after {timeout:g}s; stopping them", flush=True)
                break
            time.sleep(0.5)
        self.abort()

    def run(self, early_signals: tuple[int, ...] = ()) -> int:
        """early_signals: stop signals that arrived before this process could handle them."""
        with _Signals(self):
            for signum in early_signals:
                self.request_stop(f"{signal.Signals(signum).name} received", signum)
            return self._run()

    def _run(self) -> int:
        marker = user_error_marker(self.options.logs_dir, self.job)
        if marker is not None and marker.is_file():
            # An earlier task of this array found a user error: retrying cannot fix it.
            print(f"error: {marker.read_text().strip()}", file=sys.stderr)
            return EXIT_USER_ERROR
        try:
            plan, parsed = prepare(self.options, self.environ)
        except UserError as exc:
            if marker is not None:
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(f"{exc}\n")
            # Leave the error where `maxent-grpo runs` looks: a train log of this attempt.
            name = self.options.run_name or _output_name(self.options.recipe)
            error_log = log_path(self.options.logs_dir, name, "train", self.environ)
            error_log.parent.mkdir(parents=True, exist_ok=True)
            with open(error_log, "a") as log:
                log.write(f"error: {exc}\n")
            raise
        launch_args = next(p for p in parsed if isinstance(p, LaunchArguments))
        self.output_dir = Path(parsed[1].output_dir)
        if run_is_complete(self.output_dir):
            print(f"{self.output_dir} already holds a completed run; nothing to do.")
            return 0
        clear_stop_request(self.output_dir)  # a request from the previous attempt
        if self.stop_reason is not None:
            request_stop(self.output_dir, self.stop_reason)

        print(plan.describe(), flush=True)
        run_name = self.options.run_name or self.output_dir.name
        train_log = log_path(self.options.logs_dir, run_name, "train", self.environ)
        started = time.monotonic()
        code = None
        try:
            code = self._start_and_wait(plan, run_name, train_log)
        except ServerWaitCancelled as exc:
            print(f"stopped: {exc}", flush=True)
        finally:
            self.abort()
        print(f"training exited with code {code} after {time.monotonic() - started:.1f}s")
        print(f"log: {train_log}")
        return self._outcome(code, launch_args.max_requeues)

    def _start_and_wait(self, plan: Plan, run_name: str, train_log: Path) -> int | None:
        if plan.server is not None:
            server_log = log_path(self.options.logs_dir, run_name, "vllm", self.environ)
            self.server = start_server(
                plan.server, server_log, self.environ, cancelled=lambda: self.stop_signal
            )
        if self.stop_reason is not None:
            return None
        env = {**self.environ, **plan.train.env, "PYTHONUNBUFFERED": "1"}
        self.trainer = Child("train", plan.train.command, train_log, env=env, echo=True)
        return wait_for_training(self.trainer, self.server)

    def _outcome(self, code: int | None, max_requeues: int) -> int:
        assert self.output_dir is not None
        if run_is_complete(self.output_dir):
            print(f"model: {self.output_dir}")
            return 0
        if self.stop_reason is None and stop_requested(self.output_dir):
            self.stop_reason = "stop requested through the stop file"
        if self.stop_reason is None:
            return code if code else 1
        checkpoint = last_complete_checkpoint(self.output_dir)
        print(f"stopped ({self.stop_reason}); resume point: {checkpoint or 'none yet'}")
        if self.requeue_on_stop:
            ok, why = should_requeue(self.job, max_requeues)
            if ok:
                # Said first: Slurm may stop this process as soon as the requeue is accepted.
                print(f"requeueing {self.job.requeue_target}", flush=True)
                result = requeue(self.job)
                if result.returncode != 0:
                    print(f"error: scontrol requeue failed: {result.stderr.strip()}", flush=True)
            else:
                print(f"not requeued: {why}", flush=True)
        return EXIT_CHECKPOINTED


def launch(options: LaunchOptions, environ=os.environ, early_signals=()) -> int:
    """Run one attempt of a training job in this allocation; returns the exit code."""
    return Launch(options, environ).run(early_signals)
