"""MaxEnt-GRPO training entry point (thin shim: `python -m maxent_grpo.train --method maxent`).

python src/maxent-grpo.py --config recipes/<model>/maxent-grpo/config_<task>.yaml [--key value ...]
"""

import sys

from maxent_grpo.train.entry import exit_process
from maxent_grpo.train_process import cli_main

if __name__ == "__main__":
    exit_process(cli_main(sys.argv[1:], method="maxent"))
