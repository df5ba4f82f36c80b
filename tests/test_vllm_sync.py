"""Weight-sync wiring (fast, no server): mode checks, the disk path, the timing metric.

The real thing, against a real vLLM server, is in tests/vllm_server/.
"""

from __future__ import annotations

import functools
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from trl.generation.vllm_generation import VLLMGeneration  # noqa: F401 (FakeTrainer uses it)

from maxent_grpo.errors import UserError
from maxent_grpo.train.vllm_connect import deferred_generation_class
from maxent_grpo.train.vllm_sync import (
    LORA_NAME,
    POLICY_LAG_METRIC,
    SYNC_BYTES_METRIC,
    WEIGHT_SYNC_METRIC,
    WEIGHTS_DIRNAME,
    VLLMSync,
    _SafetensorsWriter,
    check_weight_sync,
    disk_generation_class,
    lora_generation_class,
    sync_due,
    vllm_backend,
)


def args(tmp_path: Path, **kw) -> SimpleNamespace:
    base = dict(
        use_vllm=True,
        vllm_mode="server",
        vllm_weight_sync="disk",
        vllm_sync_interval_steps=1,
        use_cpu=True,
        output_dir=str(tmp_path / "out"),
    )
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize(
    "settings, cuda, expected",
    [
        ({"use_vllm": False}, False, None),
        ({"vllm_mode": "colocate"}, False, None),
        ({"vllm_weight_sync": "disk"}, False, "disk"),
        ({"vllm_weight_sync": "disk", "use_cpu": False}, True, "disk"),
        ({"vllm_weight_sync": "nccl", "use_cpu": False}, True, "nccl"),
    ],
)
def test_check_weight_sync(tmp_path, settings, cuda, expected):
    assert check_weight_sync(args(tmp_path, **settings), cuda_available=cuda) == expected


@pytest.mark.parametrize("use_cpu, cuda", [(True, True), (False, False)])
def test_nccl_without_cuda_is_one_line(tmp_path, use_cpu, cuda):
    training = args(tmp_path, vllm_weight_sync="nccl", use_cpu=use_cpu)
    with pytest.raises(UserError) as info:
        check_weight_sync(training, cuda_available=cuda)
    assert str(info.value) == (
        "vllm_weight_sync: nccl needs CUDA in the trainer (TRL's NCCL weight-transfer engine) "
        "but training runs on CPU; set vllm_weight_sync: disk"
    )


class FakeTrainer:
    """Stands in for TRL's GRPOTrainer: builds its backend through the module global."""

    def __init__(self, model=None, reward_funcs=None, args=None):
        self.args = args
        self.backend_factory = globals()["VLLMGeneration"]
        self.use_vllm = args.use_vllm
        self.model = SimpleNamespace(training=True)
        self._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
        self.syncs = 0
        self.state = SimpleNamespace(global_step=0)
        self.vllm_generation = SimpleNamespace(sync_weights=self._sync)

    def _sync(self):
        self.syncs += 1


def Trainer(*args, **kwargs):
    """FakeTrainer built as HookedTrainer builds TRL's (train/vllm_sync.py `vllm_backend`
    around its __init__), with the VLLMSync component."""
    training_args = kwargs.get("args", args[2] if len(args) > 2 else None)
    with vllm_backend(FakeTrainer, training_args, "grpo"):
        trainer = FakeTrainer(*args, **kwargs)
    trainer.sync = VLLMSync(trainer)
    return trainer


def test_disk_mode_builds_the_disk_backend_only_during_init(tmp_path):
    trainer = Trainer(model="m", args=args(tmp_path))
    factory = trainer.backend_factory
    assert isinstance(factory, functools.partial)
    assert factory.func is disk_generation_class()
    assert issubclass(factory.func, VLLMGeneration)
    assert factory.keywords == {"weights_dir": (tmp_path / "out" / WEIGHTS_DIRNAME).resolve()}
    assert globals()["VLLMGeneration"] is VLLMGeneration  # restored
    assert trainer.sync.mode == "disk"


