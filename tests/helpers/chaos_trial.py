"""One chaos trial (bench/chaos.py): a tiny real run, a fault at a moment, recovery as a user
would do it, and the facts the invariants are checked on (helpers.chaos_checks).

The moment is the product's own: a failpoint with the `pause` action (maxent_grpo.faults)
stops the process that reaches it and names it in a hits file; the fault goes in while it
stands there, then it is continued. No sleep decides when a fault comes.

    trial = Trial(seed=7, kind=Kind("grpo", 1), moment="scoring", step=3, fault="sigkill_trainer")
    row = run_trial(trial, folder, references)
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from helpers.chaos_checks import (
    TrialFacts,
    attempts,
    check_trial,
    complete_files,
    intact_steps,
    printed_outcome,
    redone_steps,
    resumed_from,
    same_weights,
)
from helpers.launched import Launched, tree
from helpers.procs import live_processes, wait_until_gone
from helpers.recipes import SMOKE, SMOKE_MAXENT, SMOKE_VLLM, small_recipe, write_recipe
from maxent_grpo.faults import ENV, HITS_ENV
from maxent_grpo.rundir.checkpoints import list_checkpoints, run_is_complete

MAX_STEPS = 6
SAVE_STEPS = 2
HANG_TIMEOUT = 30  # seconds: a stopped process is found hung after this
LAUNCHER_HOLD = 8  # seconds a stopped launcher stays stopped before the user continues it
ATTEMPT_TIMEOUT = 900  # seconds; a loaded 2-core machine runs a 6-step attempt in 60-450 s
MOMENTS = (
    "server_start",
    "generation",
    "weight_push",
    "scoring",
    "optimizer_step",
    "checkpoint_write",
    "evaluation",
    "teardown",
)
POINTS = {"checkpoint_write": "checkpoint_partial"}  # moment -> failpoint, where they differ
TARGETS = ("trainer", "server", "launcher", "reward_server")
SIGNALS = {"sigkill": signal.SIGKILL, "sigterm": signal.SIGTERM, "sigstop": signal.SIGSTOP}
FAULTS = (
    *(f"{s}_{t}" for t in TARGETS for s in SIGNALS),
    "disk_full",
    "out_of_inodes",
    "checkpoint_truncated",
    "checkpoint_file_removed",
    "network_cut",
)


@dataclass(frozen=True)
class Kind:
    method: str = "grpo"  # or maxent
    procs: int = 1
    server: bool = False  # a vLLM CPU server
    async_: bool = False
    reward_server: bool = False
    cluster: str = "none"  # none, 1node, 3node

    @property
    def name(self) -> str:
        parts = [self.method, f"{self.procs}p"]
        parts += ["vllm"] * self.server + ["async"] * self.async_ + ["rm"] * self.reward_server
        return "-".join([*parts, self.cluster])

    @property
    def deterministic(self) -> bool:
        """Same seed, same weights: no server sampling on its own clock."""
        return not self.server


@dataclass(frozen=True)
class Trial:
    seed: int
    kind: Kind
    moment: str
    step: int | None
    fault: str

    @property
    def failpoint(self) -> str:
        point = POINTS.get(self.moment, self.moment)
        return f"{point}:{self.step}:pause" if self.step else f"{point}::pause"


def recipe_keys(kind: Kind, moment: str, fault: str, folder: Path) -> dict:
    keys = dict(max_steps=MAX_STEPS, save_steps=SAVE_STEPS, save_total_limit=2)
    keys.update(num_processes=kind.procs, dataset_num_rows=64, env={"OMP_NUM_THREADS": "1"})
    if kind.server:
        keys.update(max_completion_length=12, vllm_server_timeout=400)  # for a loaded machine
        # 4 completions a trainer, as the campaign's trials were measured (SMOKE_VLLM ships 8
        # on its one trainer).
        keys["per_device_train_batch_size"] = 4
    if moment == "server_start" and fault in ("sigstop_server", "sigstop_reward_server"):
        # A server stopped while it starts is found at vllm_server_timeout (the reward server's
        # too; 1200 s unset): 200 s is over 3x the 59 s vLLM start seen at load 1-3.
        keys["vllm_server_timeout"] = 200
    if kind.async_:
        keys.update(async_generation=True, vllm_importance_sampling_correction=True)
    if kind.reward_server:
        from helpers.reward_models import tiny_classifier

        model = folder.parent / "reward-model"
        if not model.is_dir():
            tiny_classifier(model, tiny_model())
        keys.update(reward_funcs=["answer_match", f"model:{model}"], reward_weights=None)
        keys.update(reward_model_gpus=1)
    if moment == "evaluation":
        keys["benchmarks"] = [{"name": "arithmetic", "num_examples": 2, "max_new_tokens": 4}]
    if fault.startswith("sigstop"):
        keys["hang_timeout"] = HANG_TIMEOUT
    return keys


def tiny_model() -> Path:
    from helpers.paths import REPO
    from maxent_grpo.tiny_model import DEFAULT_TINY_MODEL_DIR, ensure_tiny_model

    return ensure_tiny_model(REPO / DEFAULT_TINY_MODEL_DIR).resolve()


def write_trial_recipe(trial: Trial, folder: Path) -> Path:
    kind = trial.kind
    base = SMOKE_VLLM if kind.server else SMOKE_MAXENT if kind.method == "maxent" else SMOKE
    keys = recipe_keys(kind, trial.moment, trial.fault, folder)
    if kind.server and kind.method == "maxent":
        keys["method"] = "maxent"
    return small_recipe(folder, tiny_model(), base=base, **keys)


# --- the run's processes ------------------------------------------------------------------


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def role(pid: int) -> str | None:
    line = _cmdline(pid)
    if "accelerate.commands.launch" in line:
        return "accelerate"
    if "rewards.model_server" in line:
        return "reward_server"
    if "vllm" in line and "grpo.py" not in line:
        return "server"
    if "grpo.py" in line:
        return "trainer"
    if "maxent-grpo run" in line or "maxent_grpo.cli" in line:
        return "launcher"
    return None


class Watch:
    """Every pid and process group the run has had, seen by polling its tree."""

    def __init__(self, run: Launched):
        self.run, self.pids, self.pgids = run, {}, set()

    def poll(self) -> None:
        for pid in tree(self.run.proc.pid):
            if pid not in self.pids:
                self.pids[pid] = role(pid)
            try:
                group = os.getpgid(pid)
            except OSError:
                continue
            if group != os.getpgid(0):  # the launcher is in the campaign's own group
                self.pgids.add(group)

    def of(self, name: str) -> list[int]:
        """The live processes of a role, read now: a child's command line is its parent's
        until it execs, so a role seen at the fork is no answer."""
        self.poll()
        return [p for p in self.pids if Path(f"/proc/{p}").exists() and role(p) == name]


def read_hits(path: Path) -> list[tuple[int, str]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    return [(int(line.split()[0]), line.split()[1]) for line in lines if line.strip()]


def cont(pids, held: set[int]) -> None:
    for pid in pids:
        if pid not in held:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass


def wait_for_hit(run: Launched, watch: Watch, hits: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        watch.poll()
        if read_hits(hits):
            time.sleep(0.3)  # the other ranks reach the same point
            watch.poll()
            return True
        if run.proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def wait_end(run: Launched, watch: Watch, hits: Path, held: set[int], timeout: float) -> int:
    """Wait for the attempt's end, continuing any process the failpoint stops from now on."""
    deadline = time.monotonic() + timeout
    while run.proc.poll() is None:
        watch.poll()
        cont([pid for pid, _ in read_hits(hits)], held)
        if time.monotonic() > deadline:
            for pid in [run.proc.pid, *watch.pids]:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run.proc.wait(30)
            return -999
        time.sleep(0.1)
    return run.proc.returncode


