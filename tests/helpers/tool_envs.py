"""Environments for tests/test_environment_episode.py (recipe key `environment`)."""

from __future__ import annotations

import time


class Calculator:
    """A stateful calculator: one instance per rollout, reset before each."""

    def __init__(self):
        self.results: list[int] = []
        self.resets = 0

    def reset(self, **row) -> str:
        self.results = []
        self.resets += 1
        return " (You have a multiply tool.)"

    def multiply(self, a: int, b: int) -> str:
        """Multiply two integers.

        Args:
            a: The first factor.
            b: The second factor.
        """
        self.results.append(a * b)
        return str(a * b)

    def get_reward(self) -> float:
        """1 when the episode's last product is 42."""
        return 1.0 if self.results[-1:] == [42] else 0.0


class NoReset:
    def multiply(self, a: int, b: int) -> str:
        """Multiply.

        Args:
            a: A factor.
            b: A factor.
        """
        return str(a * b)


class Undocumented:
    def reset(self, **row) -> None:
        return None

    def multiply(self, a, b):
        return str(a * b)


def not_a_class() -> Calculator:
    return Calculator()


class Sleepy:
    def reset(self, **row) -> None:
        return None

    def wait(self, seconds: float) -> str:
        """Sleep.

        Args:
            seconds: How long.
        """
        time.sleep(seconds)
        return "awake"


def m(a: int, b: int) -> int:
    """Multiply (short: its schema is in every prompt of tests/vllm_server/test_vllm_tools.py).

    Args:
        a: A.
        b: B.
    """
    return a * b
