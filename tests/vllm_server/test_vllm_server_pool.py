"""The trainers' pool over several vLLM servers (train/server_pool.py), with TRL's own
VLLMClient against stand-in servers (tests/helpers/fake_vllm.py: real HTTP, no vLLM):
requests spread by outstanding work and answered in prompt order, a lost server's requests
taken by the others, a server back only after it has the current weights.

In the vllm suite: no vLLM server runs, but TRL's VLLMClient refuses to start without the vllm
package, which `make test`'s environment does not have."""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from helpers.fake_vllm import BASE_VERSION, FakeVLLM
from maxent_grpo.train import server_pool
from maxent_grpo.train.server_pool import ServerPool, for_each
from maxent_grpo.train.vllm_sync import _reload_and_reset
from maxent_grpo.vllm_health import ServerError

pytestmark = pytest.mark.vllm

PROMPTS = [[100 + i, 7, 7] for i in range(16)]
# TRL's VLLMGeneration asks for logprobs; the stand-in answers none (TRL then returns None).
PARAMS = {"n": 2, "max_tokens": 4, "logprobs": None}


@pytest.fixture
def servers():
    made: list[FakeVLLM] = []

    def make(*delays: float) -> list[FakeVLLM]:
        made.extend(FakeVLLM(delay) for delay in delays)
        return made

    yield make
    for server in made:
        server.stop()


class Events(list):
    def __call__(self, event: str, **fields) -> None:
        self.append((event, fields))


def pool_of(fakes: list[FakeVLLM], events=None, timeout: float = 5) -> ServerPool:
    from trl.generation.vllm_client import VLLMClient  # TRL is slow to import

    clients = [VLLMClient(base_url=f.url, connection_timeout=5) for f in fakes]
    extra = {"event": events} if events is not None else {}
    return ServerPool(clients, timeout=timeout, **extra)


def sync(pool: ServerPool, version: int) -> None:
    """What disk weight sync does for every server (train/vllm_sync.py)."""
    reload = functools.partial(_reload_and_reset, directory=Path(f"/tmp/sync-{version}"))
    for_each(pool, reload, "reload_weights")


def test_one_request_is_spread_over_every_server_and_answered_in_prompt_order(servers):
    fakes = servers(0.0, 0.0)
    pool = pool_of(fakes)
    answer = pool.generate(PROMPTS, **PARAMS)
    # n completions per prompt, prompt-major, as one server answers.
    assert answer["prompt_ids"] == PROMPTS
    assert [c[1] for c in answer["completion_ids"]] == [p[0] for p in PROMPTS for _ in range(2)]
    assert answer["logprobs"] is None
    assert sum(pool.prompts_served) == len(PROMPTS)
    assert all(f.requests > 0 for f in fakes)


def test_a_slow_server_takes_less_of_the_work(servers):
    slow, fast = servers(0.3, 0.0)
    pool = pool_of([slow, fast])
    pool.generate(PROMPTS, **PARAMS)
    assert pool.prompts_served[1] > pool.prompts_served[0] > 0


def test_a_lost_server_s_requests_go_to_the_other_and_it_returns_only_with_the_weights(servers):
    events = Events()
    first, second = servers(0.0, 0.0)
    pool = pool_of([first, second], events)
    sync(pool, 1)
    assert (first.version, second.version) == (1, 1)
    second.stop()  # killed: the connection is refused
    answer = pool.generate(PROMPTS, **PARAMS)
    assert [c[1] for c in answer["completion_ids"]][::2] == [p[0] for p in PROMPTS]
    assert pool.live == [0]
    assert events[0][0] == "server_lost" and events[0][1]["url"] == second.url
    second.restart()  # the launcher restarted it: healthy, with the base weights
    pool.generate(PROMPTS, **PARAMS)
    assert pool.live == [0] and second.requests == 0  # not before it has the weights
    sync(pool, 2)  # the next sync takes it back and gives it the step's weights first
    assert [e for e, _ in events] == ["server_lost", "server_back"]
    assert (first.version, second.version) == (2, 2)
    assert set(pool.last_sync_seconds) == {first.url, second.url}
    answer = pool.generate(PROMPTS, **PARAMS)
    assert second.requests > 0
    assert {c[0] for c in answer["completion_ids"]} == {2} != {BASE_VERSION}


def test_a_weight_push_reaches_every_server_at_once(servers):
    """Issue 55: the push to several servers ran one after another (its time grew with
    vllm_nodes); now every server's reload is in flight together."""
    fakes = servers(0.0, 0.0, 0.0)
    for fake in fakes:
        fake.reload_delay = 0.3
    pool = pool_of(fakes)
    sync(pool, 1)
    assert [fake.version for fake in fakes] == [1, 1, 1]
    starts, ends = zip(*(fake.reloads[0] for fake in fakes), strict=True)
    assert max(starts) < min(ends), fake.reloads  # all three reloading at one moment
    assert set(pool.last_sync_seconds) == {fake.url for fake in fakes}