# --- faults -------------------------------------------------------------------------------

# The faulted attempt's outcome class (launch/outcomes.py) each fault must give; None: no
# outcome event (the launcher itself was killed). After training (evaluation, teardown) a
# fault to the trainers' side finds the run complete.
EXPECTED = {
    "trainer": {"sigkill": ("crash",), "sigterm": ("stopped",), "sigstop": ("hang",)},
    # A server keeps SIGTERM blocked (launch/processes.py SERVER_STOP: Slurm's job-wide
    # SIGTERM must not end it while the trainers save; seed 5296057401): the run goes on.
    "server": {"sigkill": ("crash",), "sigterm": ("completed",), "sigstop": ("hang",)},
    "launcher": {"sigkill": (None,), "sigterm": ("stopped",), "sigstop": ("completed",)},
    "reward_server": {
        "sigkill": ("reward_server_lost",),
        "sigterm": ("completed",),
        "sigstop": ("hang",),
    },
}
AFTER_TRAINING = ("evaluation", "teardown")
# Moments of the last step after a server's last use: the last generation, the last scoring.
AFTER_LAST_USE = {"server": ("scoring", "optimizer_step"), "reward_server": ("optimizer_step",)}


# When a stop request that came at the trial's moment is acted on (train/checkpoints.py
# StopOnRequest): at the end of that step, read there (one rank) or through the ranks' vote,
# cast right after the optimizer_step point; during a checkpoint write (after the step's end)
# at the next step's end. A stop that reaches the ranks through the launcher (its SIGTERM or
# USR1 forwarded, Slurm's preemption or requeue) may arrive after that step's vote or end:
# then one step later (seed 3667576542: a preemption at optimizer_step:5, two ranks, stopped
# at step 6, the run's end; seed 4183528094: a rank's own SIGTERM there stopped at step 5).
FORWARDED_STOPS = ("sigterm_launcher", "slurm_time_limit", "slurm_preempt", "slurm_requeue")


