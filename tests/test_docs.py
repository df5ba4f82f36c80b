"""The documentation is generated from the code: check it covers what the recipes and CLI use.

The tests call the generator of docs/_ext/maxent_reference.py directly (no Sphinx needed).
The real, nitpicky, warnings-are-errors Sphinx build from scratch is `make docs` (CI's docs
step; it also checks that the generated reference pages were written), not a test here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from helpers.paths import REPO

DOCS = REPO / "docs"
sys.path.insert(0, str(DOCS / "_ext"))

import maxent_reference  # noqa: E402  (docs/_ext/maxent_reference.py)

# Not recipes: accelerate's own config files, passed to `accelerate launch --config_file`.
NOT_RECIPES = (REPO / "recipes" / "accelerate_configs",)


def recipe_files() -> list[Path]:
    files = sorted((REPO / "recipes").rglob("*.yaml"))
    return [f for f in files if not any(f.is_relative_to(d) for d in NOT_RECIPES)]


@pytest.fixture(scope="module")
def recipe_key_page() -> str:
    return maxent_reference.render_recipe_keys()


def test_there_are_recipes():
    assert recipe_files(), "no recipes/**/*.yaml found"


@pytest.mark.parametrize("recipe", recipe_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_recipe_key_is_documented(recipe, recipe_key_page):
    keys = set((yaml.safe_load(recipe.read_text()) or {}).keys()) - {"env", "method"}
    documented = maxent_reference.documented_keys(recipe_key_page)
    missing = sorted(keys - documented)
    assert not missing, f"{recipe.relative_to(REPO)}: keys missing from the reference: {missing}"


def test_reference_documents_exactly_what_the_parser_accepts(recipe_key_page):
    from maxent_grpo.recipe.schema import trl_parser

    accepted = set(maxent_reference.SPECIAL_KEYS)
    for types in maxent_reference.recipe_type_sets().values():
        accepted |= {a.dest for a in trl_parser(types)._actions if a.dest != "help"}
    assert maxent_reference.documented_keys(recipe_key_page) == accepted


def test_every_cli_subcommand_is_documented():
    page = maxent_reference.render_cli()
    programs = maxent_reference.documented_programs(page)
    subcommands = maxent_reference.cli_subcommands()
    assert subcommands
    for name in subcommands:
        assert f"maxent-grpo {name}" in programs, f"subcommand {name!r} missing from the CLI page"


def test_every_builtin_reward_is_on_the_rewards_page():
    from maxent_grpo.rewards import list_reward_names

    page = (DOCS / "rewards.md").read_text()
    for name in list_reward_names():
        assert f"`{name}`" in page, f"built-in reward {name!r} missing from docs/rewards.md"


def test_help_text_is_rendered_as_literal_text():
    # Markdown links, HF cross-references, rST/MyST markup and stray backticks from TRL or
    # transformers help texts must not become markup (or break the nitpicky build).
    text = (
        "See [`~transformers.TrainingArguments`] and [the paper](https://example.org/x_(y)). "
        "Use `beta`*2* or |sub| or :ref:`x` or $math$ or _target or `unclosed, https://a.b/c."
    )
    out = maxent_reference.inline(text)
    assert "``transformers.TrainingArguments``" in out
    assert "`the paper <https://example.org/x_(y)>`__" in out
    assert "`<https://a.b/c>`__" in out
    assert "\\*2\\*" in out and "\\|sub\\|" in out and "\\:ref\\:" in out and "\\$math\\$" in out
    assert "\\`unclosed" in out
