"""SFT entry point (a thin shim over `python -m maxent_grpo.train --method sft`).

python src/sft.py --config recipes/<model>/sft/config_<task>.yaml [--key value ...]
"""

import os
import sys

from maxent_grpo.launch.launcher import allocated_cpus  # no torch: see tests/test_layers.py

if "OMP_NUM_THREADS" not in os.environ:
    # torch reads it once, when imported: the launcher's default (launch/plan.py), the CPUs
    # shared out among this node's processes. Unset, torch may run more threads than cores.
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    os.environ["OMP_NUM_THREADS"] = str(max(1, allocated_cpus() // max(local, 1)))

from maxent_grpo.train.entry import exit_process  # noqa: E402 - after the thread count
from maxent_grpo.train_process import cli_main  # noqa: E402

if __name__ == "__main__":
    exit_process(cli_main(sys.argv[1:], method="sft"))
