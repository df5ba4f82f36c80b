"""Chaos trials under Slurm (bench/chaos.py): the trial's run submitted with `sbatch
training.sh` to the test cluster (tests/slurm/cluster.sh), its fault put in while a failpoint
holds one of the job's processes, its recovery the one a user sees: Slurm's requeue (the
launcher's own for a transient outcome, or Slurm's for a preemption), or the same sbatch
command again when the job ended without one (three jobs at most).

Faults: a signal to a process of the job (a trainer rank, the launcher: the batch step's
process), or Slurm's own: a job of the `high` partition that needs the node's CPUs (a
preemption: SIGTERM after the debug partition's 30 s grace), the time limit's warning
(`scancel --batch --signal=USR1`, what `#SBATCH --signal=B:USR1@300` sends), `scontrol
requeue`; on the 3-node cluster, the network of the second vLLM server's node cut
(`cluster.sh cut-node`: its processes run on, its peers hear nothing) in a job of two servers
and a training node (`--no-kill`, as `maxent-grpo sbatch` submits several servers).

A trial's seed is at least SLURM_SEEDS: below it the seeds draw the trials without Slurm,
unchanged (tests/chaos/test_chaos_record.py replays the record from its seeds); from
SLURM_VLLM_SEEDS up, 1-node trials with a vLLM CPU server (`--slurm 1node --servers-only`).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from helpers.chaos_checks import (
    TrialFacts,
    attempts,
    check_trial,
    complete_files,
    intact_steps,
    printed_outcome,
    resumed_from,
    same_weights,
)
from helpers.chaos_trial import (
    ATTEMPT_TIMEOUT,
    MAX_STEPS,
    SIGNALS,
    Kind,
    Trial,
    Watch,
    cont,
    expected_outcomes,
    last_step_after_kill,
    read_hits,
    role,
    stop_heard,
    stop_outcomes,
    trial_row,
    write_trial_recipe,
)
from helpers.paths import REPO
from helpers.procs import _cmdline, live_processes
from helpers.recipes import write_recipe
from maxent_grpo.faults import ENV, HITS_ENV
from maxent_grpo.rundir.checkpoints import run_is_complete

SLURM_SEEDS = 2**31  # seeds from here up draw a Slurm trial
SLURM_VLLM_SEEDS = 2**32  # from here to 2**33: on the 1-node cluster, with a vLLM CPU server
SERVER_FAULTS = ("sigkill_server", "sigterm_server", "sigstop_server")
CLUSTER_SH = REPO / "tests" / "slurm" / "cluster.sh"
SLURM_FAULTS = (
    "sigkill_trainer",
    "sigterm_trainer",
    "sigstop_trainer",
    "sigkill_launcher",
    "slurm_preempt",
    "slurm_time_limit",
    "slurm_requeue",
)
SLURM_MOMENTS = ("generation", "scoring", "optimizer_step", "checkpoint_write")
CUT_MOMENTS = ("generation", "weight_push")
JOBS = 3  # the first job and at most two resubmissions
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
TERMINAL += ("BOOT_FAIL", "DEADLINE", "PREEMPTED", "REQUEUE_HOLD", "SPECIAL_EXIT")
SIGTERM_BOUND = 120  # seconds for Slurm's preemption SIGTERM to reach a held process
CUT_GONE_BOUND = 120  # seconds for the cut node's leftovers to end once it is back


def slurm_trial_from_seed(seed: int) -> Trial:
    """A Slurm trial, from its seed alone (pure)."""
    rng = random.Random(seed)
    if seed >= SLURM_VLLM_SEEDS:
        return _with_a_server(seed, rng)
    fault = rng.choice((*SLURM_FAULTS, "network_cut"))
    method = rng.choice(("grpo", "maxent"))
    if fault == "network_cut":
        moment = rng.choice(CUT_MOMENTS)
        kind = Kind(method=method, procs=1, server=True, async_=rng.random() < 0.5)
        return Trial(seed, _on(kind, "3node"), moment, rng.randint(2, 5), fault)
    moment = rng.choice(SLURM_MOMENTS)
    step = rng.choice((2, 4)) if moment == "checkpoint_write" else rng.randint(2, 6)
    kind = Kind(method=method, procs=rng.choice((1, 2)))
    return Trial(seed, _on(kind, "1node"), moment, step, fault)


def _with_a_server(seed: int, rng: random.Random) -> Trial:
    """A 1-node trial whose job runs a vLLM CPU server beside its trainers (seeds from
    SLURM_VLLM_SEEDS: the earlier seeds draw what they drew), the server a target too."""
    fault = rng.choice((*SLURM_FAULTS, *SERVER_FAULTS))
    method = rng.choice(("grpo", "maxent"))
    moment = rng.choice((*SLURM_MOMENTS, "weight_push"))
    step = rng.choice((2, 4)) if moment == "checkpoint_write" else rng.randint(2, 6)
    kind = Kind(method=method, procs=rng.choice((1, 2)), server=True, async_=rng.random() < 0.5)
    return Trial(seed, _on(kind, "1node"), moment, step, fault)


def _on(kind: Kind, cluster: str) -> Kind:
    return replace(kind, cluster=cluster)


def slurm_expected(trial: Trial) -> tuple[str | None, ...]:
    """The faulted attempt's class: a signal's as without Slurm; Slurm's stop classes
    (launch/outcomes.py stop_outcome); a cut server node: the run goes on with the other."""
    if trial.fault == "slurm_time_limit":
        return stop_outcomes(trial, "time_limit")
    if trial.fault in ("slurm_preempt", "slurm_requeue"):
        # Slurm requeues the job itself: the launcher reads Restarts one up (`preempted`).
        return stop_outcomes(trial, "preempted")
    if trial.fault == "network_cut":
        return ("completed",)
    return expected_outcomes(trial)


def graceful(trial: Trial) -> bool:
    """Saved at a step boundary first: a SIGTERM to the trainers, the time limit's warning.
    Not a killed launcher (Slurm may end its batch step, the trainers with it, before they
    save: proctrack/cgroup does), nor a preemption or a requeue (KillWait's SIGKILL, 5 s after
    the SIGTERM on the test cluster, may come before the save)."""
    return trial.fault in ("sigterm_trainer", "slurm_time_limit", "network_cut")


# --- the cluster -----------------------------------------------------------------------------


def cluster_sh(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(CLUSTER_SH), *args], capture_output=True, text=True, timeout=timeout
    )


@dataclass
class Cluster:
    """The running test cluster (`cluster.sh start [--nodes 3]`, run by the campaign's user)."""

    env: dict[str, str]
    nodes: list[str] = field(default_factory=list)

    @classmethod
    def running(cls, nodes: int) -> Cluster:
        if cluster_sh("status", timeout=60).returncode != 0:
            raise SystemExit(f"no test cluster: bash tests/slurm/cluster.sh start --nodes {nodes}")
        env = dict(os.environ)
        for line in cluster_sh("env", timeout=30).stdout.splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            env[key] = value.strip("'\"")
        found = cls(env)
        found.nodes = found.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N").stdout.split()
        if len(found.nodes) != nodes:
            raise SystemExit(f"the cluster has {found.nodes}, not {nodes} node(s)")
        return found

    def run(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout
        )

    def record(self, job: str) -> dict[str, str]:
        line = self.run("scontrol", "show", "job", "-o", job).stdout.strip()
        return dict(f.split("=", 1) for f in line.split() if "=" in f)

    def state(self, job: str) -> str:
        return self.record(job).get("JobState", "UNKNOWN")

    def cpus(self) -> int:
        line = self.run("scontrol", "show", "node", "-o", self.nodes[0]).stdout
        return int(line.split("CPUTot=")[1].split()[0])


def sbatch(cluster: Cluster, trial: Trial, folder: Path, recipe: Path, env: dict) -> str:
    """`sbatch training.sh --config RECIPE` from the repository, as the Slurm suite does."""
    exports = {
        "MAXENT_GRPO_ENV": "current",  # this venv, nothing installed in the job
        "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ.get('PATH', '')}",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        **env,
    }
    args = ["--requeue", "--gres=gpu:0", f"--cpus-per-task={cluster.cpus()}"]
    if trial.kind.cluster == "3node":
        args = ["--nodes=3", "--no-kill", "--requeue", "--gres=gpu:0"]
    args += [f"--output={folder}/slurm_%j.out", f"--error={folder}/slurm_%j.err"]
    args += ["--export=ALL," + ",".join(f"{k}={v}" for k, v in exports.items())]
    args += ["training.sh", "--config", str(recipe), "--logs-dir", str(folder / "logs")]
    done = subprocess.run(
        ["sbatch", "--parsable", *args], cwd=REPO, env=cluster.env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise RuntimeError(f"sbatch failed: {done.stderr}")
    return done.stdout.strip().split(";")[0]


# --- the job's processes ---------------------------------------------------------------------


def ancestors(pid: int) -> list[int]:
    found = []
    while pid > 1:
        found.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat[stat.rindex(")") + 2 :].split()[1])
    return found


class JobRun:
    """What helpers.chaos_trial.Watch needs of a run: the launcher's pid (the batch step's
    process, found above the process the failpoint holds)."""

    class _Proc:
        def __init__(self, pid: int):
            self.pid = pid

        def poll(self):
            return None if Path(f"/proc/{self.pid}").exists() else 0

    def __init__(self, pid: int):
        self.proc = self._Proc(pid)


def launcher_of(pid: int) -> int | None:
    return next((p for p in ancestors(pid) if role(p) == "launcher"), None)


def job_pids(*jobs: str) -> list[int]:
    """Every live process of the jobs on this machine, every node's (the 3-node cluster's
    namespaces share the pid space): Slurm's SLURM_JOB_ID in its environment. Nothing else:
    other users' processes (a vLLM server of theirs) are no trial's."""
    wanted = [f"SLURM_JOB_ID={job}\0".encode() for job in jobs]
    found = []
    for pid in os.listdir("/proc"):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(w in environ for w in wanted):
            found.append(int(pid))
    return found


def sigterm_came(pid: int) -> bool:
    """Slurm's SIGTERM reached the stopped process: pending there, or it runs again (Slurm
    continued it), or it is gone."""
    try:
        status = dict(
            line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        )
    except OSError:
        return True
    if not status.get("State", "").strip().startswith(("T", "t")):
        return True
    bit = 1 << (signal.SIGTERM - 1)
    return any(int(status.get(key, "0"), 16) & bit for key in ("SigPnd", "ShdPnd"))


# --- one trial -------------------------------------------------------------------------------


def _wait(predicate, timeout: float, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    return None


def inject(trial: Trial, cluster: Cluster, job: str, hits: Path, watch: Watch) -> dict:
    """The fault, while the failpoint holds the process that reached the moment."""
    stopped = [pid for pid, _ in read_hits(hits)]
    found: dict = {"applied": True, "held": set()}
    sig, _, target = trial.fault.partition("_")
    if sig in SIGNALS:
        pids = [watch.run.proc.pid] if target == "launcher" else sorted(watch.of(target))
        if pids:
            pid = pids[trial.seed % len(pids)]
            os.kill(pid, SIGNALS[sig])
            found["held"] = {pid} if sig == "sigstop" else set()
        found["applied"] = bool(pids)
    elif trial.fault == "slurm_time_limit":
        found["applied"] = cluster.run("scancel", "--batch", "--signal=USR1", job).returncode == 0
    elif trial.fault == "slurm_requeue":
        found["applied"] = cluster.run("scontrol", "requeue", job).returncode == 0
    elif trial.fault == "slurm_preempt":
        high = cluster.run(
            "sbatch",
            "--parsable",
            "-p",
            "high",
            f"--cpus-per-task={cluster.cpus()}",
            "--gres=gpu:0",
            f"--output={hits.parent}/high_%j.out",
            "--wrap",
            "sleep 2",
        )
        found["applied"] = high.returncode == 0
        # The held process stands still until Slurm's SIGTERM (after the grace time) is there.
        _wait(lambda: all(sigterm_came(p) for p in stopped), SIGTERM_BOUND, poll=0.5)
    elif trial.fault == "network_cut":
        node = trial_node(cluster, job)
        found["applied"] = cluster_sh("cut-node", node, timeout=60).returncode == 0
        found["cut"] = Cut(node) if found["applied"] else None
    cont(stopped, found["held"])
    return found


def trial_node(cluster: Cluster, job: str) -> str:
    """The second vLLM server's node (the job's second; not the batch node)."""
    nodelist = cluster.record(job).get("NodeList", "")
    return cluster.run("scontrol", "show", "hostnames", nodelist).stdout.split()[1]


@dataclass
class Ends:
    """Each attempt's end, seen in the event log or in Slurm's state: the newest checkpoint a
    resume may pick then, the train logs there were, the time, the launcher output's length."""

    resumable: list[int | None] = field(default_factory=list)
    logs: list[set] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    output_len: list[int] = field(default_factory=list)
    resumed: list[str] = field(default_factory=list)
    job_ended: float | None = None  # the first job seen ended by Slurm (epoch s)

    def see(self, folder: Path, out: Path) -> None:
        steps = intact_steps(out)
        if self.logs:
            self.resumed.append(resumed_from(folder, self.logs[-1]))
        self.resumable.append(steps[-1] if steps else None)
        self.logs.append(set(folder.glob("logs/*_train.log")))
        self.times.append(time.time())
        self.output_len.append(len(_slurm_text(folder)))


def _logs_text(logs: list[set]) -> str:
    """The train logs there were at the first attempt's end (its own among them)."""
    return "".join(p.read_text(errors="replace") for found in logs for p in sorted(found))


def _slurm_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("slurm_*.out")))


