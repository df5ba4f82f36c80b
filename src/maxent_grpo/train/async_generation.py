"""Asynchronous generation (`async_generation: true`): the vLLM server generates the next
steps' completions while the trainers score and train on this step's.

Why inside our trainer, not TRL's `AsyncGRPOTrainer` (docs/architecture.md): TRL's is another
trainer (its own base, data path and loss), pushes weights over NCCL only (no CPU, no disk or
LoRA sync), and would leave out MaxEnt-GRPO, rollout filters and the state registry.

The pipeline, `depth` steps deep (max_staleness - vllm_sync_interval_steps + 1: every sample
stays within max_staleness), with every collective on the main thread:
- `get_batch_samples` (HF's fetch of a step's batches) also fetches up to `depth` steps'
  batches ahead and gathers their prompt token ids on the main process (a collective, on
  every rank);
- step k's first generation call (`_generate_single_turn`) waits for step k's completions
  (generated during the steps before), pushes the weights of the k-1 steps done (TRL's rule:
  once per step, or every `vllm_sync_interval_steps`), hands step k+depth's prompts to the
  generation queue, and broadcasts step k's completions from the main process (TRL's own
  broadcast);
- the queue (train/generation_queue.py, main process only) keeps every group of the steps
  ahead in flight, a request per group, so the server's batch is refilled from later steps
  as groups finish; a push waits for the requests in flight (`paused`), at most one chunk of
  `partial_rollout_tokens` tokens with partial rollouts, after which unfinished completions
  go on from their prefixes under the new weights.

With rollout rounds or over-sampling (train/rollout_rounds.py; depth 1, recipe check), a
step's first round asks for its own prompts plus extra ones, or for nothing when carried-over
groups fill the step: only known once the step before has filtered. So there the next request
is sent after the step's rollout decision (`_prepare_inputs`, before its training), for exactly
the prompts the next step's first round will draw (Rollouts `first_round_rows`); it overlaps
the training, not the scoring. The push goes with that request (or before a later round of the
step): a step trained on completions made ahead does not push when they arrive, so a step
filled by carried groups, which sends the next request, is the only push of the two
(bench/bench_async.py, oversample).

A sample is `staleness` = (policy version trained) - (version that generated its first token)
steps old: `depth` here, up to depth + vllm_sync_interval_steps - 1. With several servers
(train/server_pool.py) the version is that of the server that made the chunk. When a sample is
older than `max_staleness` (a resumed run's), the step's samples are dropped (counted) and the
step generates afresh. A step whose prompts have no completions waiting (the first step, the
first of an epoch, a round other than the first, a prompt set the rollout rounds changed)
generates synchronously.

The completions of the steps ahead, finished or not, are registered trainer state
(`async_generation`, train/state.py): a checkpoint waits for the requests in flight (one chunk
with partial rollouts) and saves every group with its token prefixes, logprobs and versions;
a resumed run continues the unfinished ones from their prefixes once it has pushed its weights
(`async/resumed_partial`, `async/tokens_kept`) and trains its first steps on the completions
an uninterrupted run would.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import deque
from dataclasses import dataclass

from maxent_grpo.methods import async_depth
from maxent_grpo.train import trl_adapter
from maxent_grpo.train.generation_queue import (
    GenerationQueue,
    ServerLostError,
    StepWork,
    kept,
)
from maxent_grpo.train.state import state_registry

logger = logging.getLogger(__name__)

__all__ = ["AsyncGeneration", "Pending", "ServerLostError", "sample_staleness"]


@dataclass
class Pending:
    """One step's generation, sent ahead (its work on the main process only)."""

    step: int  # the optimizer step (1-based) that trains on it
    prompt_ids: list[list[int]]  # this process's prompts, as TRL tokenizes them
    all_prompt_ids: list[list[int]] | None  # every process's (main process only)
    version: int = -1  # optimizer steps in the weights pushed before it was sent
    work: StepWork | None = None  # its groups in the queue (main process)