def test_a_silent_server_is_given_up_long_before_the_request_s_own_bound(servers, monkeypatch):
    """Its node's network cut: the connection stays open, nothing answers, not even /health.
    The request's own bound (timeout=60 here, vllm_server_timeout) would hold the step."""
    monkeypatch.setattr(server_pool, "HEALTH_EVERY_S", 0.1)
    monkeypatch.setattr(server_pool, "SILENT_S", 0.5)
    monkeypatch.setattr(server_pool, "PROBE_TIMEOUT", 0.2)
    monkeypatch.setattr(server_pool, "REJOIN_EVERY_S", 1.0)
    events = Events()
    first, second = servers(0.0, 0.3)
    pool = pool_of([first, second], events, timeout=60)
    sync(pool, 1)
    second.silent = True
    start = time.monotonic()
    answer = pool.generate(PROMPTS, **PARAMS)
    assert time.monotonic() - start < 5
    assert [c[1] for c in answer["completion_ids"]][::2] == [p[0] for p in PROMPTS]
    assert pool.live == [0] and [e for e, _ in events] == ["server_lost"]
    assert "did not answer" in events[0][1]["reason"]
    start = time.monotonic()
    sync(pool, 2)  # the next sync: asked whether it is back (no), not waited for
    assert time.monotonic() - start < 5 and pool.live == [0]
    second.silent = False  # its network back: asked again only after REJOIN_EVERY_S
    sync(pool, 3)
    assert pool.live == [0]
    time.sleep(1.1)
    sync(pool, 4)
    assert pool.live == [0, 1] and second.version == 4
    assert [e for e, _ in events] == ["server_lost", "server_back"]


def test_a_slow_server_that_answers_health_is_not_lost(servers, monkeypatch):
    """A long generation is not silence: its /health answers meanwhile."""
    monkeypatch.setattr(server_pool, "HEALTH_EVERY_S", 0.1)
    monkeypatch.setattr(server_pool, "SILENT_S", 0.3)
    pool = pool_of(servers(0.0, 1.0))
    answer = pool.generate(PROMPTS[:2], **PARAMS)
    assert pool.live == [0, 1] and len(answer["completion_ids"]) == 4


def test_a_weight_sync_to_a_silent_server_is_given_up_too(servers, monkeypatch):
    monkeypatch.setattr(server_pool, "HEALTH_EVERY_S", 0.1)
    monkeypatch.setattr(server_pool, "SILENT_S", 0.5)
    monkeypatch.setattr(server_pool, "PROBE_TIMEOUT", 0.2)
    first, second = servers(0.0, 0.0)
    pool = pool_of([first, second], timeout=60)
    second.silent = True
    start = time.monotonic()
    sync(pool, 1)
    assert time.monotonic() - start < 5
    assert pool.live == [0] and first.version == 1


def test_every_server_lost_fails_the_request_in_one_line(servers):
    fakes = servers(0.0, 0.0)
    pool = pool_of(fakes)
    for fake in fakes:
        fake.stop()
    with pytest.raises(ServerError, match="every vLLM server is lost"):
        pool.generate(PROMPTS, **PARAMS)


def test_a_bad_request_is_raised_not_counted_as_a_lost_server(servers):
    pool = pool_of(servers(0.0, 0.0))
    with pytest.raises(Exception, match="Request failed: 400"):
        pool.generate(PROMPTS, **{**PARAMS, "max_tokens": 0})
    assert pool.live == [0, 1]


class _NCCLClient:
    """Stand-in for a VLLMClient with an NCCL group (CUDA cannot run here): records what it
    was sent."""

    def __init__(self, url: str):
        self.base_url, self.received, self.session = url, [], _Session()

    def update_named_params(self, metadata, named_params):
        self.received.append([name for name, _ in named_params])

    def reset_prefix_cache(self):
        pass


class _Session:
    def mount(self, *args):
        pass


def test_nccl_sync_runs_the_trainer_s_iterator_once_and_sends_every_tensor_to_every_server():
    clients = [_NCCLClient("http://a:1"), _NCCLClient("http://b:1")]
    pool = ServerPool(clients, timeout=5)
    pool.rejoin = lambda: []  # no /health to probe behind the stand-ins
    pulled = []

    def gathered():  # each rank's gather collective runs once per tensor
        for name in ("w1", "w2", "w3"):
            pulled.append(name)
            yield name, object()

    pool.update_named_params([], gathered())
    assert pulled == ["w1", "w2", "w3"]
    assert [c.received for c in clients] == [[["w1", "w2", "w3"]]] * 2
