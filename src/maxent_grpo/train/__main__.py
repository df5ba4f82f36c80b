"""`python -m maxent_grpo.train [--method grpo|maxent] --config R [--key value ...]`.

The entry point of an installed package (no src/ scripts there); the launcher uses it when the
source checkout's src/grpo.py / src/maxent-grpo.py are not at hand.
"""

import sys

from maxent_grpo.errors import EXIT_USER_ERROR, UserError
from maxent_grpo.methods import METHODS
from maxent_grpo.train.entry import cli_main, exit_process


def main(argv: list[str]) -> int:
    from maxent_grpo.recipe.parser import take_flag

    try:
        method, rest = take_flag(argv, "--method", "one of " + ", ".join(METHODS))
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USER_ERROR
    return cli_main(rest, method)  # an unknown method is a one-line error there


if __name__ == "__main__":
    exit_process(main(sys.argv[1:]))