def follow(cluster, job, folder, out, hits, held, ends: Ends, timeout: float, cut=None):
    """Wait for the job's end (requeues included), continuing every process the failpoint
    stops from now on (the requeued attempts reach it too), noting each attempt's end.
    cut: a node whose network is cut, restored once Slurm has it down or the run is complete
    (a job with a node down stays COMPLETING until it is back)."""
    deadline = time.monotonic() + timeout
    ended = len(ends.resumable)
    pgids: set[int] = set()
    while time.monotonic() < deadline:
        cont([pid for pid, _ in read_hits(hits)], held)
        if cut is not None and cut.due(cluster, out):
            cut.restore()
        for pid in job_pids(job):
            try:
                pgids.add(os.getpgid(pid))
            except OSError:
                pass
        state = cluster.state(job)
        if state in TERMINAL and ends.job_ended is None:
            ends.job_ended = time.time()  # its processes may live on (proctrack/linuxproc)
        runs = attempts(out) if (out / "events.jsonl").exists() else []
        # An attempt ended: its outcome is written, a later attempt has started (a SIGKILLed
        # one writes no outcome, and its requeue may be running again between two polls:
        # seed 5296057401 read the next attempt's checkpoint as its own), or Slurm has the
        # job again (requeued) or done, with no process of it left.
        done = sum(1 for events in runs if any(e["event"] == "outcome" for e in events))
        done = max(done, len(runs) - 1)
        if state in ("PENDING", *TERMINAL) and not job_pids(job):
            done = max(done, len(runs))
        while ended < done:
            ends.see(folder, out)
            ended += 1
        if state in TERMINAL and not job_pids(job):
            return state, pgids
        time.sleep(0.5)
    # SIGKILL: a SIGTERM would be a stop, which the launcher answers with a requeue.
    cluster.run("scancel", "--full", "--signal=KILL", job)
    return "BOUND", pgids