def sample_staleness(item: Pending, payload: tuple | None, trained: int) -> list[int]:
    """Each sample's staleness: `trained` (the policy version training on it) minus the
    version that made its first token (payload's third part), or of the weights pushed before
    the request (item.version) where that is not known."""
    versions = payload[2] if payload is not None and len(payload) > 2 else None
    if not versions:
        return [trained - item.version]
    return [trained - (item.version if v is None else v) for v in versions]


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
        self.depth = 1 if rollouts is not None else async_depth(trainer.args)
        self._iterator = None  # the epoch iterator the batches ahead come from
        self._ahead: deque = deque()  # (batches, num_items) of the next steps, in order
        self._next: list[Pending] = []  # the next steps' prompts, gathered, not yet sent
        self._next_rows: list[dict] | None = None  # with rollouts: sent after the rounds
        self._pending: dict[int, Pending] = {}  # step -> its generation, sent or restored
        self._queue: GenerationQueue | None = None
        self._held = False  # restored work waits for this run's first push
        self._resumed: tuple[int, int] | None = None  # kept(), logged at the first step
        self._consumed_at: float | None = None
        self._step = 0  # the step whose first generation has been served
        generation = trainer.vllm_generation  # VLLMSync's timed push, inside ours
        self._push, generation.sync_weights = generation.sync_weights, self._push_between_requests
        state_registry(trainer).register(
            "async_generation", self._state, self._load, per_process=True
        )

    # ---- the next steps' prompts ----------------------------------------------------------

    def batch_samples(self, call, epoch_iterator, num_batches, device):
        # HF's training loop only (the model is put in train mode later, in training_step).
        if self._iterator is not epoch_iterator:  # the first step, or the first of an epoch
            self._iterator, self._ahead = epoch_iterator, deque()
        current = (
            self._ahead.popleft() if self._ahead else call(epoch_iterator, num_batches, device)
        )
        while len(self._ahead) < self.depth and self._trained(len(self._ahead)):
            batches, items = call(epoch_iterator, num_batches, device)
            if not batches:  # the epoch's end
                break
            self._ahead.append((batches, items))
            if self.rollouts is not None:  # sent once this step's rounds are decided
                self._next_rows = batches[0]
            else:  # every rank calls this at the same point: the gather is a collective
                step = self.trainer.state.global_step + 1 + len(self._ahead)
                self._next.append(self._gathered(step, batches[0]))
        return current

    def _trained(self, ahead: int) -> bool:
        """Whether the run trains the step `ahead` steps after the next one (none is
        generated for steps past max_steps)."""
        last = self.trainer.state.max_steps
        return not last or last < 0 or self.trainer.state.global_step + 2 + ahead <= last

    def prepare_inputs(self, call, generation_batch):
        inputs = call(generation_batch)
        if self._next_rows is not None and self.trainer.model.training:  # every rank, in step
            rows, self._next_rows = self._next_rows, None
            first = self.rollouts.first_round_rows(rows)
            if first is not None:
                self._sync_weights_once()  # a step without a round has not pushed yet
                self._next.append(self._gathered(self.trainer.state.global_step + 2, first))
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
        if self._held:  # restored prefixes go on only under this run's weights
            self._sync_weights_once()
        item = self._pending.pop(step, None)
        self._forget(before=step)
        waited = time.monotonic()
        decision = None
        if trainer.accelerator.is_main_process:
            payload = self._queue.wait(item.work) if item and item.work else None
            decision = self._decide(item if payload else None, prompt_ids, payload, waited)
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

    def _forget(self, before: int) -> None:
        """Steps ahead that can no longer be trained (a step that generated afresh)."""
        gone = {s for s in self._pending if s < before}
        for s in gone:
            del self._pending[s]
        if gone and self._queue is not None:
            self._queue.drop(gone)

    def _decide(self, item: Pending | None, prompt_ids, payload, waited: float) -> dict:
        """The main process's decision for this step, shared with the others."""
        now = time.monotonic()
        trained = self.trainer.state.global_step
        ages = None if item is None else sample_staleness(item, payload, trained)
        stale = [age for age in ages or [] if age > self.trainer.args.max_staleness]
        use = item is not None and not stale and item.all_prompt_ids is not None
        use = use and item.prompt_ids == prompt_ids
        serving = None  # the server's request seconds since the step before consumed
        if self._queue is not None and self._consumed_at is not None:
            serving = self._queue.busy_seconds(self._consumed_at, now)
        self._consumed_at = now
        waiting = [p for p in self._pending.values() if p.work and p.work.done.is_set()]
        return {
            "use": use,
            "payload": payload if use else None,
            "staleness": (sum(ages) / len(ages), max(ages)) if use and ages else None,
            "dropped": len(item.all_prompt_ids) if stale and item.all_prompt_ids else 0,
            "ready_before": item is not None and 0 < item.work.finished <= waited,
            "finished_ahead": len(waiting),
            "partial": item.work.spanned() if use else None,
            "wait_s": now - waited,
            "server_s": serving,
            "resumed": self._resumed,
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
        if decision["partial"] is not None:
            metrics["async/partial_share"].append(decision["partial"])
        metrics["async/prefetched"].append(float(decision["use"]))
        metrics["async/dropped_stale"].append(float(decision["dropped"]))
        metrics["async/queue_depth"].append(float(decision["ready_before"]))
        metrics["async/finished_ahead"].append(float(decision["finished_ahead"]))
        metrics["async/wait_s"].append(decision["wait_s"])
        if decision["resumed"] is not None:
            self._resumed = None
            metrics["async/resumed_partial"].append(float(decision["resumed"][0]))
            metrics["async/tokens_kept"].append(float(decision["resumed"][1]))
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
        interval is vllm_sync.py's); afterwards TRL's own call finds nothing to do. Restored
        work goes on once this run's weights are on the server."""
        trainer = self.trainer
        step = trainer.state.global_step
        if step != trl_adapter.last_loaded_step(trainer):
            trainer.vllm_generation.sync_weights()  # _push_between_requests
            trl_adapter.set_last_loaded_step(trainer, step)
        if self._held:
            self._held = False
            restored = [p.work for p in self._pending.values() if p.work is not None]
            if restored:
                self._start_queue().adopt(restored)

    def _push_between_requests(self) -> None:
        """Every weight push (ours, TRL's at an evaluation), made while no request is in
        flight: whole completions, or one chunk with partial rollouts, are waited for."""
        trainer, sync = self.trainer, self.sync
        waited = time.monotonic()
        with self._queue.paused() if self._queue is not None and sync.due() else _nothing():
            mode = "train" if trainer.model.training else "eval"
            trl_adapter.metrics(trainer, mode)["async/push_wait_s"].append(
                time.monotonic() - waited
            )
            self._push()
            pool = sync.pool()
            if pool is not None and sync.synced_step is not None:
                pool.mark_synced(sync.synced_step)  # the servers that took this push
            if self._queue is not None and sync.synced_step is not None:
                self._queue.version = sync.synced_step

    # ---- the queue ---------------------------------------------------------------------------

    def _send_next(self) -> None:
        items, self._next = self._next, []
        version = self.sync.synced_step
        for item in items:
            restored = self._pending.get(item.step)
            if restored is not None and restored.prompt_ids == item.prompt_ids:
                continue  # a checkpoint's, continued in the queue
            if restored is not None and self._queue is not None:
                self._queue.drop({item.step})  # saved for other prompts: made again
            item.version = self.trainer.state.global_step if version is None else version
            self._pending[item.step] = item
            if item.all_prompt_ids is not None:  # the main process: the others keep prompts
                item.work = self._start_queue().submit(item.step, item.all_prompt_ids)

    def _start_queue(self) -> GenerationQueue:
        """The main process's queue, made once."""
        if self._queue is None:
            trainer, generation = self.trainer, self.trainer.vllm_generation
            version = self.sync.synced_step
            self._queue = GenerationQueue(
                self._request,
                n=trainer.num_generations,
                max_tokens=generation.max_completion_length,
                chunk_tokens=trainer.args.partial_rollout_tokens,
                stop_ids=stop_token_ids(trainer),
                timeout=trainer.args.vllm_server_timeout,
                version=trainer.state.global_step if version is None else version,
            )
        return self._queue

    def _request(self, prompts: list[list[int]], n: int, max_tokens: int) -> tuple:
        """TRL's server request (vllm_generation.py), from the queue's threads: `n`
        completions of each prompt, at most `max_tokens` long."""
        generation = self.trainer.vllm_generation
        output = generation.vllm_client.generate(
            prompts=prompts,
            n=n,
            repetition_penalty=generation.repetition_penalty,
            temperature=generation.temperature,
            top_p=generation.top_p,
            top_k=generation.top_k,
            min_p=0.0 if generation.min_p is None else generation.min_p,
            max_tokens=max_tokens,
            logprobs=generation.logprobs,
            structured_outputs_regex=generation.structured_outputs_regex,
            generation_kwargs=generation.generation_kwargs,
        )
        logprobs = output["logprobs"]
        if logprobs is not None:
            logprobs = [[lp[0] for lp in seq] for seq in logprobs]
        return output["completion_ids"], logprobs, output.get("policy_versions")

    # ---- checkpoints ---------------------------------------------------------------------------

    def _state(self) -> dict:
        items = sorted(self._pending.values(), key=lambda p: p.step)
        queue = self._queue if any(p.work for p in items) else None
        if queue is not None and queue.in_flight:
            logger.warning(
                "async_generation: the checkpoint waits for %d requests in flight (steps %s)",
                queue.in_flight,
                [p.step for p in items if p.work and not p.work.done.is_set()],
            )
        with queue.paused() if queue is not None else _nothing():
            saved = [
                {
                    "step": p.step,
                    "version": p.version,
                    "prompt_ids": p.prompt_ids,
                    "all_prompt_ids": p.all_prompt_ids,
                    "groups": p.work.state() if p.work is not None else None,
                }
                for p in items
            ]
        return {"items": saved}

    def _load(self, state: dict) -> None:
        self._pending = {}
        for saved in _items_of(state):
            item = Pending(int(saved["step"]), saved["prompt_ids"], saved["all_prompt_ids"])
            item.version = int(saved["version"])
            if saved["groups"] is not None:
                item.work = StepWork.from_state(item.step, saved["groups"])
            self._pending[item.step] = item
        works = [p.work for p in self._pending.values() if p.work is not None]
        self._held = bool(self._pending)
        self._resumed = kept(works) if works else None
        if self._pending:
            logger.warning(
                "async_generation: resumed with steps %s generated ahead (%d unfinished "
                "completions to continue, %d tokens kept)",
                sorted(self._pending),
                *(self._resumed or (0, 0)),
            )


def _items_of(state: dict) -> list[dict]:
    """The saved steps; a checkpoint written before the queue holds one finished step."""
    if "items" in state:
        return state["items"]
    if state["step"] < 0:
        return []
    groups = None
    if state["payload"] is not None:
        ids, logprobs, versions = (list(state["payload"]) + [None])[:3]
        made = [int(state["version"]) if not versions or v is None else v for v in versions or ids]
        samples = [
            {
                "tokens": t,
                "logprobs": None if logprobs is None else logprobs[i],
                "versions": [(0, made[i])],
                "done": True,
            }
            for i, t in enumerate(ids)
        ]
        groups = [{"prompt": [], "samples": samples}]
    return [{**state, "groups": groups}]


def stop_token_ids(trainer) -> set[int]:
    """The token ids that end a completion (the server stops on them): a chunk that ends on
    one ended its completion, even at the chunk's full length."""
    ids: set[int] = set()
    for source in (
        getattr(trainer.processing_class, "eos_token_id", None),
        getattr(getattr(trainer.model, "generation_config", None), "eos_token_id", None),
        (trainer.vllm_generation.generation_kwargs or {}).get("stop_token_ids"),
    ):
        if isinstance(source, int):
            ids.add(source)
        elif source:
            ids.update(int(i) for i in source)
    return ids


@contextlib.contextmanager
def _nothing():
    yield
