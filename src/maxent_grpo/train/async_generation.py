"""Asynchronous generation (`async_generation: true`): the vLLM server generates the next
step's completions while the trainers score and train on this step's.

Why inside our trainer, not TRL's `AsyncGRPOTrainer` (docs/architecture.md): TRL's is another
trainer (its own base, data path and loss), pushes weights over NCCL only (no CPU, no disk or
LoRA sync), and would leave out MaxEnt-GRPO, rollout filters and the state registry.

The pipeline, one step deep, with every collective on the main thread:
- `get_batch_samples` (HF's fetch of a step's batches) also fetches the next step's batches
  and gathers their prompt token ids on the main process (a collective, on every rank);
- step k's first generation call (`_generate_single_turn`) waits for step k's completions
  (generated during step k-1), pushes the weights of the k-1 steps done (TRL's rule: once per
  step, or every `vllm_sync_interval_steps`), hands step k+1's prompts to the worker thread,
  and broadcasts step k's completions from the main process (TRL's own broadcast);
- the worker thread (main process only) sends step k+1's request while the trainers score and
  train step k. Only it talks to the server between syncs; a sync never overlaps a request,
  so every completion comes from one known policy version.

With rollout rounds or over-sampling (train/rollout_rounds.py), a step's first round asks for
its own prompts plus extra ones, or for nothing when carried-over groups fill the step: only
known once the step before has filtered. So there the next request is sent after the step's
rollout decision (`_prepare_inputs`, before its training), for exactly the prompts the next
step's first round will draw (Rollouts `first_round_rows`); it overlaps the training, not the
scoring.
The push goes with that request (or before a later round of the step): a step trained on
completions made ahead does not push when they arrive, so a step filled by carried groups,
which sends the next request, is the only push of the two (bench/bench_async.py, oversample).

A sample is `staleness` = (policy version trained) - (version that generated it) steps old:
1 here (k-1 steps done at step k, generated from k-2), up to `vllm_sync_interval_steps`. With
several servers (train/server_pool.py) the version is that of the server that made the sample.
When a sample is older than `max_staleness`, the step's samples are dropped (counted) and
the step generates afresh. A step whose prompts have no completions waiting (the first step, the
first of an epoch, a round other than the first, a prompt set the rollout rounds changed)
generates synchronously.

The completions waiting for the next step are registered trainer state (`async_generation`,
train/state.py): a checkpoint waits for them (bounded) and saves them with their policy
version, so a resumed run trains its first step on the completions an uninterrupted run would.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass, field

from maxent_grpo.train import trl_adapter
from maxent_grpo.train.state import state_registry

logger = logging.getLogger(__name__)


class ServerLostError(RuntimeError):
    """The vLLM server failed or stopped answering while generating ahead: a crash (another
    attempt may succeed), with its own line, never a hang."""


@dataclass
class Pending:
    """One step's generation, sent ahead by the worker (payload on the main process only)."""

    step: int  # the optimizer step (1-based) that trains on it
    prompt_ids: list[list[int]]  # this process's prompts, as TRL tokenizes them
    all_prompt_ids: list[list[int]] | None  # every process's (main process only)
    version: int = -1  # optimizer steps in the weights that generated it
    # (completion_ids, logprobs, each completion's policy version or None) of all processes
    payload: tuple | None = None
    error: BaseException | None = None
    started: float = 0.0
    finished: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


