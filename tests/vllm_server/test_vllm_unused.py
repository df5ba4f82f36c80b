"""With the real vLLM installed, a trainer of a recipe that does not generate with it never
loads it (TRL's GRPO trainer would: about 5 s and 200 MiB per process); one that does, does."""

from __future__ import annotations

import pytest

from helpers.recipes import SMOKE, SMOKE_VLLM, write_recipe
from helpers.trainer_imports import trainer_imports


@pytest.mark.parametrize(("base", "loaded"), [(SMOKE, False), (SMOKE_VLLM, True)])
def test_trainers_load_vllm_only_when_the_recipe_uses_it(tmp_path, base, loaded):
    ranks = trainer_imports(write_recipe(tmp_path, base=base))["vllm"]  # one answer a rank
    assert ranks and set(ranks) == {loaded}, ranks
