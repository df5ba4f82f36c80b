"""Where things are, for tests and bench/ (imported as `helpers.paths`).

REPO          the repository root
MAXENT_GRPO   the `maxent-grpo` command of the interpreter running the tests (its venv)
SMOKE...      the smoke recipes
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
# Next to the interpreter, not resolved: a venv's python is a link to the system one.
MAXENT_GRPO = str(Path(PYTHON).parent / "maxent-grpo")
SMOKE = REPO / "recipes" / "smoke" / "config_grpo.yaml"
SMOKE_MAXENT = REPO / "recipes" / "smoke" / "config_maxent.yaml"
SMOKE_VLLM = REPO / "recipes" / "smoke" / "config_grpo_vllm.yaml"
SMOKE_LORA = REPO / "recipes" / "smoke" / "config_grpo_lora.yaml"