def test_nccl_mode_keeps_trls_backend_connecting_at_first_use(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    trainer = Trainer("m", None, args(tmp_path, vllm_weight_sync="nccl", use_cpu=False))
    assert trainer.backend_factory is deferred_generation_class()
    assert trainer.backend_factory.__bases__ == (VLLMGeneration,)
    assert trainer.sync.mode == "nccl"


def test_colocate_mode_keeps_trls_backend(tmp_path):
    trainer = Trainer("m", None, args(tmp_path, vllm_mode="colocate"))
    assert trainer.backend_factory is VLLMGeneration


def test_nccl_mode_on_cpu_fails_before_the_model_loads(tmp_path):
    with pytest.raises(UserError, match="set vllm_weight_sync: disk"):
        Trainer(model="m", args=args(tmp_path, vllm_weight_sync="nccl"))


def test_sync_time_is_logged_as_a_metric(tmp_path):
    trainer = Trainer(model="m", args=args(tmp_path))
    trainer.vllm_generation.sync_weights()
    trainer.vllm_generation.sync_weights()
    assert trainer.syncs == 2
    times = trainer._metrics["train"][WEIGHT_SYNC_METRIC]
    assert len(times) == 2 and all(t >= 0 for t in times)


def test_writer_shards_and_round_trips(tmp_path):
    from safetensors.torch import load_file

    tensors = {f"layer.{i}.weight": torch.randn(64, 64) for i in range(5)}
    writer = _SafetensorsWriter(tmp_path / "w", shard_bytes=2 * 64 * 64 * 4)
    for name, tensor in tensors.items():
        writer.add(name, tensor)
    assert writer.close() == 3
    loaded = {}
    for path in sorted((tmp_path / "w").glob("*.safetensors")):
        loaded.update(load_file(path))
    assert loaded.keys() == tensors.keys()
    assert all(torch.equal(loaded[k], tensors[k]) for k in tensors)


class FakeResponse:
    status_code = 200
    text = "{}"


def test_disk_sync_writes_reloads_and_cleans_up(tmp_path):
    """sync_weights on rank 0: safetensors of every parameter, reload_weights, cleanup."""
    from safetensors.torch import load_file

    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    seen = {}

    class Client:
        base_url = "http://server:1"

        def __init__(self):
            self.session = SimpleNamespace(post=self.post)
            self.resets = 0

        def post(self, url, json):
            path = Path(json["kwargs"]["weights_path"])
            seen["url"], seen["method"] = url, json["method"]
            seen["tensors"] = {}
            for f in path.glob("*.safetensors"):
                seen["tensors"].update(load_file(f))
            seen["dir"] = path
            return FakeResponse()

        def reset_prefix_cache(self):
            self.resets += 1

    cls = disk_generation_class()
    generation = cls.__new__(cls)  # no server: set up what sync_weights uses
    generation.mode = "server"
    generation.weights_dir = tmp_path / "out" / WEIGHTS_DIRNAME
    generation.accelerator = SimpleNamespace(is_main_process=True, wait_for_everyone=lambda: None)
    generation.vllm_client = Client()
    generation._iter_named_params = lambda: iter(
        (name, p.data) for name, p in model.named_parameters()
    )
    generation.sync_weights()
    assert seen["url"] == "http://server:1/collective_rpc"
    assert seen["method"] == "reload_weights"
    assert seen["dir"].parent == generation.weights_dir
    assert seen["tensors"].keys() == dict(model.named_parameters()).keys()
    for name, param in model.named_parameters():
        assert torch.equal(seen["tensors"][name], param.data)
    assert generation.vllm_client.resets == 1
    assert not seen["dir"].exists() and not generation.weights_dir.exists()
    # the bytes sent: the parameters (4x3 + 3 + 3x2 + 2 floats) and the files' headers
    assert 23 * 4 < generation.last_sync_bytes < 23 * 4 + 1024


def test_disk_sync_on_other_ranks_only_iterates(tmp_path):
    cls = disk_generation_class()
    generation = cls.__new__(cls)
    generation.mode = "server"
    generation.weights_dir = tmp_path / WEIGHTS_DIRNAME
    waits = []
    generation.accelerator = SimpleNamespace(
        is_main_process=False, wait_for_everyone=lambda: waits.append(1)
    )
    iterated = []

    def params():
        for i in range(3):
            iterated.append(i)
            yield f"p{i}", torch.zeros(1)

    generation._iter_named_params = params
    generation.sync_weights()
    assert iterated == [0, 1, 2] and waits == [1]
    assert not generation.weights_dir.exists()


def test_the_wait_for_the_server_is_not_timed_as_a_sync(tmp_path):
    trainer = Trainer(model="m", args=args(tmp_path))
    trainer.accelerator = SimpleNamespace(is_main_process=True)
    connects = []

    def slow_connect():
        connects.append(1)
        time.sleep(1.0)  # the first use waits for a booting server

    trainer.vllm_generation.connect = slow_connect
    trainer.vllm_generation.sync_weights()
    assert connects == [1] and trainer.syncs == 1
    # The sync itself (a stand-in: milliseconds) is timed, not the 1 s wait for the server.
    assert trainer._metrics["train"][WEIGHT_SYNC_METRIC][0] < 1.0


# --- vllm_sync_interval_steps -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("step", "synced", "interval", "due"),
    [
        (5, None, 3, True),  # the first generation of a run (or of a resumed one) syncs
        (5, 5, 1, True),  # interval 1: whenever TRL asks (it asks once per step)
        (6, 5, 3, False),
        (7, 5, 3, False),
        (8, 5, 3, True),
        (20, 5, 3, True),  # a step count that jumped past the interval
    ],
)
def test_sync_due(step, synced, interval, due):
    assert sync_due(step, synced, interval) is due


