"""The chaos campaign's record (bench/chaos.py --merge, bench/chaos_rows.jsonl): pieces merged
with a replay after a fix counted once, the summary and the docs' table (pure: rows written
here, and the committed record itself)."""

from __future__ import annotations

import importlib.util
import json

from helpers.paths import REPO

SPEC = importlib.util.spec_from_file_location("chaos_bench", REPO / "bench" / "chaos.py")
chaos = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(chaos)
RECORD = REPO / "bench" / "chaos_rows.jsonl"


def row(seed: int, problems=(), outcome="crash", wall_s=10.0) -> dict:
    trial = chaos.trial_from_seed(seed)
    return {
        "seed": seed,
        "kind": trial.kind.name,
        "moment": trial.moment,
        "step": trial.step,
        "fault": trial.fault,
        "applied": True,
        "outcome": outcome,
        "steps_lost": 0,
        "steps_redone": 1,
        "first_step_s": 2.0,
        "orphans": 0,
        "corrupted": 0,
        "weights_equal": None,
        "problems": list(problems),
        "wall_s": wall_s,
    }


def test_a_seed_replayed_after_its_fix_counts_once_with_what_it_found(tmp_path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(json.dumps(row(7, ["outcome 'user_error'"], "user_error")) + "\n")
    first.write_text(first.read_text() + json.dumps(row(8)) + "\n")
    second.write_text(json.dumps(row(7, wall_s=None)) + "\n")
    rows = chaos.merged([first, second])
    assert [r["seed"] for r in rows] == [7, 8]
    assert rows[0]["fixed"] == ["outcome 'user_error'"] and rows[0]["first_outcome"] == "user_error"
    total = chaos.summary(rows)
    assert (total["trials"], total["survived"], total["failed_seeds"]) == (2, 2, [])
    assert total["found_and_fixed"] == {7: ["outcome 'user_error'"]}
    assert (total["wall_s"], total["rows_without_wall_s"]) == (10.0, 1)
    table = chaos.markdown(rows).splitlines()
    assert len(table) == 4 and all(line.count("|") == 10 for line in table)
    assert "held (replayed after a fix; first outcome user_error)" in "\n".join(table)
    failing = chaos.markdown([row(9, ["steps lost: [3]"])])
    assert failing.splitlines()[-1].endswith("| FAILED: steps lost: [3] |")


def test_the_committed_record_replays_from_its_seeds_with_the_right_classes():
    """Every row of bench/chaos_rows.jsonl is the trial its seed draws, with an outcome of
    the class that trial must give, and held every invariant."""
    rows = [json.loads(line) for line in RECORD.read_text().splitlines() if line.strip()]
    assert len({r["seed"] for r in rows}) == len(rows)
    for r in rows:
        trial = chaos.trial_from_seed(r["seed"])
        assert (trial.kind.name, trial.moment, trial.step, trial.fault) == (
            r["kind"],
            r["moment"],
            r["step"],
            r["fault"],
        ), r["seed"]
        assert r["outcome"] in chaos.expected(trial), r
        assert not r["problems"] and r["recovered"] and r["steps_lost"] == 0, r