class GenerationWorker:
    """A daemon thread that sends one request at a time (the main process's only)."""

    def __init__(self, generate, timeout: float):
        self._generate = generate  # (all_prompt_ids) -> (completion_ids, logprobs)
        self._timeout = timeout
        self._todo: list[Pending] = []
        self._wake = threading.Condition()
        self._closed = False
        self.busy: list[tuple[float, float]] = []  # (start, end) of each request
        self._thread = threading.Thread(target=self._run, name="async-generation", daemon=True)
        self._thread.start()

    def submit(self, item: Pending) -> None:
        with self._wake:
            self._todo.append(item)
            self._wake.notify()

    def wait(self, item: Pending) -> tuple:
        """The item's completions; ServerLostError after the server's timeout or its failure."""
        if not item.done.wait(self._timeout):
            raise ServerLostError(
                f"the vLLM server did not return step {item.step}'s completions within "
                f"vllm_server_timeout ({self._timeout:g}s) while generating ahead"
            )
        if item.error is not None:
            raise ServerLostError(
                f"the vLLM server failed while generating step {item.step} ahead: "
                f"{type(item.error).__name__}: {item.error}"
            ) from item.error
        return item.payload

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._todo and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                item = self._todo.pop(0)
            item.started = time.monotonic()
            try:
                item.payload = self._generate(item.all_prompt_ids)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                item.error = exc
            item.finished = time.monotonic()
            self.busy.append((item.started, item.finished))
            item.done.set()


def sample_staleness(item: Pending, payload: tuple | None, trained: int) -> list[int]:
    """Each sample's staleness: `trained` (the policy version training on it) minus the
    version of the server that made it (payload's third part, from a ServerPool), or of the
    weights pushed before the request (item.version) where the server's is not known."""
    versions = payload[2] if payload is not None and len(payload) > 2 else None
    if not versions:
        return [trained - item.version]
    return [trained - (item.version if v is None else v) for v in versions]


def busy_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds of [start, end] covered by the (non-overlapping, ordered) intervals."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in intervals)


