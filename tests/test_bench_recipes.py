"""The recipes the benchmarks write are recipes the launcher accepts (bench/ has no other test:
`make bench` runs for minutes, so a recipe it breaks would only show there)."""

from __future__ import annotations

import importlib

from helpers.runs import REPO
from maxent_grpo.recipe import read_recipe


def test_maxent_bench_writes_a_grpo_twin_the_launcher_runs_as_grpo(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    bench_maxent = importlib.import_module("bench_maxent")
    paths = bench_maxent.recipes(tmp_path / "model", 3, tmp_path)
    # As bench_maxent.run asks: --method METHOD.
    keys = {method: read_recipe(["--config", str(paths[method])], method) for method in paths}
    assert {method: k.method for method, k in keys.items()} == {"grpo": "grpo", "maxent": "maxent"}
    assert keys["grpo"].beta == bench_maxent.KL_COEFF