def stop_steps(trial: Trial) -> set[int]:
    """The steps at whose end a stop request that came at the trial's moment may be acted on."""
    step = trial.step or 0
    first = step + 1 if trial.moment == "checkpoint_write" else step
    return {first, first + 1} if trial.fault in FORWARDED_STOPS else {first}


def stop_outcomes(trial: Trial, stopped: str) -> tuple[str, ...]:
    """`stopped`'s class, or `completed` where the stop's step can be the run's last."""
    at_end = [s >= MAX_STEPS for s in stop_steps(trial)]
    if all(at_end):
        return ("completed",)
    return (stopped, "completed") if any(at_end) else (stopped,)


def expected_outcomes(trial: Trial) -> tuple[str | None, ...]:
    sig, _, target = trial.fault.partition("_")
    if sig not in SIGNALS:  # a full disk, or a checkpoint damaged by a node that died
        return ("completed",) if trial.moment in AFTER_TRAINING else ("crash",)
    if trial.moment in AFTER_TRAINING and target != "launcher":
        return ("completed",)
    if sig == "sigterm" and target in ("trainer", "launcher") and trial.step is not None:
        return stop_outcomes(trial, "stopped")  # or `completed`: the stop's step is the last
    if trial.moment in AFTER_TRAINING:  # the launcher: a stop after training has nothing to stop
        return {"sigkill": (None,), "sigterm": ("completed",), "sigstop": ("completed",)}[sig]
    if trial.step == MAX_STEPS and trial.moment in AFTER_LAST_USE.get(target, ()):
        # Nothing waits for a stopped reward server (seed 1363193911); other losses race the
        # run's end (seed 1348018214: the server gone as the run ended, `completed`).
        if (sig, target) == ("sigstop", "reward_server"):
            return ("completed",)
        return (*EXPECTED[target][sig], "completed")
    return EXPECTED[target][sig]


def last_step_after_kill(trial: Trial) -> int:
    """The last step a SIGKILLed launcher's trainers may still end: each gets SIGTERM when
    its parent dies (launch/processes.py stop_with_parent; two ranks through torchrun's
    agent) and stops at the stop's step, as for a stop the launcher forwards: the signal
    comes when accelerate has died, which may be after the held rank went on into the next
    step (seed 3242996796: killed at optimizer_step:3, SIGTERM after step 3, saved at 4)."""
    return max(stop_steps(replace(trial, fault="sigterm_launcher")))


def stop_heard(trial: Trial, logs: str) -> bool | None:
    """Whether the trainers of a launcher SIGKILLed mid-run (not at the last step, which may
    end before the signal) logged the SIGTERM its death sends them; None for other trials."""
    if trial.fault != "sigkill_launcher" or not trial.step or trial.step >= MAX_STEPS:
        return None
    return "SIGTERM received by rank" in logs


def graceful(trial: Trial) -> bool:
    """A fault the product answers by saving at the next step boundary: nothing is redone."""
    return trial.fault in ("sigterm_trainer", "sigterm_launcher", "sigkill_launcher")


