"""The files that describe environments agree with pyproject.toml: docs/requirements.txt (Read
the Docs) with the `docs` extra, .readthedocs.yaml installs it, environment.yml pins the same
torch and documents every extra, and each recipe extra is an extra of the package."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from helpers.paths import REPO
from maxent_grpo.recipe.needs import DEFAULTS, recipe_needs

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10 (pyproject allows it): the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EXTRAS = PYPROJECT["optional-dependencies"]


def requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def test_docs_requirements_are_the_docs_extra():
    assert requirement_lines(REPO / "docs" / "requirements.txt") == EXTRAS["docs"]
    assert all("==" in line for line in EXTRAS["docs"])  # pinned: warnings are errors there


def test_read_the_docs_installs_the_docs_requirements_and_the_package():
    config = yaml.safe_load((REPO / ".readthedocs.yaml").read_text())
    install = config["python"]["install"]
    assert {"requirements": "docs/requirements.txt"} in install
    assert {"method": "pip", "path": "."} in install
    assert config["sphinx"]["fail_on_warning"] is True


def test_environment_yml_pins_the_same_torch_and_names_every_extra():
    text = (REPO / "environment.yml").read_text()
    env = yaml.safe_load(text)
    (pip,) = [d["pip"] for d in env["dependencies"] if isinstance(d, dict)]
    torch = [d for d in PYPROJECT["dependencies"] if d.startswith("torch")]
    assert torch == ["torch==2.13.0"] and torch[0] in pip
    for extra in ("vllm", "deepspeed", "peft", "docs"):
        assert extra in EXTRAS
        assert f"#   {extra} " in text, extra


def test_every_extra_a_recipe_can_need_is_a_package_extra():
    everything = {
        "use_vllm": True,
        "use_peft": True,
        "accelerate_config": str(REPO / "recipes" / "accelerate_configs" / "zero3.yaml"),
    }
    assert set(DEFAULTS) >= set(everything)
    extras = {need.extra for need in recipe_needs(everything)}
    extras |= {need.extra for need in recipe_needs({**everything, "vllm_mode": "server"})}
    assert extras == {"vllm", "deepspeed", "peft"} and extras <= set(EXTRAS)
