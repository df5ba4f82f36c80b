"""Every view derived from the keys' declarations agrees with them (recipe/declare.py).

A key is declared once: our fields (recipe/*_keys.py, recipe/keys.py) or TRL's plus
recipe/ranges.py TRL_KEYS. Derived: recipe/schema.json, the range checks (read time and a
section's __post_init__), the launcher's TRL-free defaults (launch/requirements.py) and the
docs reference (docs/_ext/maxent_reference.py). Each test below fails when one view drifts.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys

import pytest

from helpers.paths import REPO
from maxent_grpo.errors import ConfigError
from maxent_grpo.launch import requirements
from maxent_grpo.recipe import schema
from maxent_grpo.recipe.declare import describe, own_declarations
from maxent_grpo.recipe.sections import SECTIONS

DECLARED = schema.key_declarations()


def _own_defaults() -> dict[str, object]:
    """Our keys' defaults, as their declarations (our fields) give them."""
    found = {}
    for sections in SECTIONS.values():
        for section in sections:
            if not section.__module__.startswith("maxent_grpo."):
                continue
            declared_here = inspect.get_annotations(section)  # not the TRL fields it inherits
            for f in dataclasses.fields(section):
                if f.name in declared_here and f.default is not dataclasses.MISSING:
                    found.setdefault(f.name, f.default)
    return found


def _library_defaults(method: str) -> dict[str, object]:
    """Every key's default as TRL's parser gives it now (TRL's own for a TRL key)."""
    parser = schema.trl_parser(SECTIONS[method])
    stored = [a for a in parser._actions if type(a).__name__ == "_StoreAction"]  # not --no_x
    return {a.dest: a.default for a in stored}


def test_schema_json_is_generated_from_the_declarations():
    assert schema.SCHEMA_PATH.read_text() == schema.render(schema.generate()), (
        f"schema.json is stale; run: {schema.WRITE_COMMAND}"
    )


def test_the_schema_carries_every_declared_range_and_package():
    data = schema.load()
    ranges = {k: list(a.range) for k, a in DECLARED.items() if a.range}
    assert data["ranges"] == ranges
    packages = {k: [dataclasses.asdict(p) for p in a.packages] for k, a in DECLARED.items()}
    assert data["packages"] == {k: v for k, v in packages.items() if v}
    # A range belongs to a key a recipe may set.
    keys = {k for method in data["methods"].values() for k in method["keys"]}
    assert set(ranges) <= keys and set(data["packages"]) <= keys


def test_the_schema_defaults_are_the_declared_defaults():
    own = _own_defaults()
    for method in SECTIONS:
        library = _library_defaults(method)
        for key in schema.load()["methods"][method]["keys"]:
            assert schema.default(key, method) == library[key], key
            if key in own:
                assert schema.default(key, method) == own[key], key


@pytest.mark.parametrize("method", sorted(SECTIONS))
def test_a_section_built_directly_checks_its_own_declared_ranges(method):
    """The __post_init__ range check is derived from the same declarations."""
    training = SECTIONS[method][1]
    for key, accepts in own_declarations(training).items():
        if not accepts.range:
            continue
        op, bound = accepts.range[:2]
        outside = bound - 1 if op in (">", ">=") else bound + 1
        # The adaptive tau's knobs apply only with its target.
        adaptive = {"maxent_target_weight_entropy": 0.5} if key.startswith("maxent_tau_") else {}
        with pytest.raises(ConfigError, match=rf"^{key}: .*must be {describe(accepts.range)}"):
            training(output_dir="/tmp/unused", **adaptive, **{key: outside})


def test_the_launchers_defaults_are_the_declared_defaults():
    defaults = _library_defaults("grpo")
    assert requirements.DEFAULTS == {key: defaults[key] for key in requirements.DEFAULTS}
    assert set(schema.load()["packages"]) <= set(requirements.DEFAULTS)


