"""Weight sync between the trainer and the vLLM server: `nccl` (TRL's own) or `disk`.

Recipe key `vllm_weight_sync` (recipe.keys.GRPOConfig), used with `use_vllm: true` and
`vllm_mode: server`:

- `nccl` (default): TRL's NCCL weight-transfer engine streams every tensor into the server.
  Needs CUDA in the trainer and the server; we only check that up front (one line instead of
  TRL's NotImplementedError after the model is loaded) and time it.
- `lora` (use_peft): rank 0 saves only the adapter (PEFT's save_pretrained) under
  `output_dir/.vllm_lora/` and the server loads it in place through vLLM's runtime LoRA API
  (`POST /v1/load_lora_adapter`); generation then names the adapter as its model. A resumed
  or requeued run's first sync sends the adapter it loaded from the checkpoint (and removes
  the stopped attempt's adapter files). The last adapter's files stay until the next sync:
  vLLM may read them again after evicting the adapter from its cache.
- `disk`: every rank takes part in gathering the parameters (ZeRO-3/FSDP/PEFT handled by
  TRL's own iterator), rank 0 writes them as safetensors into a fresh directory under
  `output_dir/.vllm_weights/`, and the server reloads them through its dev-mode endpoint
  `POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": DIR}}`.
  The directory is deleted once the server has the weights. Works where NCCL cannot (CPU).
  output_dir must be readable by the server's node (a shared filesystem across nodes).

Both modes log the seconds each sync took as the metric `vllm/weight_sync_seconds`; disk
also the bytes it wrote, `vllm/weight_sync_bytes`.
`vllm_sync_interval_steps: N` skips the syncs between every N optimizer steps (`sync_due`);
`vllm/policy_lag_steps` is how many steps old the server's weights are at each generation.

In server mode our trainer (train/trl_adapter.py `HookedTrainer`, through `vllm_backend`)
makes TRL build its vLLM backend (VLLMGeneration) as our subclass for the duration of its
__init__: one that connects at its first use
(train/vllm_connect.py), so the trainers start while the server boots; in disk mode also
without the NCCL communicator, which TRL would open and which raises without CUDA. Nothing
else of TRL is changed.
"""

from __future__ import annotations

import contextlib
import functools
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

from maxent_grpo.errors import UserError
from maxent_grpo.faults import failpoint
from maxent_grpo.methods import uses_vllm_server
from maxent_grpo.train import trl_adapter
from maxent_grpo.train.server_pool import ServerPool, for_each
from maxent_grpo.train.vllm_connect import deferred_generation_class

WEIGHT_SYNC_METRIC = "vllm/weight_sync_seconds"
# Optimizer steps between the server's weights and the trainer's at each generation.
POLICY_LAG_METRIC = "vllm/policy_lag_steps"
# Bytes written for the server per sync (disk: the safetensors files of the full model).
SYNC_BYTES_METRIC = "vllm/weight_sync_bytes"
WEIGHTS_DIRNAME = ".vllm_weights"
LORA_DIRNAME = ".vllm_lora"
LORA_NAME = "policy"  # the adapter's name on the server; generation asks for it by this name
# Tensors per safetensors file: bounds rank 0's extra CPU memory during a sync.
SHARD_BYTES = 2 * 1024**3

_patch_lock = threading.Lock()


def weight_sync_mode(args) -> str | None:
    """'nccl', 'disk' or 'lora' when the trainer syncs weights into a vLLM server; None
    otherwise."""
    return args.vllm_weight_sync if uses_vllm_server(args) else None


def check_weight_sync(args, cuda_available: bool | None = None) -> str | None:
    """The sync mode to use; a one-line UserError when it cannot work here."""
    mode = weight_sync_mode(args)
    if mode is None:
        return None
    if mode not in ("nccl", "disk", "lora"):
        raise UserError(f"vllm_weight_sync: {mode!r}; must be nccl, disk or lora")
    if mode == "nccl":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        if not cuda_available or args.use_cpu:
            raise UserError(
                "vllm_weight_sync: nccl needs CUDA in the trainer (TRL's NCCL weight-transfer "
                "engine) but training runs on CPU; set vllm_weight_sync: disk"
            )
    return mode