@dataclass
class Cut:
    """A node's network cut (cluster.sh cut-node), restored once (restore-node)."""

    node: str
    at: float = field(default_factory=time.monotonic)
    restored: float | None = None
    down_after_s: float | None = None  # Slurm's verdict: the node down, seconds after the cut

    def due(self, cluster: Cluster, out: Path) -> bool:
        if self.restored is not None:
            return False
        state = cluster.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T").stdout
        if "down" in state and self.down_after_s is None:
            self.down_after_s = round(time.monotonic() - self.at, 1)
        return self.down_after_s is not None or run_is_complete(out)

    def restore(self) -> None:
        if self.restored is None:
            cluster_sh("restore-node", self.node, timeout=60)
            self.restored = time.monotonic()


def run_slurm_trial(trial: Trial, folder: Path, reference: Path | None, cluster: Cluster) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    recipe = write_trial_recipe(trial, folder)
    if trial.kind.cluster == "3node":
        recipe = write_recipe(folder, base=recipe, vllm_nodes=2)
    out, hits = folder / "out", folder / "hits"
    env = {
        ENV: trial.failpoint,
        HITS_ENV: str(hits),
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    job = sbatch(cluster, trial, folder, recipe, env)
    jobs, ends = [job], Ends()
    # Until the moment, or the job's end before it (another user's scancel, a failed start).
    ended = lambda: cluster.state(job) in TERMINAL and not job_pids(job)  # noqa: E731
    reached = _wait(lambda: read_hits(hits) or ended(), ATTEMPT_TIMEOUT, poll=0.5) is not None
    reached = reached and bool(read_hits(hits))
    found: dict = {"applied": False, "held": set()}
    files_before: dict = {}
    if reached:
        time.sleep(0.3)  # the other ranks reach the same point
        hit = read_hits(hits)[0][0]
        launcher = launcher_of(hit) or hit
        watch = Watch(JobRun(launcher))
        watch.poll()
        files_before = complete_files(out)
        found = inject(trial, cluster, job, hits, watch)
    cut = found.get("cut")
    bound = 2 * ATTEMPT_TIMEOUT
    state, pgids = follow(cluster, job, folder, out, hits, found["held"], ends, bound, cut)
    faulted_text = _slurm_text(folder)[: ends.output_len[0] if ends.output_len else None]
    requeues = int(cluster.record(job).get("Restarts", 0) or 0)
    # The user: the job ended and the run is not complete: the same command again.
    while not run_is_complete(out) and len(jobs) < JOBS and reached:
        job = sbatch(cluster, trial, folder, recipe, {"PYTHONPATH": env["PYTHONPATH"]})
        jobs.append(job)
        state, more = follow(cluster, job, folder, out, hits, set(), ends, ATTEMPT_TIMEOUT)
        pgids |= more
    if cut is not None:
        cut.restore()
    left = _left(folder, pgids, jobs, bound=CUT_GONE_BOUND if cut else 30)
    if cut is not None:  # the node back in the cluster, idle, for the next trial
        cluster_sh("start", "--nodes", str(len(cluster.nodes)), timeout=300)
    runs = attempts(out)
    first = runs[1] if len(runs) > 1 else []
    steps = [e for e in first if e["event"] == "step"]
    facts = TrialFacts(
        out=out,
        max_steps=MAX_STEPS,
        graceful=graceful(trial),
        files_before=files_before,
        files_after=complete_files(out),
        resumable=ends.resumable[: max(len(runs) - 1, 0)],
        resumed_logs=ends.resumed,
        expected_outcomes=slurm_expected(trial),
        left_processes=left,
        printed_outcome=printed_outcome(faulted_text),
        completed=run_is_complete(out),
        ended_at=ends.job_ended,
        last_step_after_end=last_step_after_kill(trial) if trial.fault == "sigkill_launcher" else 0,
        stop_heard=stop_heard(trial, _logs_text(ends.logs[:1])),
    )
    if facts.completed and reference is not None and trial.kind.deterministic:
        facts.weights_equal = same_weights(out, reference)
    problems = check_trial(facts) if reached else [f"moment {trial.moment} never reached"]
    first_step_s = round(steps[0]["time"] - ends.times[0], 1) if steps and ends.times else None
    recovered = {"first_step_s": first_step_s}
    row = trial_row(trial, facts, problems, reached, found, state, recovered, began)
    row.update(jobs=jobs, slurm_requeues=requeues, resubmitted=len(jobs) - 1)
    if cut is not None:
        row.update(cut_node=cut.node, node_down_after_s=cut.down_after_s)
    row["applied"] = bool(found["applied"])
    return row


def _left(folder: Path, pgids: set[int], jobs: list[str], bound: float) -> list[str]:
    """What of the run is still there (orphans: a process of its jobs, of their process
    groups, or naming its folder), then killed: only those."""

    def now() -> list[str]:
        found = live_processes(pgids - {os.getpgid(0)}, str(folder))
        seen = {int(line.split()[0]) for line in found}
        found += [f"{p} {_cmdline(str(p))[:160]}" for p in job_pids(*jobs) if p not in seen]
        return found

    _wait(lambda: not now(), bound, poll=0.5)
    left = now()
    for line in left:
        try:
            os.kill(int(line.split()[0]), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass
    return left
