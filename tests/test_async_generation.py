"""async_generation's pieces without a server: the generation queue (a request per group,
chunks, a push between chunks, its bounded waits, a failed request, its saved prefixes), the
busy-time arithmetic and the recipe's refusals. The pipeline itself runs against the real vLLM
CPU server in tests/vllm_server/test_vllm_async.py and bench/bench_async.py.
"""

from __future__ import annotations

import threading
import time

import pytest

from maxent_grpo.errors import ConfigError
from maxent_grpo.train.async_generation import Pending, ServerLostError
from maxent_grpo.train.generation_queue import GenerationQueue, StepWork, busy_seconds, kept

EOS = 0


class Scripted:
    """A stand-in server: prompt [p] has n completions, completion k of length lengths[k]
    (its tokens 1000*k + position + 1, the last one EOS); a continuation's prompt is the prompt
    and the prefix. Each token's logprob is minus the weights' version, so a test reads which
    weights made it. `gate` (set by default) holds every request until set."""

    def __init__(self, lengths: list[int], delay: float = 0.0):
        self.lengths, self.delay, self.version = lengths, delay, 0
        self.requests: list[tuple[list[list[int]], int, int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.in_flight = 0
        self.lock = threading.Lock()

    def send(self, prompts, n, max_tokens):
        with self.lock:
            self.requests.append((prompts, n, max_tokens))
            self.in_flight += 1
        try:
            self.gate.wait(30)
            time.sleep(self.delay)
            ids = []
            for prompt in prompts:
                prefix = prompt[1:]
                for k in [prefix[0] // 1000] if prefix else range(n):
                    length = self.lengths[k]
                    rest = [1000 * k + j + 1 for j in range(len(prefix), length - 1)] + [EOS]
                    ids.append(rest[:max_tokens])
            return ids, [[-float(self.version)] * len(t) for t in ids], None
        finally:
            with self.lock:
                self.in_flight -= 1


def queue_for(server: Scripted, chunk: int = 0, timeout: float = 10, n: int = 2):
    return GenerationQueue(
        server.send,
        n=n,
        max_tokens=8,
        chunk_tokens=chunk,
        stop_ids={EOS},
        timeout=timeout,
        version=0,
    )


def test_each_group_is_a_request_and_each_step_comes_back_whole_in_order():
    server = Scripted([3, 8])
    queue = queue_for(server)
    works = [queue.submit(step, [[step], [step], [step + 10], [step + 10]]) for step in (2, 3)]
    ids, logprobs, versions = queue.wait(works[0])
    assert ids == [[1, 2, EOS], [1001, 1002, 1003, 1004, 1005, 1006, 1007, EOS]] * 2
    assert versions == [0] * 4 and logprobs[0] == [-0.0] * 3
    queue.wait(works[1])
    # one request per group (a prompt, n completions), none per step
    assert sorted(p[0][0] for p, _, _ in server.requests) == [2, 3, 12, 13]
    assert {(n, budget) for _, n, budget in server.requests} == {(2, 8)}
    assert queue.busy and all(end >= start for start, end in queue.busy)
    queue.close()


def test_with_chunks_a_push_waits_one_chunk_and_completions_go_on_from_their_prefix():
    server = Scripted([3, 8], delay=0.05)
    queue = queue_for(server, chunk=2)
    work = queue.submit(2, [[5], [5]])
    time.sleep(0.02)  # the first chunk is out
    with queue.paused():  # what a weight push does
        assert server.in_flight == 0
        server.version = queue.version = 1
    ids, logprobs, versions = queue.wait(work)
    assert ids == [[1, 2, EOS], [1001, 1002, 1003, 1004, 1005, 1006, 1007, EOS]]
    assert versions == [0, 0]  # the version of each completion's first token
    long = work.groups[0].samples[1]
    assert long.versions == [(0, 0), (2, 1), (4, 1), (6, 1)]
    assert long.logprobs == [-0.0, -0.0] + [-1.0] * 6
    assert work.spanned() == 1.0
    # each continuation asked for the prefix's completion only, one chunk long
    later = [(p, n, budget) for p, n, budget in server.requests[1:]]
    assert later[0] == ([[5, 1, 2], [5, 1001, 1002]], 1, 2)
    assert later[1] == ([[5, 1001, 1002, 1003, 1004]], 1, 2)  # the short one had ended
    queue.close()


def test_a_chunk_ending_on_a_stop_token_ends_its_completion():
    server = Scripted([2, 4])  # lengths that are whole chunks
    queue = queue_for(server, chunk=2)
    ids, _, _ = queue.wait(queue.submit(1, [[5], [5]]))
    assert ids == [[1, EOS], [1001, 1002, 1003, EOS]]
    assert len(server.requests) == 2  # nothing asked after either EOS
    queue.close()


def test_saved_prefixes_go_on_in_another_queue_and_are_not_generated_again():
    server = Scripted([3, 8], delay=0.05)
    queue = queue_for(server, chunk=2)
    work = queue.submit(4, [[5], [5]])
    time.sleep(0.02)
    with queue.paused():  # a checkpoint's snapshot, after the first chunk
        saved = work.state()
    queue.close()
    restored = StepWork.from_state(4, saved)
    assert kept([restored]) == (2, 4)  # both unfinished after 2 tokens: 4 tokens kept
    again = Scripted([3, 8])
    other = queue_for(again)
    other.adopt([restored])
    ids, _, _ = other.wait(restored)
    assert ids == [[1, 2, EOS], [1001, 1002, 1003, 1004, 1005, 1006, 1007, EOS]]
    assert again.requests == [([[5, 1, 2], [5, 1001, 1002]], 1, 6)]  # the rest, in one piece
    other.close()


class PoolServer(Scripted):
    """A Scripted server behind the ServerPool's client interface; `down` refuses."""

    def __init__(self, url: str, lengths: list[int]):
        import requests

        super().__init__(lengths)
        self.base_url, self.session, self.down, self.asked = url, requests.Session(), False, []

    def generate(self, prompts, features=None, n=1, max_tokens=16, **params):
        import requests

        if self.down:
            raise requests.ConnectionError("connection refused")
        self.asked.append(prompts)
        ids, _, _ = self.send(prompts, n, max_tokens)
        return {"prompt_ids": prompts, "completion_ids": ids, "logprobs": None}


def test_a_server_lost_mid_completion_gives_its_prefixes_to_another():
    from maxent_grpo.train import server_pool

    servers = [PoolServer("http://a", [3, 8]), PoolServer("http://b", [3, 8])]
    for server in servers:
        server.delay = 0.2
    pool = server_pool.ServerPool(servers, timeout=5)

    def send(prompts, n, max_tokens):
        answer = pool.generate(prompts, n=n, max_tokens=max_tokens)
        return answer["completion_ids"], None, answer["policy_versions"]

    queue = GenerationQueue(send, 2, 8, 2, {EOS}, timeout=10, version=0)
    work = queue.submit(3, [[5], [5]])
    deadline = time.monotonic() + 5
    while not any(server.asked for server in servers) and time.monotonic() < deadline:
        time.sleep(0.01)
    with queue.paused():  # the first chunk is back, the next not asked yet
        first = next(server for server in servers if server.asked)
        first.down = True  # its node lost, between two chunks
    ids, _, _ = queue.wait(work)
    assert ids == [[1, 2, EOS], [1001, 1002, 1003, 1004, 1005, 1006, 1007, EOS]]
    other = next(server for server in servers if server is not first)
    assert pool.live == [servers.index(other)]
    # the survivor continued the saved prefixes: every prompt it got holds one
    assert other.asked and all(len(p) > 1 for asked in other.asked for p in asked), other.asked
    queue.close()


def test_requests_of_one_group_each_go_to_the_least_busy_server():
    """The generation queue sends a request per group, many at once: each must go to the
    server with the fewest requests in flight, not to the first server every time (the
    multinode suite's restarted server was never asked). One request after another, each
    held in flight: eight sent at the same instant on a loaded machine pick before any is
    counted (CI once saw [1, 7]), which this test does not ask about."""
    from concurrent.futures import ThreadPoolExecutor

    from maxent_grpo.train import server_pool

    servers = [PoolServer("http://a", [3, 3]), PoolServer("http://b", [3, 3])]
    pool = server_pool.ServerPool(servers, timeout=5)
    for server in servers:
        server.gate.clear()  # every request stays in flight until the test lets it go
    with ThreadPoolExecutor(8) as threads:
        calls = []
        for p in range(8):
            calls.append(threads.submit(pool.generate, [[p]], n=2, max_tokens=8))
            deadline = time.monotonic() + 10
            while sum(s.in_flight for s in servers) <= p and time.monotonic() < deadline:
                time.sleep(0.005)
            # each went to the server with fewer in flight (the first of the two on a tie)
            assert [s.in_flight for s in servers] == [p // 2 + 1, (p + 1) // 2], p
        for server in servers:
            server.gate.set()
        for call in calls:
            call.result(timeout=30)
    assert pool.prompts_served == [4, 4]  # [8, 0] before


def test_a_server_that_stops_answering_is_an_error_after_the_timeout_not_a_hang():
    server = Scripted([3, 3])
    server.gate.clear()
    queue = queue_for(server, timeout=0.3)
    work = queue.submit(4, [[1], [1]])
    started = time.monotonic()
    with pytest.raises(ServerLostError, match="did not return step 4's completions within"):
        queue.wait(work)
    with pytest.raises(ServerLostError, match="did not finish its 1 requests in flight"):
        with queue.paused():
            pass
    assert time.monotonic() - started < 5
    server.gate.set()
    queue.close()


def test_a_failed_request_is_raised_in_the_trainer_with_its_cause():
    def send(prompts, n, max_tokens):
        raise ConnectionError("connection refused")

    queue = GenerationQueue(send, 2, 8, 0, {EOS}, timeout=10, version=0)
    work = queue.submit(5, [[1], [1]])
    with pytest.raises(ServerLostError, match="failed while generating step 5 ahead: .*refused"):
        queue.wait(work)
    queue.close()


def test_busy_seconds_counts_only_the_window():
    intervals = [(0.0, 1.0), (2.0, 5.0)]
    assert busy_seconds(intervals, 0.5, 3.0) == pytest.approx(1.5)
    assert busy_seconds(intervals, 5.0, 9.0) == 0.0


def test_a_request_still_in_flight_counts_as_busy_until_now():
    """k steps ahead keep a request in flight across step ends: the server's busy time of a
    step counts the open span (before, only spans that had ended: a server never idle between
    steps read as idle)."""
    server = Scripted([3, 8])
    server.gate.clear()
    queue = queue_for(server)
    start = time.monotonic()
    work = queue.submit(2, [[2], [2]])
    time.sleep(0.3)
    assert queue.busy_seconds(start, time.monotonic()) >= 0.25
    server.gate.set()
    queue.wait(work)
    end = time.monotonic()
    assert queue.busy_seconds(start, end) >= 0.25  # the span, now ended, is still in the window
    assert queue.busy_seconds(end, end + 1.0) == 0.0  # nothing in flight since
    assert not queue.busy  # spans before the window asked are forgotten
    queue.close()


def grpo_config(**keys):
    from maxent_grpo.recipe.keys import GRPOConfig

    base = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, report_to=[])
    base.update(use_vllm=True, vllm_mode="server", async_generation=True)
    return GRPOConfig(**{**base, **keys})


def test_async_generation_is_accepted_with_a_server_and_the_correction():
    config = grpo_config()
    assert config.async_generation and config.max_staleness == 1


@pytest.mark.parametrize(
    "keys, line",
    [
        ({"vllm_mode": "colocate"}, "needs a vLLM server"),
        ({"use_vllm": False}, "needs a vLLM server"),
        ({"vllm_importance_sampling_correction": False}, "nothing would correct for it"),
        ({"num_iterations": 2}, "one generation per optimizer step"),
        (
            {"gradient_accumulation_steps": 2, "steps_per_generation": 4},
            "one generation per optimizer step",
        ),
        ({"vllm_sync_interval_steps": 2}, "max_staleness: 1 is below vllm_sync_interval_steps"),
    ],
)
def test_async_generation_refuses_what_it_cannot_do_in_one_line(keys, line):
    with pytest.raises(ConfigError, match=line):
        grpo_config(**keys)


class StandIn:
    """A server for the pool, in-process: each completion is [its weights' version, the
    prompt's first token], so a test sees which weights made it."""

    def __init__(self, url: str):
        import requests

        self.base_url, self.session, self.weights, self.down = url, requests.Session(), 0, False

    def generate(self, prompts, features=None, n=1, **params):
        import requests

        if self.down:
            raise requests.ConnectionError("connection refused")
        time.sleep(0.01)  # a request takes time: both servers get chunks
        ids = [[self.weights, p[0]] for p in prompts for _ in range(n)]
        return {"prompt_ids": prompts, "completion_ids": ids, "logprobs": None}

    def push(self, version: int) -> None:
        import requests

        if self.down:
            raise requests.ConnectionError("connection refused")
        self.weights = version


def test_each_sample_is_as_old_as_the_server_that_made_it(monkeypatch):
    from maxent_grpo.train import server_pool
    from maxent_grpo.train.async_generation import sample_staleness

    a, b = StandIn("http://a"), StandIn("http://b")
    pool = server_pool.ServerPool([a, b], timeout=5)

    def push(version: int) -> None:  # what a weight sync, then the async component, do
        pool.each(lambda client: client.push(version), "push")
        pool.mark_synced(version)

    def answer_versions() -> tuple[list, list]:
        answer = pool.generate([[p] for p in range(8)], n=2)
        made = [ids[0] for ids in answer["completion_ids"]]
        return [v for v in answer["policy_versions"] for _ in range(2)], made

    push(1)
    assert answer_versions() == ([1] * 16, [1] * 16)
    b.down = True  # lost at the next push: restarted, it would hold the base model
    push(2)
    assert pool.versions == [2, server_pool.BASE_VERSION]
    assert answer_versions() == ([2] * 16, [2] * 16)
    # Were it to answer before a push gave it the weights, its samples would count as the base
    # model's (stale, dropped), not as the last push's.
    b.down, b.weights, pool.live = False, 0, [0, 1]
    versions, made = answer_versions()
    assert sorted(set(zip(versions, made))) == [(0, 0), (2, 2)], (versions, made)
    b.down, pool.live = True, [0]
    b.down, b.weights = False, 0  # restarted with the base model: back only with the weights
    monkeypatch.setattr(server_pool, "probe", lambda url, timeout: 200)
    push(3)
    versions, made = answer_versions()
    assert versions == made == [3] * 16 and pool.prompts_served[1] > 0

    # Staleness is each sample's own: here one server was a push behind the other.
    item = Pending(6, [[1]], [[1]] * 4, version=4)
    assert sample_staleness(item, ([], None, [4, 4, 3, 3]), trained=5) == [1, 1, 2, 2]
    assert sample_staleness(item, ([], None, None), trained=5) == [1]  # one server: its push


def test_with_rollouts_the_next_request_asks_for_what_the_next_first_round_draws():
    """Over-sampling (train/rollout_rounds.py): the next step's first round generates for its
    own rows plus extra prompts from a seeded stream; read ahead, the stream must stay where
    it was, and nothing is asked when carried-over groups already fill the step."""
    from types import SimpleNamespace

    from maxent_grpo.train.rollout_rounds import Rollouts

    rollouts = Rollouts.__new__(Rollouts)  # the rules are the Rollouts component's own
    rollouts.trainer = SimpleNamespace(
        args=SimpleNamespace(oversample_factor=1.5, seed=3),
        accelerator=SimpleNamespace(num_processes=1, process_index=0),
        train_dataset=[{"prompt": f"extra {i}"} for i in range(10)],
        num_generations=2,
    )
    rollouts.carried = []
    rollouts._reserve_position, rollouts._reserve_order = 4, (-1, [])
    rows = [{"prompt": p} for p in ("a", "a", "b", "b")]  # 2 groups: the first round has 3

    ahead = rollouts.first_round_rows(rows)
    assert rollouts._reserve_position == 4
    drawn = rollouts._reserve_rows(1)  # what the step's first round then draws
    assert ahead == rows + drawn and len(drawn) == 2 and drawn[0] == drawn[1]
    rollouts.carried = ["group", "group"]  # the step is full without a round: nothing asked
    assert rollouts.first_round_rows(rows) is None


@pytest.mark.parametrize("rollouts", [False, True])
def test_a_step_made_ahead_pushes_the_weights_once_and_only_before_a_request(rollouts):
    """Without rounds, the next request goes out at once: the push comes first. With rounds
    (over-sampling), it waits for the rounds' decision (_prepare_inputs pushes then), so the
    step trained on completions made ahead pushes nothing before training: a later round of
    the same step pushes first, with the pool's versions (_sync_weights_once), then TRL's."""
    from collections import defaultdict
    from types import SimpleNamespace

    from maxent_grpo.train.async_generation import AsyncGeneration

    events = []

    def trl_generates(prompt_ids, images, multimodal, n, tools=False):
        events.append("trl generates")
        return [[0]] * len(prompt_ids), None

    trainer = SimpleNamespace(
        args=SimpleNamespace(max_staleness=1, vllm_sync_interval_steps=1),
        model=SimpleNamespace(training=True),
        state=SimpleNamespace(global_step=5),
        accelerator=SimpleNamespace(is_main_process=True, num_processes=1, process_index=0),
        _metrics={"train": defaultdict(list)},
        _last_loaded_step=4,
        vllm_generation=SimpleNamespace(sync_weights=lambda: events.append("push")),
    )
    sync = SimpleNamespace(pool=lambda: None, synced_step=None, due=lambda: True)
    component = AsyncGeneration.__new__(AsyncGeneration)
    component.trainer, component.clock, component.sync = trainer, None, sync
    component.rollouts = object() if rollouts else None
    component._step, component._held, component._resumed = 0, False, None
    component._consumed_at, component._next = None, []
    prompts = [[1], [1]]
    made = StepWork.from_state(6, [{"prompt": [1], "samples": [sample([9]), sample([8])]}])
    component._queue = GenerationQueue(None, 2, 8, 0, set(), timeout=5, version=4)
    component._pending = {6: Pending(6, prompts, prompts, version=4, work=made)}

    call = component.generate_single_turn
    assert call(trl_generates, prompts, None, None, 2) == ([[9], [8]], None)
    assert trainer._metrics["train"]["async/prefetched"] == [1.0]
    assert events == ([] if rollouts else ["push"])
    call(trl_generates, prompts, None, None, 2)  # the step's next round
    assert events == ["push", "trl generates"]
    assert trainer._last_loaded_step == 5
    component._queue.close()


def sample(tokens: list[int]) -> dict:
    return {"tokens": tokens, "logprobs": None, "versions": [(0, 4)], "done": True}