def weights_dir(args) -> Path:
    return Path(args.output_dir).resolve() / WEIGHTS_DIRNAME


class _SafetensorsWriter:
    """Writes (name, tensor) pairs as sharded safetensors files into one directory."""

    def __init__(self, directory: Path, shard_bytes: int = SHARD_BYTES):
        self.directory = directory
        self.directory.mkdir(parents=True, exist_ok=False)
        self.shard_bytes = shard_bytes
        self._shard: dict = {}
        self._size = 0
        self._count = 0

    def add(self, name: str, tensor) -> None:
        # A copy: under ZeRO-3 the gathered tensor is only valid inside the gather.
        copy = tensor.detach().to("cpu", copy=True).contiguous()
        self._shard[name] = copy
        self._size += copy.numel() * copy.element_size()
        if self._size >= self.shard_bytes:
            self._flush()

    def _flush(self) -> None:
        from safetensors.torch import save_file

        if not self._shard:
            return
        self._count += 1
        save_file(
            self._shard,
            str(self.directory / f"model-{self._count:05d}.safetensors"),
            metadata={"format": "pt"},
        )
        self._shard, self._size = {}, 0

    def close(self) -> int:
        self._flush()
        return self._count

    def bytes_written(self) -> int:
        return sum(path.stat().st_size for path in self.directory.glob("*.safetensors"))


def reload_weights(client, directory: Path) -> None:
    """Ask the server to load the safetensors in `directory` (dev-mode /collective_rpc)."""
    response = client.session.post(
        f"{client.base_url}/collective_rpc",
        json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}},
    )
    if response.status_code == 404:
        raise RuntimeError(
            f"the vLLM server at {client.base_url} has no /collective_rpc endpoint, which "
            "vllm_weight_sync: disk uses; start it with VLLM_SERVER_DEV_MODE=1"
        )
    if response.status_code != 200:
        raise RuntimeError(
            f"vLLM reload_weights from {directory} failed: HTTP {response.status_code}: "
            f"{response.text[:2000]}"
        )


def _reload_and_reset(client, directory: Path) -> None:
    reload_weights(client, directory)
    client.reset_prefix_cache()


def _load_lora_and_reset(client, directory: Path) -> None:
    load_lora_adapter(client, directory)
    client.reset_prefix_cache()


@functools.cache
def disk_generation_class():
    """TRL's VLLMGeneration with disk weight sync in server mode (built lazily: TRL is slow)."""

    class DiskSyncVLLMGeneration(deferred_generation_class()):
        """Server mode without an NCCL group: weights go through a safetensors directory."""

        def __init__(self, *args, weights_dir: Path, **kwargs):
            self.weights_dir = Path(weights_dir)
            super().__init__(*args, **kwargs)

        def _open_client(self, base_url: str) -> None:
            # TRL's client (health check, generation); no init_communicator: no NCCL group.
            self.vllm_client = self._new_client(base_url, self.group_port)

        def _init_pool(self, pool) -> None:
            return None  # no NCCL group

        def sync_weights(self):
            if self.mode != "server":
                return super().sync_weights()
            accelerator = self.accelerator
            # Every rank iterates: gathering sharded parameters is a collective.
            writer = None
            if accelerator.is_main_process:
                target = self.weights_dir / f"sync-{uuid.uuid4().hex[:12]}"
                writer = _SafetensorsWriter(target)
            try:
                for name, tensor in trl_adapter.iter_named_params(self):
                    if writer is not None:
                        writer.add(name, tensor)
                if writer is not None:
                    writer.close()
                    self.last_sync_bytes = writer.bytes_written()
                    reload = functools.partial(_reload_and_reset, directory=writer.directory)
                    for_each(self.vllm_client, reload, "reload_weights")  # every server
            finally:
                if writer is not None:
                    shutil.rmtree(writer.directory, ignore_errors=True)
                    with contextlib.suppress(OSError):
                        self.weights_dir.rmdir()  # only when empty
            accelerator.wait_for_everyone()

    return DiskSyncVLLMGeneration


