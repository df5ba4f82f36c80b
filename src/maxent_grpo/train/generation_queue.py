"""The main process's generation ahead (async_generation): every group of every step in flight
is its own request, and with partial rollouts each request is one chunk of its completions.

Why a request per group: vLLM's server batches the requests it holds, so a group that
finishes makes room for a group of a later step at once; one request per step would leave the
server decoding a step's few long completions at a fraction of its batch (the long tail) and
take nothing new until they end.

Why chunks (`partial_rollout_tokens: N`), and stopped-then-continued rather than continued
under new weights (docs/async.md): a weight push waits for the requests in flight (the server
would otherwise apply it between two decoding steps of a sequence, and which tokens each
version made would be unknown). With chunks of N tokens a push waits for at most one chunk;
the group's unfinished completions then go on from their token prefixes under the new weights,
each chunk tagged with the version that made it (`Sample.versions`). The prefixes live here,
not in the server, so a checkpoint saves them (`state`), a requeued run continues them
(`adopt`), and a lost server's chunk is asked of another (ServerPool) from the same prefix.

Pure threading and bookkeeping: `send(prompts, n, max_tokens)` is the only way out (the
trainer's client, or a stand-in in tests). No torch here.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

# send(prompts, n, max_tokens) -> (completion ids, logprobs or None, versions per prompt or None)
Send = Callable[[list[list[int]], int, int], tuple]
# Requests in flight at once: more than any step's groups times any depth we allow here.
CONCURRENCY = 64


class ServerLostError(RuntimeError):
    """The vLLM server failed or stopped answering while generating ahead: a crash (another
    attempt may succeed), with its own line, never a hang."""


@dataclass
class Sample:
    """One completion being made: its tokens so far and the version that made each chunk."""

    tokens: list[int]
    logprobs: list[float] | None
    versions: list[tuple[int, int]]  # (index of the chunk's first token, policy version)
    done: bool = False


@dataclass
class Group:
    """A prompt's num_generations completions (no samples before its first chunk is back)."""

    prompt: list[int]
    samples: list[Sample] = field(default_factory=list)
    in_flight: bool = False
    requests: int = 0  # sent for it by this queue

    @property
    def done(self) -> bool:
        return bool(self.samples) and all(s.done for s in self.samples)


@dataclass
class StepWork:
    """One optimizer step's groups, generated ahead."""

    step: int
    groups: list[Group]
    error: BaseException | None = None
    finished: float = 0.0  # monotonic time its last group came back
    done: threading.Event = field(default_factory=threading.Event)

    def payload(self) -> tuple:
        """(completion ids, logprobs or None, each completion's oldest policy version)."""
        samples = [s for g in self.groups for s in g.samples]
        logprobs = [s.logprobs for s in samples]
        return (
            [s.tokens for s in samples],
            None if any(lp is None for lp in logprobs) else logprobs,
            [s.versions[0][1] for s in samples],
        )

    def spanned(self) -> float:
        """The share of its completions made under more than one policy version."""
        samples = [s for g in self.groups for s in g.samples]
        mixed = sum(1 for s in samples if len({v for _, v in s.versions}) > 1)
        return mixed / len(samples) if samples else 0.0

    def state(self) -> list:
        return [
            {"prompt": g.prompt, "samples": [vars(s).copy() for s in g.samples]}
            for g in self.groups
        ]

    @classmethod
    def from_state(cls, step: int, groups: list) -> StepWork:
        def sample(saved: dict) -> Sample:
            return Sample(**{**saved, "versions": [tuple(v) for v in saved["versions"]]})

        work = cls(step, [Group(g["prompt"], [sample(s) for s in g["samples"]]) for g in groups])
        if all(g.done for g in work.groups):
            work.done.set()
        return work


def kept(works: list[StepWork]) -> tuple[int, int]:
    """(unfinished completions that will be continued, tokens already made) of restored work."""
    samples = [s for w in works for g in w.groups for s in g.samples]
    return sum(1 for s in samples if not s.done and s.tokens), sum(len(s.tokens) for s in samples)


def busy_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the (non-overlapping, ordered) intervals."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