def test_each_declared_package_is_what_the_launcher_asks_for():
    zero3 = str(REPO / "recipes" / "accelerate_configs" / "zero3.yaml")
    values = {  # a value of each key that asks for its declared package
        "use_vllm": {"use_vllm": True},
        "use_peft": {"use_peft": True},
        "accelerate_config": {"accelerate_config": zero3},
        "vllm_server_device": {
            "use_vllm": True,
            "vllm_mode": "server",
            "vllm_server_device": "cpu",
        },
    }
    assert set(values) == set(schema.load()["packages"])
    for key, recipe in values.items():
        needs = {(n.module, n.extra) for n in requirements.recipe_needs(recipe)}
        declared = {(p.module, p.extra) for p in DECLARED[key].packages}
        assert declared <= needs, key


def test_the_docs_reference_shows_each_declaration():
    sys.path.insert(0, str(REPO / "docs" / "_ext"))
    try:
        import maxent_reference
    finally:
        sys.path.pop(0)
    keys = {key.name: key for key in maxent_reference.collect_recipe_keys()}
    text = maxent_reference.render_recipe_keys(list(keys.values()))
    for name, accepts in DECLARED.items():
        if accepts.range:
            assert keys[name].range == describe(accepts.range), name
            assert f"Range: ``{describe(accepts.range)}``." in text
        for p in accepts.packages:
            assert f"Needs ``{p.module}`` (extra ``{p.extra}``)" in text
    for key, default in _own_defaults().items():
        assert keys[key].default == maxent_reference.yaml_value(default), key


def test_reward_defaults_and_builtin_benchmarks_agree_with_the_lower_layer():
    from maxent_grpo.benchmarks.spec import BUILTIN_BENCHMARKS
    from maxent_grpo.migrate.open_r1 import BUILTIN_BENCHMARK_NAMES
    from maxent_grpo.recipe.script_keys import _PASSED_SETTINGS, ScriptArguments
    from maxent_grpo.rewards.registry import REWARD_SETTINGS

    script = ScriptArguments()
    assert {k: getattr(script, k) for k in _PASSED_SETTINGS} == {
        k: REWARD_SETTINGS[k] for k in _PASSED_SETTINGS
    }
    assert tuple(BUILTIN_BENCHMARKS) == BUILTIN_BENCHMARK_NAMES


def test_a_read_recipe_has_its_ranges_checked_once(monkeypatch):
    """read_recipe checks every declared range; build_recipe builds from those keys and does not
    check them again; a section built directly checks its own (its __post_init__)."""
    from maxent_grpo.recipe import build_recipe, checks, keys, parser, read_recipe
    from maxent_grpo.recipe.maxent_keys import MaxEntConfig

    read, built = [], []
    monkeypatch.setattr(parser, "check_ranges", lambda k: read.append(k.path))
    monkeypatch.setattr(keys, "check_own_ranges", lambda c: built.append(type(c).__name__))
    recipe = read_recipe(["--config", str(REPO / "recipes/smoke/config_maxent.yaml")])
    build_recipe(recipe, world_size=2)
    assert (len(read), built) == (1, [])
    MaxEntConfig(output_dir="out", maxent_tau=0.5, use_cpu=True, bf16=False)
    assert built == ["MaxEntConfig"]
    monkeypatch.setattr(parser, "check_ranges", checks.check_ranges)
    with pytest.raises(ConfigError, match="maxent_tau"):
        recipe.with_values(maxent_tau=0.0)  # what-ifs are read keys too: checked once, there


def test_the_rollout_filters_help_names_each_registered_filter():
    from maxent_grpo.recipe.keys import GRPOConfig
    from maxent_grpo.rollout_filters import BUILTIN_FILTERS

    (declared,) = [f for f in dataclasses.fields(GRPOConfig) if f.name == "rollout_filters"]
    for name, function in BUILTIN_FILTERS.items():
        assert f"{name} ({function.__doc__})" in declared.metadata["help"]
