"""`maxent-grpo runs` shows a run's vLLM server losses and returns (vllm_nodes > 1): the
launcher's server_lost / server_back events (launch/server_group.py) counted in DETAIL; the
trainers' reports of the same loss (`by: trainer`) are not counted twice."""

from __future__ import annotations

from maxent_grpo.rundir.events import emit
from maxent_grpo.runs import collect_runs, format_table


def _run(out, lost_back: tuple[int, int]) -> None:
    emit(out, "attempt_start", method="grpo", recipe="r.yaml", job=None, attempt=0, host="h")
    emit(out, "step", step=1, metrics={"loss": 0.0, "reward": 0.5})
    url = "http://node1:8000"
    emit(out, "server_lost", url=url, reason="refused", by="trainer")
    for _ in range(lost_back[0]):
        emit(out, "server_lost", node="node1", url=url, reason="exited with code 137")
    for _ in range(lost_back[1]):
        emit(out, "server_back", node="node1", url=url, after_s=61.2)


def test_runs_detail_counts_the_launchers_server_events(tmp_path):
    _run(tmp_path / "outputs" / "two", (2, 1))
    _run(tmp_path / "outputs" / "calm", (0, 0))
    runs = {r.run: r for r in collect_runs([tmp_path / "outputs"], open_logs=set())}
    assert runs["two"].servers == "servers: 2 lost, 1 back"
    assert runs["calm"].servers is None  # a trainer's report alone is not counted
    table = format_table(list(runs.values()))
    (row,) = [line for line in table.splitlines() if line.startswith("two ")]
    assert row.endswith("servers: 2 lost, 1 back")
    assert "servers:" not in [line for line in table.splitlines() if line.startswith("calm")][0]
