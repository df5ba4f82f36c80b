"""scripts/setup_env.sh installs what a recipe needs, for real, into a fresh venv under tmp.

One venv for the module (about 30 s, see venv_env): the recipe's extras are installed by pip (peft,
deepspeed) and a second call with nothing new is a no-op. On a GPU node (a fake nvidia-smi)
a CPU build of torch is refused in one line: that test makes its own venv, with pip pointed
at a local index holding only a stand-in "torch 2.13.0+cpu" (no file of this machine needed).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from helpers.paths import REPO, SMOKE

pytestmark = pytest.mark.integration
QWEN = REPO / "recipes" / "Qwen2.5-1.5B-Instruct" / "grpo" / "config_math.yaml"


def venv_env(**env: str) -> dict[str, str]:
    """pip's --no-compile (pip reads PIP_NO_COMPILE as the value of `compile`, hence 0): no
    .pyc files for the 14,000 modules installed, 40 s of the first install's 70 s here; the
    same packages are installed, and the script's choices are what these tests check. Python
    may write .pyc files instead, for the few modules that the commands run here import."""
    environ = {**os.environ, "PIP_NO_COMPILE": "0", **env}
    environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return environ


def setup_env(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = venv_env(MAXENT_GRPO_VENV=str(venv), **env)
    environ.pop("MAXENT_GRPO_EXTRAS", None)
    return subprocess.run(
        ["bash", "scripts/setup_env.sh", *args],
        cwd=REPO,
        env=environ,
        capture_output=True,
        text=True,
        timeout=900,
    )


def stamp(venv: Path) -> list[str]:
    return (venv / ".maxent-grpo-stamp").read_text().splitlines()[1:]


def has(venv: Path, module: str) -> bool:
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    return subprocess.run([str(venv / "bin" / "python"), "-c", code]).returncode == 0


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh venv for the smoke recipe with `-- --use_peft true` (training.sh's arguments)."""
    venv = tmp_path_factory.mktemp("setup") / "venv"
    result = setup_env(venv, str(SMOKE), "--", "--use_peft", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines()[-1] == f"{venv}/bin"
    return venv


def test_fresh_venv_gets_the_recipes_extra_and_nothing_else(venv):
    assert stamp(venv) == ["peft"]
    assert has(venv, "peft") and has(venv, "maxent_grpo") and has(venv, "trl")
    assert not has(venv, "deepspeed") and not has(venv, "vllm")


def test_second_call_with_nothing_new_is_a_no_op(venv):
    start = time.monotonic()
    result = setup_env(venv, str(SMOKE), "--", "--use_peft", "true")
    took = time.monotonic() - start
    print(f"setup_env.sh, nothing to do: {took:.2f}s")
    assert result.returncode == 0 and result.stdout.strip() == f"{venv}/bin"
    assert "Setting up" not in result.stderr  # what proves nothing was installed
    # A bash script and one python start: under 1 s idle, kept loose for a loaded machine.
    assert took < 20


def test_deepspeed_recipe_adds_deepspeed_but_not_vllm_on_a_cpu_node(venv):
    # training.sh passes RECIPE then its arguments: a --config there names the recipe.
    result = setup_env(venv, str(SMOKE), "--config", str(QWEN))
    assert result.returncode == 0, result.stderr[-3000:]
    assert stamp(venv) == ["deepspeed", "peft"]  # kept peft, added deepspeed
    assert has(venv, "deepspeed") and not has(venv, "vllm")


def test_an_install_cut_off_while_pip_replaced_itself_is_repaired(venv):
    # What a Ctrl-C in the first seconds of an install left (issue 26): a pip without its
    # utils package, and no stamp (it is written last). Reuses the module's venv: the repair
    # reinstalls pip only; pip skips the packages already there.
    (venv / ".maxent-grpo-stamp").unlink()
    for utils in venv.glob("lib/python3*/site-packages/pip/_internal/utils"):
        shutil.rmtree(utils)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import pip._internal.cli.main"]).returncode != 0
    result = setup_env(venv, str(SMOKE), "--", "--use_peft", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "pip in" in result.stderr and "is broken" in result.stderr
    # Not a silent minute: without a stamp the install shows pip's own lines.
    assert "Requirement already satisfied" in result.stderr
    assert subprocess.run([python, "-c", "import pip._internal.cli.main"]).returncode == 0
    assert stamp(venv) == ["peft"]  # the recipe's; the lost stamp no longer lists deepspeed
    # The next command works: the venv's maxent-grpo script plans the smoke recipe. (torch and
    # trl import there: setup_env.sh's own import check, else exit 2; `check` would import them
    # again for 8 of this test's 30 CPU-s, and the recipe's extra is checked above by the stamp.)
    plan = subprocess.run(
        [str(venv / "bin" / "maxent-grpo"), "plan", "--config", str(SMOKE)],
        cwd=REPO,
        env=venv_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    planned = f"{venv}/bin/python -m accelerate.commands.launch"  # the venv's own interpreter
    assert plan.returncode == 0 and planned in plan.stdout, plan.stdout + plan.stderr[-2000:]


def cpu_torch_index(folder: Path) -> str:
    """A package index (PEP 503, on disk) whose only torch is "2.13.0+cpu": what a pip
    configured for CPU wheels (find-links, a CPU index) finds. The wheel is a stand-in with
    the right name and version, so nothing large is installed."""
    wheel = folder / "torch-2.13.0+cpu-py3-none-any.whl"
    info = "torch-2.13.0+cpu.dist-info"
    files = {
        "torch/__init__.py": '__version__ = "2.13.0+cpu"\n',
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, text in files.items():
            archive.writestr(name, text)
        archive.writestr(
            f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
        )
    page = folder / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    page.write_text(f'<a href="{wheel.as_uri().replace("+", "%2B")}">{wheel.name}</a>\n')
    return (folder / "simple").as_uri()


def test_a_second_setup_waits_for_the_first_and_installs_nothing(venv, tmp_path):
    """Array tasks that start together after a dependency change: one installs, the others
    wait on the venv's lock and then find it up to date (before the lock, two pip runs in one
    venv left it without its maxent-grpo script)."""
    stamp_file = venv / ".maxent-grpo-stamp"
    current = stamp_file.read_text()
    stamp_file.write_text("stale-hash\n" + "".join(current.splitlines(keepends=True)[1:]))
    err = tmp_path / "err"
    environ = venv_env(MAXENT_GRPO_VENV=str(venv))
    environ.pop("MAXENT_GRPO_EXTRAS", None)
    with open(venv / ".maxent-grpo-lock", "w") as lock, open(err, "w") as err_file:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first setup, installing
        waiting = subprocess.Popen(
            ["bash", "scripts/setup_env.sh"],
            cwd=REPO,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=err_file,
            text=True,
        )
        time.sleep(3)
        assert waiting.poll() is None and "Setting up" not in err.read_text()
        stamp_file.write_text(current)  # the first setup finishes
    out, _ = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err.read_text()[-2000:]
    assert out.splitlines()[-1] == f"{venv}/bin"
    assert "Setting up" not in err.read_text()


def test_gpu_node_refuses_a_cpu_torch_in_one_line(tmp_path, monkeypatch):
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n')
    fake.chmod(0o755)
    venv = tmp_path / "venv"
    # Only the index below: no pip configuration of this machine (find-links, indexes).
    for name in [n for n in os.environ if n.startswith("PIP_")]:
        monkeypatch.delenv(name)
    result = setup_env(
        venv,
        str(SMOKE),
        PATH=f"{fake.parent}{os.pathsep}{os.environ['PATH']}",
        PIP_CONFIG_FILE=os.devnull,
        MAXENT_GRPO_TORCH_INDEX=cpu_torch_index(tmp_path),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert "GPU node (nvidia-smi) but pip installed torch 2.13.0+cpu" in errors[0]
    assert "MAXENT_GRPO_TORCH_INDEX" in errors[0]
    assert not (venv / ".maxent-grpo-stamp").exists()  # nothing recorded as installed
