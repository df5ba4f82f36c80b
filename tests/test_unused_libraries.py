"""A trainer's start-up: the optional libraries a run does not use are marked absent before TRL
is imported; the garbage collector is held and the installed packages are scanned once until
training starts (train/startup.py)."""

from __future__ import annotations

import gc
import importlib.metadata
import importlib.util
import inspect
import os
import sys
import weakref

import pytest

from helpers.recipes import write_recipe
from helpers.trainer_imports import trainer_imports
from maxent_grpo.recipe import read_recipe
from maxent_grpo.train import startup
from maxent_grpo.train.unused_libraries import unused_libraries

_IMPORTS: dict[str, dict] = {}


@pytest.fixture(autouse=True)
def own_cache(monkeypatch, tmp_path):
    """Start-up keeps its package scan in the user's cache: a test's fake scan goes elsewhere."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def imports_of(tmp_path, report_to) -> dict:
    """trainer_imports of a recipe with this report_to, one fresh interpreter per value."""
    key = repr(report_to)
    if key not in _IMPORTS:
        _IMPORTS[key] = trainer_imports(write_recipe(tmp_path, report_to=report_to))
    return _IMPORTS[key]


@pytest.mark.parametrize(
    ("keys", "unused"),
    [
        ({}, ["wandb", "vllm", "peft"]),
        ({"report_to": ["wandb", "tensorboard"]}, ["vllm", "peft"]),
        ({"report_to": "all"}, ["vllm", "peft"]),
        ({"use_vllm": True, "vllm_mode": "server"}, ["wandb", "peft"]),
        ({"benchmarks": ["arithmetic"]}, ["wandb", "peft"]),  # inline evaluation may use vLLM
        ({"use_peft": True}, ["wandb", "vllm"]),
    ],
)
def test_the_libraries_a_recipe_does_not_use(tmp_path, keys, unused):
    recipe = write_recipe(tmp_path, **keys)
    assert unused_libraries(read_recipe(["--config", str(recipe)])) == unused


@pytest.mark.parametrize(
    ("report_to", "loaded"), [("none", False), (["tensorboard"], False), (["wandb"], True)]
)
def test_trl_loads_wandb_only_for_runs_that_report_to_it(tmp_path, report_to, loaded):
    if importlib.util.find_spec("wandb") is None:
        pytest.fail("wandb is a core dependency and must be installed")
    assert imports_of(tmp_path, report_to)["wandb"] == [loaded, loaded]


@pytest.mark.parametrize("use_peft", [False, True])
def test_transformers_loads_peft_only_for_lora_runs(tmp_path, use_peft):
    if importlib.util.find_spec("peft") is None:
        pytest.fail("the test environment installs the peft extra (tests/test_peft.py)")
    imports = trainer_imports(write_recipe(tmp_path, use_peft=use_peft))
    assert imports["peft"] == [use_peft, use_peft]


def test_trl_imports_scan_the_packages_once_and_walk_no_heap(tmp_path):
    """transformers and TRL each scan the installed packages when imported; with the collector
    on, Python walks the growing heap again and again (each walk ~0.4 s at the end)."""
    imports = imports_of(tmp_path, "none")  # the interpreter of the report_to "none" case
    assert imports["package_scans"] == 1
    assert imports["full_collections"] == 0
    assert imports["op_source"]  # torch's operator registrations skip inspect (0.3-0.4 s)


def test_op_source_names_the_frame_as_torchs_get_source_did():
    def torchs_get_source(stacklevel: int) -> str:  # torch 2.13's, which op_source replaces
        frame = inspect.getframeinfo(sys._getframe(stacklevel))
        return f"{frame.filename}:{frame.lineno}"

    def register_op(stacklevel: int) -> tuple[str, str]:  # as torch.library's callers do
        return startup.op_source(stacklevel), torchs_get_source(stacklevel)

    ours, torchs = register_op(1)
    assert ours == torchs == f"{__file__}:{sys._getframe().f_lineno - 3}"
    ours, torchs = register_op(2)
    assert ours == torchs == f"{__file__}:{sys._getframe().f_lineno - 1}"


class Node:
    """A weak-referenceable object for a reference cycle."""


def start_up_cycle() -> weakref.ref:
    node = Node()
    node.self = node  # only the cyclic collector frees it
    return weakref.ref(node)


def test_started_collects_start_up_garbage_then_freezes_the_rest(monkeypatch):
    scans = []
    monkeypatch.setattr(startup, "_real_scan", lambda: scans.append(1) or {"yaml": ["PyYAML"]})
    with startup.starting_up():
        assert not gc.isenabled()
        cycle = start_up_cycle()
        first = importlib.metadata.packages_distributions()
        first["yaml"].append("changed")  # each caller owns its copy
        assert importlib.metadata.packages_distributions() == {"yaml": ["PyYAML"]}
        assert len(scans) == 1
        assert cycle() is not None  # nothing walks the heap during start-up
        startup.started()
        assert cycle() is None  # started's one collection: no start-up cycle is kept
        assert gc.isenabled() and gc.get_freeze_count() > 0
        assert importlib.metadata.packages_distributions is startup._real_scan
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_an_error_during_start_up_gives_the_collector_back():
    with pytest.raises(RuntimeError), startup.starting_up():
        assert not gc.isenabled()
        raise RuntimeError("a user error before training")
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert importlib.metadata.packages_distributions is startup._real_scan


def test_a_process_forked_during_start_up_collects_as_before():
    read, write = os.pipe()
    with startup.starting_up():
        child = os.fork()
        if child == 0:  # the child: report and leave at once
            os.write(write, b"1" if gc.isenabled() else b"0")
            os._exit(0)
        assert not gc.isenabled()  # the parent still holds it
    os.waitpid(child, 0)
    assert os.read(read, 1) == b"1"


def test_a_later_start_reads_the_scan_until_the_environment_changes(monkeypatch, tmp_path):
    """The scan is kept on disk: a requeue's trainers read it instead of scanning (0.4-0.8 s
    each); a package installed or removed (a sys.path directory changes) scans again."""
    scans = []
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    monkeypatch.setattr(startup, "_real_scan", lambda: scans.append(1) or {"yaml": ["PyYAML"]})

    def start() -> dict:
        with startup.starting_up():
            return importlib.metadata.packages_distributions()

    assert start() == {"yaml": ["PyYAML"]} and len(scans) == 1
    assert start() == {"yaml": ["PyYAML"]} and len(scans) == 1  # read, not scanned
    (site / "new_package-1.0.dist-info").mkdir()  # pip install
    assert start() == {"yaml": ["PyYAML"]} and len(scans) == 2
    assert start() == {"yaml": ["PyYAML"]} and len(scans) == 2
