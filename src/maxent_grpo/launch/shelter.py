"""`python -m maxent_grpo.launch.shelter -m MODULE ARGS...` (or `-c CODE ARGS...`): the same
Python program, run with SIGTERM blocked for good: how the launcher runs a server on its node.

Slurm's SIGTERM reaches every process of a job it requeues, preempts or ends, and a server
must serve on until the trainers have saved the step they are in (launch/processes.py
server_child). The launcher starts it with SIGTERM blocked, a mask that survives exec and
every handler vLLM installs; but multiprocessing's resource tracker, which vLLM starts with
its engine, unblocks SIGTERM once it has spawned (stdlib multiprocessing/resource_tracker.py:
the pending SIGTERM then ended the server mid-start). So the tracker is started here first,
SIGTERM blocked again, and the program run in this process (its children find the tracker
running and inherit the mask).
"""

from __future__ import annotations

import runpy
import signal
import sys
from multiprocessing import resource_tracker

USAGE = "usage: python -m maxent_grpo.launch.shelter (-m MODULE | -c CODE) [ARGS...]"


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("-m", "-c"):
        raise SystemExit(USAGE)
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    flag, program, args = argv[0], argv[1], argv[2:]
    if flag == "-m":
        sys.argv = [program, *args]
        runpy.run_module(program, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(program, "<string>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv[1:])