def test_an_interval_skips_the_syncs_between_and_logs_the_policy_lag(tmp_path):
    trainer = Trainer(model="m", args=args(tmp_path, vllm_sync_interval_steps=3))
    trainer.accelerator = SimpleNamespace(is_main_process=False)
    synced_at = []
    for step in range(1, 9):  # TRL calls sync_weights at the first generation of each step
        trainer.state.global_step = step
        before = trainer.syncs
        trainer.vllm_generation.sync_weights()
        if trainer.syncs > before:
            synced_at.append(step)
    assert synced_at == [1, 4, 7]
    assert trainer._metrics["train"][POLICY_LAG_METRIC] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert len(trainer._metrics["train"][WEIGHT_SYNC_METRIC]) == 3


def test_the_bytes_of_a_disk_sync_are_logged(tmp_path):
    trainer = Trainer(model="m", args=args(tmp_path))
    trainer.vllm_generation.last_sync_bytes = 4096
    trainer.vllm_generation.sync_weights()
    assert trainer._metrics["train"][SYNC_BYTES_METRIC] == [4096]


def test_an_interval_without_the_importance_sampling_correction_is_refused():
    from maxent_grpo.errors import ConfigError
    from maxent_grpo.recipe.keys import GRPOConfig

    base = dict(output_dir="/tmp/x", use_cpu=True, bf16=False, use_vllm=True, report_to=[])
    base["vllm_sync_interval_steps"] = 4
    assert GRPOConfig(**base).vllm_sync_interval_steps == 4  # correction on: TRL's default
    with pytest.raises(ConfigError, match="vllm_importance_sampling_correction: true"):
        GRPOConfig(**base, vllm_importance_sampling_correction=False)


# --- vllm_weight_sync: lora -------------------------------------------------------------------


def test_lora_sync_sends_only_the_adapter_and_generation_names_it(tmp_path):
    from peft import LoraConfig, get_peft_model

    base = torch.nn.Sequential()
    base.add_module("proj", torch.nn.Linear(64, 64))
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["proj"]))
    posts = []

    class Client:
        base_url = "http://server:1"
        model = "base-model"

        def __init__(self):
            self.session = SimpleNamespace(post=self.post)

        def post(self, url, json):
            files = sorted(p.name for p in Path(json["lora_path"]).iterdir())
            posts.append((url, json, files))
            return FakeResponse()

        def reset_prefix_cache(self):
            pass

    cls = lora_generation_class()
    generation = cls.__new__(cls)
    generation.mode = "server"
    generation.weights_dir = tmp_path / "out" / ".vllm_lora"
    generation.model = model
    generation.accelerator = SimpleNamespace(
        is_main_process=True, wait_for_everyone=lambda: None, unwrap_model=lambda m: m
    )
    generation.vllm_client = Client()
    generation.sync_weights()
    first = generation.loaded
    generation.sync_weights()
    url, body, files = posts[-1]
    assert url == "http://server:1/v1/load_lora_adapter"
    assert body["lora_name"] == LORA_NAME and body["load_inplace"] is True
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(files)
    assert generation.vllm_client.model == LORA_NAME  # TRL's requests ask for the adapter
    # adapter only: A (4x64) and B (64x4) floats, not the 64x64 base weight
    assert 2 * 4 * 64 * 4 < generation.last_sync_bytes < 64 * 64 * 4
    assert not first.exists() and generation.loaded.exists()  # the previous one is removed


def test_lora_sync_refuses_a_model_without_an_adapter(tmp_path):
    cls = lora_generation_class()
    generation = cls.__new__(cls)
    generation.mode = "server"
    generation.weights_dir = tmp_path
    generation.model = torch.nn.Linear(2, 2)
    generation.accelerator = SimpleNamespace(is_main_process=True, unwrap_model=lambda m: m)
    with pytest.raises(UserError, match="use_peft: true"):
        generation.sync_weights()
