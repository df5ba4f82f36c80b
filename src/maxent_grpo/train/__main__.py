"""`python -m maxent_grpo.train [--method grpo|maxent] --config R [--key value ...]`.

The entry point of an installed package (no src/ scripts there); the launcher uses it when the
source checkout's src/grpo.py / src/maxent-grpo.py are not at hand. An entry point, on top of
the layers like cli.py: the main is train_process.py.
"""

import sys

from maxent_grpo.train.entry import exit_process
from maxent_grpo.train_process import main

if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