@dataclass
class Disk:
    """A small tmpfs for output_dir (size and inode limits), filled at the fault's moment."""

    path: Path
    size_mb: int = 48
    inodes: int = 4000

    def mount(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        options = f"size={self.size_mb}m,nr_inodes={self.inodes}"
        subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(self.path)], check=True)

    def fill(self, inodes: bool) -> None:
        filler = self.path / "filler"
        filler.mkdir(exist_ok=True)
        try:
            if inodes:
                for index in range(self.inodes):
                    (filler / str(index)).touch()
            else:
                with open(filler / "blob", "wb") as handle:
                    while True:
                        handle.write(b"\0" * (1 << 20))
                        handle.flush()
        except OSError:
            pass  # full: what the fault is

    def free(self) -> None:
        subprocess.run(["rm", "-rf", str(self.path / "filler")], check=False)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.path)], check=False)


def damage_newest(out: Path, remove: bool) -> str | None:
    """The newest complete checkpoint's biggest file cut in half, or its optimizer removed."""
    complete = [c for c in list_checkpoints(out) if c.complete]
    if not complete:
        return None
    newest = complete[-1].path
    if remove:
        (newest / "optimizer.pt").unlink(missing_ok=True)
    else:
        model = newest / "model.safetensors"
        os.truncate(model, model.stat().st_size // 2)
    return newest.name


def signal_fault(trial: Trial, watch: Watch) -> tuple[list[int], set[int]]:
    """Send the trial's signal to its target (one trainer rank, drawn by the seed); returns
    the pids signalled and those to keep stopped."""
    sig, _, target = trial.fault.partition("_")
    pids = [watch.run.proc.pid] if target == "launcher" else sorted(watch.of(target))
    if not pids:
        return [], set()
    pid = pids[trial.seed % len(pids)]
    os.kill(pid, SIGNALS[sig])
    return [pid], {pid} if sig == "sigstop" else set()


# --- one trial ----------------------------------------------------------------------------


def kill_left(pgids: set[int], marker: str, hits: Path | None = None) -> list[str]:
    """What of the run is still there after its end (orphans), then killed. A process the
    failpoint still holds is continued first: the campaign's stop, not the product's."""
    if hits is not None:
        cont([pid for pid, _ in read_hits(hits)], set())
    left, _ = wait_until_gone(pgids, marker, timeout=60)
    for line in live_processes(pgids, marker):
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return left


def inject(trial: Trial, run: Launched, watch: Watch, out: Path, disk: Disk | None) -> dict:
    """The fault, put in while the failpoint holds the process that reached the moment."""
    stopped = [pid for pid, _ in read_hits(Path(run.folder) / "hits")]
    held: set[int] = set()
    found: dict = {"applied": True, "held": held}
    if trial.fault.split("_")[0] in SIGNALS:
        pids, held = signal_fault(trial, watch)
        found.update(applied=bool(pids), held=held)
        if trial.fault == "sigkill_launcher":
            found["killed_at"] = time.time()
    elif disk is not None:
        disk.fill(inodes=trial.fault == "out_of_inodes")
    elif trial.fault.startswith("checkpoint_"):
        for pid in watch.of("trainer"):  # the node died mid-write: its ranks with it
            os.kill(pid, signal.SIGKILL)
        found["damaged"] = damage_newest(out, remove=trial.fault == "checkpoint_file_removed")
        found["applied"] = found["damaged"] is not None
    else:
        found["applied"] = False  # network_cut: a cluster's (tests/slurm/netns.sh)
    cont(stopped, held)
    if trial.fault == "sigstop_launcher" and found["applied"]:
        time.sleep(LAUNCHER_HOLD)  # the user notices, then continues it (fg)
        cont([run.proc.pid], set())
        held.clear()
    return found


def recover(recipe: Path, folder: Path, out: Path, watch_pgids: set[int]) -> dict:
    """The same command again, as a user would, until the run completes (3 tries)."""
    resumable, first_step_s, left, texts, resumed = [], None, [], [], []
    for _ in range(3):
        if run_is_complete(out):
            break
        steps = intact_steps(out)
        resumable.append(steps[-1] if steps else None)
        began, logs = time.time(), set(folder.glob("logs/*_train.log"))
        run = Launched(folder, recipe)
        watch = Watch(run)
        wait_end(run, watch, folder / "no-hits", set(), ATTEMPT_TIMEOUT)
        texts.append(run.text)
        resumed.append(resumed_from(folder, logs))
        left += kill_left(watch.pgids | watch_pgids, str(folder))
        if first_step_s is None:
            runs = attempts(out)
            steps = [e for e in runs[-1] if e["event"] == "step"] if runs else []
            first_step_s = round(steps[0]["time"] - began, 1) if steps else None
    return dict(
        resumable=resumable, first_step_s=first_step_s, left=left, texts=texts, resumed=resumed
    )


def run_trial(trial: Trial, folder: Path, reference: Path | None = None, tamper=None) -> dict:
    """One trial in `folder`; its row (with `problems`, empty when every invariant held).
    tamper(out), when given, breaks the run on purpose between the fault and the recovery
    (the checker's own tests)."""
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    disk = Disk(folder / "disk") if trial.fault in ("disk_full", "out_of_inodes") else None
    if disk is not None:
        disk.mount()
    try:
        recipe = write_trial_recipe(trial, folder)
        if disk is not None:
            recipe = write_recipe(folder, base=recipe, output_dir=f"{disk.path}/out")
        out = disk.path / "out" if disk is not None else folder / "out"
        env = {ENV: trial.failpoint, HITS_ENV: str(folder / "hits")}
        run = Launched(folder, recipe, **env)
        watch = Watch(run)
        reached = wait_for_hit(run, watch, folder / "hits", ATTEMPT_TIMEOUT)
        files_before = complete_files(out)
        found = inject(trial, run, watch, out, disk) if reached else {"applied": False}
        code = wait_end(run, watch, folder / "hits", found.get("held", set()), ATTEMPT_TIMEOUT)
        left = kill_left(watch.pgids, str(folder), folder / "hits")
        launcher_text = run.text  # the faulted attempt's alone: the reruns append to it
        faulted_text = launcher_text + run.logs()
        if disk is not None:
            disk.free()  # the user makes room
        if tamper is not None:
            tamper(out)
        recovered = recover(recipe, folder, out, watch.pgids)
        skip = [found["damaged"]] if found.get("damaged") else []
        facts = TrialFacts(
            out=out,
            max_steps=MAX_STEPS,
            graceful=graceful(trial) and trial.moment not in AFTER_TRAINING,
            files_before={k: v for k, v in files_before.items() if k.split("/")[0] not in skip},
            files_after=complete_files(out),
            resumable=recovered["resumable"],
            resumed_logs=recovered["resumed"],
            expected_outcomes=expected_outcomes(trial),
            left_processes=left + recovered["left"],
            disk_path=str(disk.path) if disk is not None else None,
            disk_output=faulted_text,
            printed_outcome=printed_outcome(launcher_text),
            completed=run_is_complete(out),
            ended_at=found.get("killed_at"),
            last_step_after_end=last_step_after_kill(trial),
            stop_heard=stop_heard(trial, faulted_text),
        )
        if facts.completed and reference is not None and trial.kind.deterministic:
            facts.weights_equal = same_weights(out, reference)
        problems = check_trial(facts) if reached else [f"moment {trial.moment} never reached"]
        return trial_row(trial, facts, problems, reached, found, code, recovered, began)
    finally:
        if disk is not None:
            disk.unmount()


def trial_row(trial, facts, problems, reached, found, code, recovered, began) -> dict:
    """The report's row of a trial (bench/chaos.py prints and sums them)."""
    runs = attempts(facts.out)
    seen = {s for events in runs for s in _steps(events)}
    return {
        **asdict(trial),
        "kind": trial.kind.name,
        "reached": reached,
        "applied": found["applied"],
        "faulted_code": code,
        "outcome": _outcome(runs, 0) or facts.printed_outcome,
        "expected": list(facts.expected_outcomes),
        "attempts": len(runs),
        "recovered": facts.completed,
        "steps_lost": len(set(range(1, MAX_STEPS + 1)) - seen),
        "steps_redone": sum(redone_steps(facts)),
        "first_step_s": recovered["first_step_s"],
        "orphans": len(facts.left_processes),
        "corrupted": len([p for p in problems if p.startswith("complete file changed")]),
        "weights_equal": facts.weights_equal,
        "problems": problems,
        "wall_s": round(time.monotonic() - began, 1),
    }


def _steps(events: list[dict]) -> list[int]:
    return [int(e["step"]) for e in events if e["event"] == "step"]


def _outcome(runs: list[list[dict]], index: int) -> str | None:
    from helpers.chaos_checks import outcome_of

    return outcome_of(runs[index]) if index < len(runs) else None
