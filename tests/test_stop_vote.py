"""The stop callback with 2 processes (gloo): every rank stops at the same step, whichever rank
sees the request, and the vote needs no host-device synchronisation. Forked processes driving
the callback through the hooks in HF Trainer's order; no model (a few seconds)."""

from __future__ import annotations

import multiprocessing
import os
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from transformers import TrainerControl

from maxent_grpo.train import checkpoints
from maxent_grpo.train.checkpoints import StopVote, make_stop_callback

STEPS = 8


def _run_rank(rank: int, port: int, out: str, request: tuple[int, str], queue) -> None:
    """Steps 1..STEPS as HF Trainer calls the hooks; rank 1 gets a SIGTERM-like request at
    step request[0], before (`vote`) or after (`late`) that step's vote."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        device = torch.device("cpu")
        trainer = SimpleNamespace(
            args=SimpleNamespace(output_dir=out),
            accelerator=SimpleNamespace(num_processes=2, device=device),
        )
        callback = make_stop_callback(trainer)
        control, stopped_at = TrainerControl(), None
        for step in range(1, STEPS + 1):
            state = SimpleNamespace(global_step=step - 1)
            callback.on_step_begin(trainer.args, state, control)
            if rank == 1 and step == request[0] and request[1] == "vote":
                checkpoints._STOP_SIGNALS.append("SIGTERM")
            callback.on_pre_optimizer_step(trainer.args, state, control)
            if rank == 1 and step == request[0] and request[1] == "late":
                checkpoints._STOP_SIGNALS.append("SIGTERM")
            state.global_step = step
            callback.on_step_end(trainer.args, state, control)
            if control.should_training_stop:
                assert control.should_save and callback.stopped
                stopped_at = step
                break
        queue.put((rank, stopped_at))
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_steps(tmp_path, request: tuple[int, str]) -> dict[int, int | None]:
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    port = _free_port()
    procs = [
        context.Process(target=_run_rank, args=(r, port, str(tmp_path), request, queue))
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0, f"rank process exited {proc.exitcode}"
    return dict(queue.get(timeout=5) for _ in procs)


@pytest.mark.parametrize(
    ("request_at", "stop_at"),
    [((3, "vote"), 3), ((5, "late"), 6)],  # late: after step 5's vote, acted on at step 6
    ids=["before-the-vote", "after-the-vote"],
)
def test_one_ranks_request_stops_every_rank_at_the_same_step(tmp_path, request_at, stop_at):
    assert stop_steps(tmp_path, request_at) == {0: stop_at, 1: stop_at}


def test_the_vote_never_reads_from_the_device(monkeypatch):
    """The sum is read from host memory (a numpy view): no `.item()` / `float(tensor)`, which
    on a GPU wait for every kernel queued so far."""
    vote = StopVote(torch.device("cpu"))
    vote.host[0] = 1.0  # what the all-reduce writes
    vote.work = SimpleNamespace(wait=lambda: None)
    for name in ("item", "tolist", "__float__", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, _refuse)
    assert vote.receive() is True


def _refuse(*args, **kwargs):
    raise AssertionError("the stop vote read a tensor through torch")