class AsyncGeneration:
    """Component (train/components.py), with `async_generation` and a vLLM server: the module
    doc. Reads the round rules of the Rollouts component (when on), reports the server's
    request time to the step clock and takes the servers' policy version from VLLMSync."""

    name = "async_generation"
    needs = ("step_clock", "rollouts", "vllm_sync")

    def __init__(self, trainer, step_clock=None, rollouts=None, vllm_sync=None):
        self.trainer = trainer
        self.clock = step_clock
        self.rollouts = rollouts  # rounds or over-sampling: the request waits for the rounds
        self.sync = vllm_sync
        self._ahead = None  # (epoch iterator, batches, num_items) of the next step
        self._next: Pending | None = None  # the next step's prompts, gathered, not yet sent
        self._next_rows: list[dict] | None = None  # with rollouts: sent after the rounds
        self._pending: Pending | None = None  # the next step's generation, sent or restored
        self._worker: GenerationWorker | None = None
        self._consumed_at: float | None = None
        self._step = 0  # the step whose first generation has been served
        state_registry(trainer).register(
            "async_generation", self._state, self._load, per_process=True
        )

    # ---- the next step's prompts ----------------------------------------------------------

    def batch_samples(self, call, epoch_iterator, num_batches, device):
        # HF's training loop only (the model is put in train mode later, in training_step).
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead[0] is epoch_iterator and ahead[1]:
            current = ahead[1], ahead[2]
        else:  # the first step, or the first of an epoch: nothing fetched ahead
            current = call(epoch_iterator, num_batches, device)
        batches, items = call(epoch_iterator, num_batches, device)
        self._ahead = (epoch_iterator, batches, items)
        if self.rollouts is not None:  # sent once this step's rounds are decided
            self._next_rows = batches[0] if batches else None
            return current
        # Every rank calls this at the same point: the gather inside is a collective.
        step = self.trainer.state.global_step + 2
        self._next = self._gathered(step, batches[0]) if batches else None
        return current

    def prepare_inputs(self, call, generation_batch):
        inputs = call(generation_batch)
        if self._next_rows is not None and self.trainer.model.training:  # every rank, in step
            rows, self._next_rows = self._next_rows, None
            first = self.rollouts.first_round_rows(rows)
            if first is not None:
                self._sync_weights_once()  # a step without a round has not pushed yet
                self._next = self._gathered(self.trainer.state.global_step + 2, first)
                self._send_next()
        return inputs

    def _gathered(self, step: int, rows: list[dict]) -> Pending:
        from accelerate.utils import gather_object

        prompts = copy.deepcopy([row["prompt"] for row in rows])  # as TRL's _generate
        prompt_ids, images, _ = trl_adapter.tokenize_prompts(self.trainer, prompts)
        everyone = gather_object(prompt_ids)
        main = self.trainer.accelerator.is_main_process and images is None
        return Pending(step, prompt_ids, everyone if main else None)

    # ---- a step's first generation ---------------------------------------------------------

    def generate_single_turn(self, call, prompt_ids, images, *rest):
        trainer = self.trainer
        step = trainer.state.global_step + 1
        training = trainer.model.training
        if not (training and self._step != step) or images is not None:
            # later rounds, tool turns, eval: TRL's
            if training:
                self._sync_weights_once()  # a push deferred below, with the pool's versions
            return call(prompt_ids, images, *rest)
        self._step = step
        item, self._pending = self._pending, None
        waited = time.monotonic()
        decision = None
        if trainer.accelerator.is_main_process:
            ready = item is not None and item.step == step
            payload = self._collect(item) if ready else None
            decision = self._decide(item if ready else None, prompt_ids, payload, waited)
        decision = self._shared(decision)
        if not (decision["use"] and self.rollouts is not None):
            # With rounds the next request waits for the rounds' decision and pushes then
            # (prepare_inputs); a step filled by carried groups sends it with no push between.
            self._sync_weights_once()
        self._record(decision)
        if decision["use"]:
            result = self._local_slice(decision["payload"], prompt_ids, item)
        else:
            result = call(prompt_ids, images, *rest)
        self._send_next()
        return result

    def _collect(self, item: Pending) -> tuple:
        if item.done.is_set() and item.error is None:
            return item.payload
        return self._worker.wait(item)

    def _decide(self, item: Pending | None, prompt_ids, payload, waited: float) -> dict:
        """The main process's decision for this step, shared with the others."""
        now = time.monotonic()
        trained = self.trainer.state.global_step
        ages = None if item is None else sample_staleness(item, payload, trained)
        stale = [age for age in ages or [] if age > self.trainer.args.max_staleness]
        use = item is not None and not stale and item.all_prompt_ids is not None
        use = use and item.prompt_ids == prompt_ids
        serving = None  # the server's request seconds since the step before consumed
        if self._worker is not None and self._consumed_at is not None:
            serving = busy_seconds(self._worker.busy, self._consumed_at, now)
            del self._worker.busy[:-2]  # older intervals end before this step began
        self._consumed_at = now
        return {
            "use": use,
            "payload": payload if use else None,
            "staleness": (sum(ages) / len(ages), max(ages)) if use and ages else None,
            "dropped": len(item.all_prompt_ids) if stale and item.all_prompt_ids else 0,
            "ready_before": item is not None and item.finished and item.finished <= waited,
            "wait_s": now - waited,
            "server_s": serving,
        }

    def _shared(self, decision: dict | None) -> dict:
        from accelerate.utils import broadcast_object_list

        if self.trainer.accelerator.num_processes == 1:
            return decision
        box = [decision]
        broadcast_object_list(box, from_process=0)
        return box[0]

    def _record(self, decision: dict) -> None:
        metrics = trl_adapter.metrics(self.trainer)
        if decision["staleness"] is not None:
            mean, worst = decision["staleness"]
            metrics["async/staleness_mean"].append(float(mean))
            metrics["async/staleness_max"].append(float(worst))
        metrics["async/prefetched"].append(float(decision["use"]))
        metrics["async/dropped_stale"].append(float(decision["dropped"]))
        metrics["async/queue_depth"].append(float(decision["ready_before"]))
        metrics["async/wait_s"].append(decision["wait_s"])
        if decision["server_s"] is not None and self.clock is not None:
            self.clock.add("server_generation", decision["server_s"])  # time/server_busy

    def _local_slice(self, payload: tuple, prompt_ids, item: Pending | None):
        completion_ids, logprobs = payload[0], payload[1]
        rank, size = self.trainer.accelerator.process_index, len(prompt_ids)
        if item is None or item.prompt_ids != prompt_ids:
            raise RuntimeError(
                "async_generation: this process's prompts differ from the main process's "
                "prefetched step (the ranks disagree on the step's data)"
            )
        rows = slice(rank * size, (rank + 1) * size)
        return completion_ids[rows], (logprobs[rows] if logprobs is not None else None)

    def _sync_weights_once(self) -> None:
        """TRL's rule, before the step's generation: push the weights once per step (the
        interval is vllm_sync.py's); afterwards TRL's own call finds nothing to do."""
        trainer = self.trainer
        step = trainer.state.global_step
        if step != trl_adapter.last_loaded_step(trainer):
            trainer.vllm_generation.sync_weights()
            trl_adapter.set_last_loaded_step(trainer, step)
            pool = self.sync.pool()
            if pool is not None and self.sync.synced_step is not None:
                pool.mark_synced(self.sync.synced_step)  # the servers that took this push

    # ---- the worker --------------------------------------------------------------------------

    def _send_next(self) -> None:
        item, self._next = self._next, None
        if item is None:
            return
        item.version = self.sync.synced_step
        if item.version is None:
            item.version = self.trainer.state.global_step
        self._pending = item
        if item.all_prompt_ids is None:  # not the main process: it only keeps the prompts
            return
        if self._worker is None:
            timeout = self.trainer.args.vllm_server_timeout
            self._worker = GenerationWorker(self._request, timeout)
        self._worker.submit(item)

    def _request(self, all_prompt_ids: list[list[int]]) -> tuple:
        """TRL's server request for every process's prompts (vllm_generation.py), in the
        worker thread: unique prompts, num_generations completions each."""
        generation, n = self.trainer.vllm_generation, self.trainer.num_generations
        output = generation.vllm_client.generate(
            prompts=all_prompt_ids[::n],
            n=n,
            repetition_penalty=generation.repetition_penalty,
            temperature=generation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
            min_p=0.0 if generation.min_p is None else generation.min_p,
            max_tokens=generation.max_completion_length,
            logprobs=generation.logprobs,
            structured_outputs_regex=generation.structured_outputs_regex,
            generation_kwargs=generation.generation_kwargs,
        )
        logprobs = output["logprobs"]
        if logprobs is not None:
            logprobs = [[lp[0] for lp in seq] for seq in logprobs]
        per_prompt = output.get("policy_versions")  # a ServerPool: each server's version
        versions = None if per_prompt is None else [v for v in per_prompt for _ in range(n)]
        return output["completion_ids"], logprobs, versions

    # ---- checkpoints ---------------------------------------------------------------------------

    def _state(self) -> dict:
        item = self._pending
        if item is None:
            return {"step": -1}
        if item.all_prompt_ids is not None and not item.done.is_set():
            logger.warning(
                "async_generation: the checkpoint waits for step %d's completions, in flight",
                item.step,
            )
        payload = self._collect(item) if item.all_prompt_ids is not None else None
        return {
            "step": item.step,
            "version": item.version,
            "prompt_ids": item.prompt_ids,
            "all_prompt_ids": item.all_prompt_ids,
            "payload": payload,
        }

    def _load(self, state: dict) -> None:
        if state["step"] < 0:
            self._pending = None
            return
        item = Pending(int(state["step"]), state["prompt_ids"], state["all_prompt_ids"])
        item.version, item.payload = int(state["version"]), state["payload"]
        item.done.set()
        self._pending = item
        logger.warning(
            "async_generation: resumed with step %d's completions (policy version %d)",
            item.step,
            item.version,
        )
