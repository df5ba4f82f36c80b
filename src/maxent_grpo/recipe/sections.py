"""Each method's recipe sections (script, training, model, launch), named directly.

Imports TRL (the sections are TRL's dataclasses and our subclasses of them); the cheap facts of
a method (name, label, entry script) are methods.py.
"""

from __future__ import annotations

from maxent_grpo.recipe.keys import GRPO_TYPES, RecipeTypes
from maxent_grpo.recipe.maxent_keys import MAXENT_TYPES
from maxent_grpo.recipe.sft_keys import SFT_TYPES

SECTIONS: dict[str, RecipeTypes] = {"grpo": GRPO_TYPES, "maxent": MAXENT_TYPES, "sft": SFT_TYPES}