def load_lora_adapter(client, directory: Path) -> None:
    """Load (or replace) the adapter `LORA_NAME` from `directory` (vLLM's runtime LoRA API)."""
    response = client.session.post(
        f"{client.base_url}/v1/load_lora_adapter",
        json={"lora_name": LORA_NAME, "lora_path": str(directory), "load_inplace": True},
    )
    if response.status_code != 200:
        raise RuntimeError(
            f"vLLM load_lora_adapter from {directory} failed: HTTP {response.status_code}: "
            f"{response.text[:2000]} (the server needs --enable-lora and "
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=1, which the launcher sets)"
        )


@functools.cache
def lora_generation_class():
    """TRL's VLLMGeneration sending only the LoRA adapter (`vllm_weight_sync: lora`)."""
    from accelerate.utils import is_peft_model

    class LoRASyncVLLMGeneration(disk_generation_class()):
        """Rank 0 saves the adapter; the server loads it in place; generation names it."""

        loaded: Path | None = None  # the directory the server's adapter came from

        def sync_weights(self):
            if self.mode != "server":
                return super().sync_weights()
            accelerator = self.accelerator
            if accelerator.is_main_process:
                model = accelerator.unwrap_model(self.model)
                if not is_peft_model(model):
                    raise UserError(
                        "vllm_weight_sync: lora needs a LoRA model (use_peft: true); set "
                        "vllm_weight_sync: disk or nccl to sync the whole model"
                    )
                target = self.weights_dir / f"sync-{uuid.uuid4().hex[:12]}"
                model.save_pretrained(str(target))
                self.last_sync_bytes = sum(f.stat().st_size for f in target.iterdir())
                load = functools.partial(_load_lora_and_reset, directory=target)
                for_each(self.vllm_client, load, "load_lora_adapter")  # every server
                self.vllm_client.model = LORA_NAME  # TRL's requests name this model
                # The previous adapters' files, no longer the server's: this process's last one
                # and, at a resumed or requeued attempt's first sync, the stopped attempt's.
                for stale in self.weights_dir.glob("sync-*"):
                    if stale != target:
                        shutil.rmtree(stale, ignore_errors=True)
                self.loaded = target
            accelerator.wait_for_everyone()

    return LoRASyncVLLMGeneration


@contextlib.contextmanager
def _vllm_generation_replaced(trainer_cls: type, factory):
    """Make the trainer's __init__ build `factory(...)` where TRL builds VLLMGeneration.

    Why a swapped global and not a parameter: TRL 1.16's GRPOTrainer.__init__ builds
    `VLLMGeneration(...)` inline, through its module's global name, with no argument or
    factory method to override, and VLLMGeneration.__init__ opens the NCCL group (which
    raises without CUDA) before any hook of ours could run. So the name is swapped in each
    module of the class hierarchy that uses it, for the duration of __init__ only, under a
    lock, and restored on exit. This is the only place we do it.
    """
    from trl.generation.vllm_generation import VLLMGeneration

    modules = []
    for cls in trainer_cls.__mro__:
        module = sys.modules.get(cls.__module__)
        if module is not None and getattr(module, "VLLMGeneration", None) is VLLMGeneration:
            modules.append(module)
    with _patch_lock:
        for module in modules:
            module.VLLMGeneration = factory
        try:
            yield
        finally:
            for module in modules:
                module.VLLMGeneration = VLLMGeneration


def sync_due(step: int, synced_step: int | None, interval: int) -> bool:
    """Whether the generation at optimizer step `step` first pushes the weights.

    The first one always does (`synced_step` None: a fresh or restarted server holds the base
    model, a resumed trainer the checkpoint's weights); then every `interval` steps. Every
    rank decides alike (the same step), as the gather of sharded weights needs all of them.
    """
    return interval <= 1 or synced_step is None or step - synced_step >= interval


