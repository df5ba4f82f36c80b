"""GRPO training entry point (a thin shim over `python -m maxent_grpo.train --method grpo`).

python src/grpo.py --config recipes/<model>/grpo/config_<task>.yaml [--key value ...]
"""

import sys

from maxent_grpo.train.entry import exit_process
from maxent_grpo.train_process import cli_main

if __name__ == "__main__":
    exit_process(cli_main(sys.argv[1:], method="grpo"))
