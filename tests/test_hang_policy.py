"""The hang policy (launch/hang.py) as the pure function it is: observations in, a Hang or
None out; no file, no process, no clock. The probing that makes the observations is
tests/reliability/test_outcome_rules.py's and test_watchdog_servers.py's; the loop that asks
every server through one interface is the last test here, with a real trainer process."""

from __future__ import annotations

import time

from maxent_grpo.launch.hang import (
    AUTO_FLOOR_S,
    AUTO_STARTUP_S,
    AUTO_STEPS,
    WARMUP_S,
    RankSeen,
    Seen,
    find_hang,
)
from maxent_grpo.launch.plan import RewardModelPlan, ServerPlan
from maxent_grpo.launch.processes import Child
from maxent_grpo.launch.reward_server import RewardModelServer
from maxent_grpo.launch.server import VLLMServer
from maxent_grpo.launch.server_group import ServerGroup
from maxent_grpo.launch.watch import watch_training


def beat(phase="step_end", step=3, slowest=2.0, pid=11, host="h"):
    return {"phase": phase, "step": step, "slowest_step_s": slowest, "pid": pid, "host": host}


def test_silence_within_the_limit_is_no_hang_and_past_it_names_the_rank():
    ok = Seen((RankSeen(0, 14.0, beat()), RankSeen(1, 3.0, beat())))
    assert find_hang(15, ok) is None
    hang = find_hang(15, Seen((RankSeen(0, 16.0, beat()), RankSeen(1, 3.0, beat()))))
    assert hang.reason == (
        "no progress from rank 0 for 16s (hang_timeout 15s); last: step_end at step 3 (pid 11 on h)"
    )
    assert hang.details == [
        "rank 0: silent 16s; last: step_end at step 3 (pid 11 on h)",
        "rank 1: silent 3s; last: step_end at step 3 (pid 11 on h)",
    ]
    assert sorted(hang.beats) == [0, 1] and not hang.server


def test_the_first_step_gets_its_warm_up_and_the_auto_limit_follows_the_slowest_step():
    first = Seen((RankSeen(0, 15 + WARMUP_S - 1, beat("generate", 0, 0.0)),))
    assert find_hang(15, first) is None
    assert find_hang(15, Seen((RankSeen(0, 15 + WARMUP_S + 1, beat("generate", 0, 0.0)),)))
    assert find_hang(None, Seen((RankSeen(0, AUTO_STARTUP_S - 1, None),))) is None
    slow = 200.0  # five slow steps are past the floor
    steady = Seen((RankSeen(0, AUTO_STEPS * slow - 1, beat(slowest=slow)),))
    assert find_hang(None, steady) is None
    hang = find_hang(None, Seen((RankSeen(0, AUTO_STEPS * slow + 1, beat(slowest=slow)),)))
    assert "(automatic hang_timeout 1000s)" in hang.reason
    fast = Seen((RankSeen(0, AUTO_FLOOR_S + 1, beat(slowest=1.0)),))
    assert "(automatic hang_timeout 600s)" in find_hang(None, fast).reason


def test_a_rank_whose_process_explains_the_silence_is_named_before_the_longest_silent():
    ranks = (
        RankSeen(0, 100.0, beat(pid=10)),
        RankSeen(1, 20.0, beat(pid=21), ", process stopped (SIGSTOP?)"),
    )
    hang = find_hang(15, Seen(ranks))
    assert hang.reason.startswith("no progress from rank 1 for 20s")
    assert hang.reason.endswith("(pid 21 on h, process stopped (SIGSTOP?))")
    assert find_hang(15, Seen(ranks[:1] + (RankSeen(1, 20.0, beat()),))).reason.startswith(
        "no progress from rank 0 for 100s"
    )


def test_the_servers_silence_is_that_of_the_last_to_answer():
    ranks = (RankSeen(0, 1.0, beat()),)
    one_answers = Seen(ranks, (("http://a/health", 60.0), ("http://b/health", 2.0)))
    assert find_hang(12, one_answers) is None
    none = Seen(ranks, (("http://a/health", 60.0), ("http://b/health", 13.0)))
    hang = find_hang(12, none)
    assert hang.server and hang.reason == (
        "no vLLM server answered (http://a/health, http://b/health) for 13s (hang_timeout 12s)"
    )
    assert hang.details[-1] == "vLLM server http://b/health: last answered 13s ago"
    # An explicit limit gives the server no warm-up allowance: its API answers while compiling.
    first = Seen((RankSeen(0, 1.0, beat("generate", 0, 0.0)),), (("http://a/health", 13.0),))
    assert find_hang(12, first).reason.startswith("the vLLM server did not answer http://a")


class Fake:
    """A server of a kind the loop has never seen: the protocol is all it needs."""

    name, without, lost_as = "fake server", "it cannot work without the fake", "server_died"

    def __init__(self, lost_after: int | None):
        self.polls, self.lost_after, self.remembered = 0, lost_after, 0

    def remember(self):  # once a poll
        self.remembered += 1

    def check_started(self, cancelled):
        self.polls += 1
        return self.polls > 2  # answers from the third poll on

    def lost(self, stopping, exited):
        gone = self.lost_after is not None and self.remembered > self.lost_after and not exited
        return "fake server gone" if gone else None

    def dump_stacks(self, note): ...
    def kill(self): ...
    def stop(self, grace=10.0): ...


def test_the_loop_watches_any_server_through_the_one_interface(tmp_path, capsys):
    trainer = Child("train", ["sleep", "20"], tmp_path / "t.log")
    start = time.monotonic()
    watched = watch_training(trainer, (Fake(None), Fake(5)), None, poll=0.05)
    assert watched.code == -15 and watched.server_died == "fake server gone"
    assert time.monotonic() - start < 10  # stopped, not waited out (20 s)
    out = capsys.readouterr().out
    assert "error: fake server gone\nstopping training: it cannot work without the fake" in out
    quiet = Child("train", ["true"], tmp_path / "q.log")
    assert watch_training(quiet, (Fake(None),), None, poll=0.05).server_died is None


def test_the_loop_says_once_when_every_server_answered(tmp_path):
    servers, answered = (Fake(None), Fake(None)), []
    trainer = Child("train", ["sleep", "1"], tmp_path / "t.log")
    watch_training(
        trainer, servers, None, poll=0.05, on_started=lambda: answered.append(servers[0].polls)
    )
    assert answered == [3]  # once, at the poll where both answered first (their third)
    early = Child("train", ["true"], tmp_path / "e.log")  # exits before any server answers
    watch_training(early, (Fake(None),), None, poll=0.5, on_started=lambda: answered.append(0))
    assert answered == [3]


def test_each_kind_of_server_names_the_health_urls_whose_silence_is_a_hang(tmp_path):
    def vllm(port: int) -> ServerPlan:
        return ServerPlan("127.0.0.1", (), port, 0, ("true",), {}, "cpu", "disk", 30.0)

    one = VLLMServer(vllm(8001), tmp_path / "v.log", {})
    assert one.hang_urls == ("http://127.0.0.1:8001/health",)
    group = ServerGroup((vllm(8001), vllm(8002)), tmp_path / "g.log", {})
    assert group.hang_urls == ("http://127.0.0.1:8001/health", "http://127.0.0.1:8002/health")
    reward = RewardModelPlan("127.0.0.1", (), 9, "m", ("true",), {}, 30.0)
    assert RewardModelServer(reward, tmp_path / "r.log", {}).hang_urls == ()
