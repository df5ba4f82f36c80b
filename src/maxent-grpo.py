"""MaxEnt-GRPO training entry point.

python src/maxent-grpo.py --config recipes/<model>/maxent-grpo/config_<task>.yaml [--key value ...]
"""

import sys

from maxent_grpo.maxent import maxent_trainer_class
from maxent_grpo.maxent.config import MAXENT_TYPES
from maxent_grpo.train.entry import cli_main

if __name__ == "__main__":
    sys.exit(
        cli_main(
            sys.argv[1:],
            types=MAXENT_TYPES,
            trainer_class_factory=maxent_trainer_class,
            method="maxent",
        )
    )
