"""Several vLLM servers behind one client (vllm_nodes > 1): the trainers' router.

The main process holds one TRL VLLMClient per server (the launcher's plan puts their URLs in
SERVERS_VARIABLE) and a ServerPool in place of the one client TRL's VLLMGeneration uses:

- Generation: the request's prompts are cut into small chunks (CHUNKS_PER_SERVER per live
  server) and each live server takes the next chunk as soon as it has answered its last, so
  work goes by outstanding work (a slow or busy server takes fewer chunks); calls made at
  once (async generation's, a group each) go first to the server with the fewest requests
  in flight (`outstanding`). Answers are put
  back in prompt order, so the trainer sees one request's answer. A server that refuses the
  connection, times out (the recipe's vllm_server_timeout) or answers 5xx is lost: its chunk
  goes to the others, and the step goes on; with no server left the step fails.
- A silent server (its node's network cut: no refusal, no reset, an open connection that
  never answers): while a request is out, the server's /health is asked every HEALTH_EVERY_S;
  one that has not answered it for SILENT_S is lost at once, without waiting for the request's
  own bound (vllm_server_timeout, minutes: a long generation is not silence, /health answers
  during it).
- Weight sync (disk, lora, nccl): each call goes to every live server at once, one thread a
  server, timed per server (`last_sync_seconds`), and a server that fails it is lost. Before
  each sync, lost servers that answer /health again (the launcher restarts them,
  launch/server_group.py) rejoin, so they get the step's weights before they take a request
  (each lost server is asked at most once every REJOIN_EVERY_S).
- Policy versions (async_generation): `mark_synced(version)` after a push records the version
  each server that took it now holds; each answer says, per prompt, the version of the server
  that made it (`policy_versions`), so a sample's staleness is measured against its own
  server. A lost server is taken to hold version 0 (BASE_VERSION: restarted, it has the base
  model) until a push gives it the weights: should it ever answer before that, its samples
  count as that old (dropped as stale), not as the last push's.

Why not the `vllm-router` package: it is a separate Rust process to start, watch and restart,
it does not carry the weight-sync calls (dev-mode /collective_rpc, the NCCL group per server)
and it cannot tell the trainer which server has which weights; the pool is a few dozen lines
over TRL's own client.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import requests
from requests.adapters import HTTPAdapter

from maxent_grpo.vllm_health import PROBE_TIMEOUT, ServerError, probe

CHUNKS_PER_SERVER = 4
CONNECT_TIMEOUT_S = 10.0
# A request's server must answer /health at least once every SILENT_S (asked every
# HEALTH_EVERY_S, each probe bounded by PROBE_TIMEOUT): a silent node holds a step for about
# SILENT_S + HEALTH_EVERY_S + PROBE_TIMEOUT (30 s), not for vllm_server_timeout.
HEALTH_EVERY_S = 5.0
SILENT_S = 20.0
# A lost server is asked whether it is back at a weight sync at most once every REJOIN_EVERY_S:
# a dead node does not refuse, the probe waits (3 s per step measured on the test cluster).
REJOIN_EVERY_S = 30.0
# The policy version of a restarted server: the base model, before any optimizer step.
BASE_VERSION = 0
# What loses a server (the others take its work); anything else is the request's own fault.
LOST = (requests.ConnectionError, requests.Timeout)


def _is_lost(exc: Exception) -> bool:
    """A refused or silent server, or one answering 5xx (TRL: "Request failed: 503, ...";
    our weight-sync calls: "... HTTP 500: ...")."""
    text = str(exc)
    return isinstance(exc, LOST) or text.startswith("Request failed: 5") or "HTTP 5" in text


# Keys of TRL's generate() answer, each one entry per prompt or per completion.
ANSWER_KEYS = ("prompt_ids", "completion_ids", "logprobs", "logprob_token_ids")


class _Bounded(HTTPAdapter):
    """No retries (another server takes the work) and a timeout on every request: TRL's
    session retries a refused connection for about a minute and waits forever for an answer."""

    def __init__(self, timeout: float):
        super().__init__(max_retries=0, pool_maxsize=64)
        self.timeout = timeout

    def send(self, request, **kwargs):
        if kwargs.get("timeout") is None:
            kwargs["timeout"] = (CONNECT_TIMEOUT_S, self.timeout)
        return super().send(request, **kwargs)


def _no_event(event: str, **fields) -> None:
    return None


class ServerPool:
    """One TRL VLLMClient per server behind the client interface TRL's generation uses:
    requests spread by outstanding work, lost servers dropped and rejoined (module docstring)."""

    def __init__(self, clients: list, timeout: float, event: Callable[..., None] = _no_event):
        self.clients = list(clients)
        for client in self.clients:
            client.session.mount("http://", _Bounded(timeout))
            client.session.mount("https://", _Bounded(timeout))
        self.live = list(range(len(self.clients)))
        self.event = event
        self.prompts_served = [0] * len(self.clients)  # per server, since the start
        self.outstanding = [0] * len(self.clients)  # requests in flight, of every call
        self._counting = threading.Lock()
        self.last_sync_seconds: dict[str, float] = {}  # per server URL, the last sync
        self.device = None  # NCCL sync: the trainer's device, for a rejoining server's group
        # policy version held (None: not tracked yet, the version pushed before the request)
        self.versions: list[int | None] = [None] * len(self.clients)
        self._given: list[int] = []  # the servers that took the last weight push
        self._asked: dict[int, float] = {}  # lost server -> when rejoin() may ask it again

    @property
    def urls(self) -> list[str]:
        return [c.base_url for c in self.clients]

    @property
    def model(self) -> str:
        return self.clients[0].model

    @model.setter
    def model(self, name: str) -> None:  # LoRA sync: requests name the adapter, on every server
        for client in self.clients:
            client.model = name

    def _lose(self, index: int, why: str) -> None:
        if index in self.live:
            self.live.remove(index)
            self.versions[index] = BASE_VERSION  # what it holds if it comes back, until a push
            self._asked.pop(index, None)  # asked again at the next sync
            url = self.clients[index].base_url
            print(
                f"vLLM server {url} lost ({why}); the other servers take its requests", flush=True
            )
            self.event("server_lost", url=url, reason=why, by="trainer")

    def _check_any(self) -> None:
        if not self.live:
            raise ServerError(f"every vLLM server is lost ({', '.join(self.urls)})")

    def generate(self, prompts: list, features: list | None = None, **params) -> dict:
        """TRL's VLLMClient.generate over the live servers; the answer in prompt order."""
        self._check_any()
        size = max(1, -(-len(prompts) // (CHUNKS_PER_SERVER * len(self.live))))
        chunks = [range(i, min(i + size, len(prompts))) for i in range(0, len(prompts), size)]
        todo: queue.Queue[int] = queue.Queue()
        for number in range(len(chunks)):
            todo.put(number)
        answers: dict[int, dict] = {}
        made_by: dict[int, int] = {}  # chunk -> the server that answered it

        def serve(index: int) -> None:
            client = self.clients[index]
            while len(answers) < len(chunks) and index in self.live:
                try:
                    number = todo.get(timeout=0.05)
                except queue.Empty:
                    continue
                part = chunks[number]
                self._count(index, 1)
                try:
                    answers[number] = self._watched(
                        index,
                        functools.partial(
                            client.generate,
                            [prompts[i] for i in part],
                            None if features is None else [features[i] for i in part],
                            **params,
                        ),
                    )
                    made_by[number] = index
                    self.prompts_served[index] += len(part)
                except Exception as exc:
                    if not _is_lost(exc):  # the request's own fault: no server would answer
                        answers[number] = {"error": exc}
                        return
                    todo.put(number)
                    self._lose(index, f"{type(exc).__name__} during generation: {str(exc)[:200]}")
                finally:
                    self._count(index, -1)

        # The least busy server's thread starts first and takes the first chunk: a request of
        # one chunk (the generation queue's, a group each, many at once) goes to the server
        # with the fewest requests in flight, not always to the first one.
        self._run_each(serve, sorted(self.live, key=lambda i: (self.outstanding[i], i)))
        failed = [a["error"] for a in answers.values() if "error" in a]
        if failed:
            raise failed[0]
        self._check_any()
        answer = {key: _joined(answers, len(chunks), key) for key in ANSWER_KEYS}
        versions = [self.versions[made_by[number]] for number in range(len(chunks))]
        answer["policy_versions"] = [v for v, part in zip(versions, chunks) for _ in part]
        return answer

    def _count(self, index: int, change: int) -> None:
        with self._counting:  # calls run on several threads at once (the generation queue)
            self.outstanding[index] += change

    def _watched(self, index: int, call: Callable):
        """call() on a thread of its own, given up (requests.Timeout) when its server stops
        answering /health for SILENT_S; the abandoned call ends at its own timeout."""
        done, outcome = threading.Event(), {}

        def run() -> None:
            try:
                outcome["value"] = call()
            except Exception as exc:
                outcome["error"] = exc
            finally:
                done.set()

        threading.Thread(target=run, daemon=True).start()
        url = f"{self.clients[index].base_url}/health"
        answered = time.monotonic()
        while not done.wait(HEALTH_EVERY_S):
            if probe(url, timeout=PROBE_TIMEOUT) == 200:
                answered = time.monotonic()
            elif time.monotonic() - answered > SILENT_S and not done.is_set():
                raise requests.Timeout(f"{url} did not answer for {SILENT_S:g}s (node silent)")
        if "error" in outcome:
            raise outcome["error"]
        return outcome.get("value")

    def mark_synced(self, version: int) -> None:
        """The servers that took the last weight push (and are still live) hold `version`."""
        for index in self._given:
            if index in self.live:
                self.versions[index] = version

    def _run_each(self, work: Callable[[int], None], indices: list[int]) -> None:
        threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in indices]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def rejoin(self) -> list[str]:
        """Lost servers that answer /health again go back to the live ones (call it right
        before a weight sync, which then gives them the current weights)."""
        back = []
        for index, client in enumerate(self.clients):
            if index in self.live or time.monotonic() < self._asked.get(index, 0.0):
                continue
            self._asked[index] = time.monotonic() + REJOIN_EVERY_S
            if probe(f"{client.base_url}/health", timeout=PROBE_TIMEOUT) == 200:
                if self.device is not None:  # a restarted server has a new NCCL group
                    client.init_communicator(device=self.device)
                self.live.append(index)
                back.append(client.base_url)
                print(f"vLLM server {client.base_url} is back; it gets the weights first")
                self.event("server_back", url=client.base_url, by="trainer")
        self.live.sort()
        return back

    def each(self, call: Callable, what: str, rejoin: bool = True, watch: bool = True) -> None:
        """call(client) on every live server at once (weight sync: the push takes about the
        slowest server's time, not the sum), timed per server; a server that fails it is
        lost; raises when none is left. rejoin: lost servers that answer again first (only
        for a call that gives them the weights). watch: each call given up when its server
        goes silent (_watched)."""
        if rejoin:
            self.rejoin()
        self._check_any()
        live = list(self.live)
        with ThreadPoolExecutor(max_workers=len(live), thread_name_prefix="push") as workers:
            outcomes = list(workers.map(lambda index: self._timed(index, call, watch), live))
        self.last_sync_seconds = {}
        given = []
        for index, (seconds, error) in zip(live, outcomes, strict=True):
            if error is not None:
                if not _is_lost(error):
                    raise error
                self._lose(index, f"{what} failed: {str(error)[:200]}")
                continue
            self.last_sync_seconds[self.clients[index].base_url] = seconds
            given.append(index)
        if rejoin:  # a call that gives the weights (not reset_prefix_cache)
            self._given = given
        self._check_any()

    def _timed(self, index: int, call: Callable, watch: bool) -> tuple[float, Exception | None]:
        """call(client) of one server on this worker thread: (seconds, the error or None)."""
        if self.device is not None:  # NCCL: CUDA's current device is per thread
            import torch

            torch.cuda.set_device(self.device)
        client, start = self.clients[index], time.perf_counter()
        try:
            if watch:
                self._watched(index, functools.partial(call, client))
            else:
                call(client)
        except Exception as exc:
            return 0.0, exc
        return time.perf_counter() - start, None

    def reset_prefix_cache(self) -> None:
        self.each(lambda client: client.reset_prefix_cache(), "reset_prefix_cache", rejoin=False)

    def update_named_params(self, metadata, named_params) -> None:
        """NCCL sync: the trainer's iterator runs once (every rank gathers in step), so its
        tensors are kept until every server has had them: one copy of the weights on the main
        process's device for the length of the sync."""
        tensors = list(named_params)
        # Not watched: NCCL's broadcast runs on the device the group was made on (each push
        # thread sets it); a silent server fails it at NCCL's own timeout. Untested here:
        # no CUDA (test_vllm_server_pool's stand-in clients run the threads, not NCCL).
        self.each(
            lambda c: c.update_named_params(metadata, iter(tensors)),
            "NCCL weight sync",
            watch=False,
        )

    def init_communicator(self, device) -> None:
        self.device = device
        for client in self.clients:
            client.init_communicator(device=device)

    def __getattr__(self, name: str):
        # Reads that any server answers alike (get_server_info, get_world_size, ...).
        return getattr(self.clients[self.live[0] if self.live else 0], name)


def _joined(answers: dict[int, dict], count: int, key: str):
    parts = [answers[number].get(key) for number in range(count)]
    if any(part is None for part in parts):
        return None
    return [item for part in parts for item in part]


def for_each(client, call: Callable, what: str) -> None:
    """call(client) on one server, or on every live server of a pool."""
    if isinstance(client, ServerPool):
        client.each(call, what)
    else:
        call(client)