def _log_servers(metrics, client: ServerPool | None) -> None:
    """vllm_nodes > 1 (a ServerPool): each server's sync seconds, and prompts served so far."""
    if client is None:
        return
    for url, seconds in client.last_sync_seconds.items():
        metrics[f"{WEIGHT_SYNC_METRIC}/{urlparse(url).netloc}"].append(seconds)
    for url, served in zip(client.urls, client.prompts_served, strict=True):
        metrics[f"vllm/prompts_served/{urlparse(url).netloc}"].append(served)


def backend_factory(args):
    """What GRPOTrainer.__init__ must build where TRL builds VLLMGeneration, in server mode (one
    that connects at its first use, train/vllm_connect.py); None: TRL's own."""
    mode = check_weight_sync(args)
    if mode is None:
        return None
    if mode == "disk":
        return functools.partial(disk_generation_class(), weights_dir=weights_dir(args))
    if mode == "lora":
        lora_dir = Path(args.output_dir).resolve() / LORA_DIRNAME
        return functools.partial(lora_generation_class(), weights_dir=lora_dir)
    return deferred_generation_class()


@contextlib.contextmanager
def vllm_backend(trainer_cls: type, args, method: str):
    """Around TRL's trainer __init__: our vLLM backend in server mode (RL methods only)."""
    factory = backend_factory(args) if method != "sft" else None
    if factory is None:
        yield
        return
    with _vllm_generation_replaced(trainer_cls, factory):
        yield


class VLLMSync:
    """Component (train/components.py), with `use_vllm`: times every weight sync (metrics, the
    step clock's `sync` and `server_start`), applies `vllm_sync_interval_steps` and keeps the
    servers' policy version (`synced_step`)."""

    name = "vllm_sync"
    needs = ("step_clock",)

    def __init__(self, trainer, step_clock=None):
        self.trainer = trainer
        self.clock = step_clock
        self.mode = weight_sync_mode(trainer.args)
        self.generation = trainer.vllm_generation
        self.generation.run_dir = trainer.args.output_dir  # the server pool's events
        self.synced_step: int | None = None  # the servers' policy version
        self._sync = self.generation.sync_weights
        self.generation.sync_weights = self.timed_sync

    def pool(self) -> ServerPool | None:
        """The servers (vllm_nodes > 1, train/server_pool.py), or None for one."""
        client = getattr(self.generation, "_client", None)  # ours: train/vllm_connect.py
        return client if isinstance(client, ServerPool) else None

    def due(self) -> bool:
        """Whether the generation of the trainer's current step first pushes the weights."""
        step, interval = self.trainer.state.global_step, self.trainer.args.vllm_sync_interval_steps
        return sync_due(step, self.synced_step, interval)

    def timed_sync(self) -> None:
        trainer, generation = self.trainer, self.generation
        step = trainer.state.global_step
        metrics = trl_adapter.metrics(trainer, "train" if trainer.model.training else "eval")
        if not self.due():
            metrics[POLICY_LAG_METRIC].append(step - self.synced_step)
            return
        connect = getattr(generation, "connect", None)  # ours (deferred): server mode only
        if connect is not None and trainer.accelerator.is_main_process:
            waited = time.perf_counter()
            connect()  # the first sync waits for the server: not part of its time
            self._record("server_start", time.perf_counter() - waited)
        failpoint("weight_push", step + 1)
        start = time.perf_counter()
        self._sync()
        seconds = time.perf_counter() - start
        self.synced_step = step  # the servers' policy version
        metrics[WEIGHT_SYNC_METRIC].append(seconds)
        _log_servers(metrics, self.pool())
        metrics[POLICY_LAG_METRIC].append(0)
        sent = getattr(generation, "last_sync_bytes", None)  # disk sync, main process
        if sent is not None:
            metrics[SYNC_BYTES_METRIC].append(sent)
        self._record("sync", seconds)

    def _record(self, part: str, seconds: float) -> None:
        if self.clock is not None:
            self.clock.add(part, seconds)