class GenerationQueue:
    """Groups in flight, oldest step first, one request per group (the module doc).

    `version` is the policy version the server holds: set it after each push, which is only
    made inside `paused()` (no request in flight), so every chunk comes from one version.
    """

    def __init__(
        self,
        send: Send,
        n: int,
        max_tokens: int,
        chunk_tokens: int,
        stop_ids: set[int],
        timeout: float,
        version: int,
    ):
        self._send = send
        self.n, self.max_tokens, self.stop_ids = n, max_tokens, stop_ids
        self.chunk = chunk_tokens if 0 < chunk_tokens < max_tokens else max_tokens
        self.timeout = timeout
        self.version = version
        self._works: list[StepWork] = []
        self._cond = threading.Condition()
        self._paused = 0
        self._in_flight = 0
        self._closed = False
        self.busy: list[tuple[float, float]] = []  # spans with any request in flight, ended
        self._busy_since = 0.0
        self._pool = ThreadPoolExecutor(CONCURRENCY, thread_name_prefix="async-chunk")
        self._thread = threading.Thread(target=self._run, name="async-generation", daemon=True)
        self._thread.start()

    # ---- the trainer's side ------------------------------------------------------------

    def submit(self, step: int, all_prompt_ids: list[list[int]]) -> StepWork:
        """Generate a step's groups (every n-th prompt: TRL repeats each n times)."""
        work = StepWork(step, [Group(list(p)) for p in all_prompt_ids[:: self.n]])
        self.adopt([work])
        return work

    def adopt(self, works: list[StepWork]) -> None:
        """Take work made elsewhere (a checkpoint's): its unfinished samples go on."""
        with self._cond:
            self._works += [w for w in works if not w.done.is_set()]
            self._works.sort(key=lambda w: w.step)
            self._cond.notify_all()

    def wait(self, work: StepWork) -> tuple:
        """The step's payload; ServerLostError after `timeout` or the server's failure."""
        if not work.done.wait(self.timeout):
            raise ServerLostError(
                f"the vLLM server did not return step {work.step}'s completions within "
                f"vllm_server_timeout ({self.timeout:g}s) while generating ahead"
            )
        if work.error is not None:
            raise ServerLostError(
                f"the vLLM server failed while generating step {work.step} ahead: "
                f"{type(work.error).__name__}: {work.error}"
            ) from work.error
        return work.payload()

    @contextlib.contextmanager
    def paused(self):
        """No new chunk starts until the block ends; the block starts once none is in flight
        (a weight push, a checkpoint's snapshot). Bounded: ServerLostError after `timeout`."""
        with self._cond:
            self._paused += 1
            deadline = time.monotonic() + self.timeout
            while self._in_flight and time.monotonic() < deadline:
                self._cond.wait(deadline - time.monotonic())
            if self._in_flight:
                self._paused -= 1
                self._cond.notify_all()
                raise ServerLostError(
                    f"the vLLM server did not finish its {self._in_flight} requests in flight "
                    f"within vllm_server_timeout ({self.timeout:g}s)"
                )
        try:
            yield
        finally:
            with self._cond:
                self._paused -= 1
                self._cond.notify_all()

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self._in_flight

    def drop(self, steps: set[int]) -> None:
        """Stop generating for these steps (already trained, or dropped)."""
        with self._cond:
            self._works = [w for w in self._works if w.step not in steps]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ---- the worker ----------------------------------------------------------------------

    def _next_group(self) -> tuple[StepWork, Group] | None:
        if self._paused or self._in_flight >= CONCURRENCY:
            return None
        for work in self._works:
            if work.error is None:
                for group in work.groups:
                    if not group.in_flight and not group.done:
                        return work, group
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                found = self._next_group()
                while found is None and not self._closed:
                    self._cond.wait()
                    found = self._next_group()
                if self._closed:
                    return
                work, group = found
                group.in_flight = True
                if self._in_flight == 0:
                    self._busy_since = time.monotonic()
                self._in_flight += 1
                version = self.version
            try:
                self._pool.submit(self._chunk, work, group, version)
            except RuntimeError:  # closed meanwhile: nothing more is asked
                return

    def _chunk(self, work: StepWork, group: Group, version: int) -> None:
        try:
            self._extend(group, version)
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer's thread
            self._settle(work, group, error=exc)
            return
        self._settle(work, group)

    def _extend(self, group: Group, version: int) -> None:
        """One request: the group's first chunk (n completions of its prompt), or the next
        chunk of each unfinished completion (its prompt and prefix, one completion each)."""
        group.requests += 1
        if group.requests > -(-self.max_tokens // self.chunk) + 1:
            raise RuntimeError(  # every chunk adds tokens or ends a completion: a bug if not
                f"a group was asked for {group.requests} chunks of at most {self.chunk} tokens "
                f"toward {self.max_tokens}"
            )
        going = [s for s in group.samples if not s.done]
        made = going[0].tokens if going else []
        budget = min(self.chunk, self.max_tokens - len(made))
        prompts = [group.prompt + s.tokens for s in going] if going else [group.prompt]
        per_prompt = 1 if going else self.n
        ids, logprobs, versions = self._send(prompts, per_prompt, budget)
        if len(ids) != len(prompts) * per_prompt:
            raise RuntimeError(
                f"the vLLM server answered {len(ids)} completions for "
                f"{len(prompts) * per_prompt} asked"
            )
        if not going:  # the first chunk: the group's n samples
            going = [Sample([], [] if logprobs is not None else None, []) for _ in ids]
            group.samples = going
        for i, (sample, new) in enumerate(zip(going, ids, strict=True)):
            server = versions[i // per_prompt] if versions else None  # a pool's, per prompt
            sample.versions.append((len(sample.tokens), version if server is None else server))
            sample.tokens += new
            if sample.logprobs is not None and logprobs is not None:
                sample.logprobs += logprobs[i]
            sample.done = (
                len(new) < budget
                or (bool(new) and new[-1] in self.stop_ids)
                or len(sample.tokens) >= self.max_tokens
            )

    def busy_seconds(self, start: float, end: float) -> float:
        """Seconds of [start, end] with any request in flight, the span still open included
        (k steps ahead keep the server busy across steps); spans ended before `start` are
        forgotten: the caller asks for consecutive windows."""
        with self._cond:
            spans = list(self.busy)
            if self._in_flight > 0:
                spans.append((self._busy_since, end))
            self.busy = [span for span in self.busy if span[1] > start]
        return busy_seconds(spans, start, end)

    def _settle(self, work: StepWork, group: Group, error: BaseException | None = None) -> None:
        with self._cond:
            group.in_flight = False
            self._in_flight -= 1
            if self._in_flight == 0:
                self.busy.append((self._busy_since, time.monotonic()))
            if error is not None and work.error is None:
                work.error = error
            if error is not None or all(g.done for g in work.groups):
                work.finished = time.monotonic()
                self._works = [w for w in self._works if w is not work]
                work.done.set()
            self._cond.notify_all()
