"""Built-in datasets (`builtin:NAME`): generated from a seed, so smoke tests need no network.

Each row has a `problem` and its exact `solution` (the rewards' answer). The `_sft` variants
(`builtin:arithmetic_sft` ...) have the same problems for the same seed, with a worked reply in
the smoke recipes' format as the solution, `<think>7 * 3 = 21</think>\n<answer>21</answer>`:
what SFT trains on (docs/sft.md) before GRPO on the plain dataset.
"""

from __future__ import annotations

import random

import datasets

from maxent_grpo.data.errors import DataError
from maxent_grpo.data.sources import BUILTIN_PREFIX

_PLAIN_NAMES = ("arithmetic", "word_problems", "mixed")
SFT_SUFFIX = "_sft"
BUILTIN_NAMES = _PLAIN_NAMES + tuple(name + SFT_SUFFIX for name in _PLAIN_NAMES)
BUILTIN_COLUMNS = ("problem", "solution")

_NAMES = ("Ada", "Ben", "Chloe", "Dev", "Emma", "Hugo", "Iris", "Kira", "Liam", "Maya", "Noah")


def _arithmetic_problem(rng: random.Random) -> tuple[str, int, str]:
    """An expression over 2-4 small non-negative integers with +, -, * and maybe one (...) pair.

    Resampled until the answer is non-negative, so answers stay easy to parse and verify.
    """
    while True:
        terms = [str(rng.randint(0, 20)) for _ in range(rng.randint(2, 4))]
        ops = [rng.choice("+-*") for _ in range(len(terms) - 1)]
        if len(terms) >= 3 and rng.random() < 0.4:
            i = rng.randrange(len(terms) - 1)
            terms[i : i + 2] = [f"({terms[i]} {ops.pop(i)} {terms[i + 1]})"]
        expr = " ".join(t for pair in zip(terms, ops + [""]) for t in pair if t)
        answer = _evaluate(expr)
        if answer >= 0:
            return f"What is {expr}?", answer, expr


def _evaluate(expr: str) -> int:
    """Exact value of a generated expression: parenthesised groups first, then * before +/-."""
    while "(" in expr:
        start = expr.rindex("(")
        end = expr.index(")", start)
        expr = f"{expr[:start]}{_evaluate(expr[start + 1 : end])}{expr[end + 1 :]}"
    total, sign, product = 0, 1, None
    tokens = expr.split()
    for i in range(0, len(tokens), 2):
        value = int(tokens[i])
        product = value if product is None else product * value
        op = tokens[i + 1] if i + 1 < len(tokens) else "+"
        if op != "*":
            total, sign, product = total + sign * product, (1 if op == "+" else -1), None
    return total


def _word_problem(rng: random.Random) -> tuple[str, int, str]:
    """One of a few templates with random names and numbers; every answer is an integer >= 0.

    Returns the text, the answer and the arithmetic that gives it (the demonstration's work)."""
    name, friend = rng.sample(_NAMES, 2)
    kind = rng.randrange(6)
    if kind == 0:
        have, bought = rng.randint(2, 30), rng.randint(1, 30)
        given = rng.randint(0, have + bought)
        text = (
            f"{name} has {have} apples, buys {bought} more and gives {given} to {friend}. "
            f"How many apples does {name} have left?"
        )
        return text, have + bought - given, f"{have} + {bought} - {given}"
    if kind == 1:
        speed, hours = rng.randint(20, 120), rng.randint(1, 9)
        text = (
            f"A train leaves {name}'s town and travels at {speed} km per hour for {hours} hours. "
            "How many kilometers does it travel?"
        )
        return text, speed * hours, f"{speed} * {hours}"
    if kind == 2:
        boxes, per_box = rng.randint(2, 12), rng.randint(3, 24)
        given = rng.randint(0, boxes * per_box)
        text = (
            f"{name} buys {boxes} boxes of pencils with {per_box} pencils in each box and gives "
            f"{given} pencils to {friend}. How many pencils does {name} have left?"
        )
        return text, boxes * per_box - given, f"{boxes} * {per_box} - {given}"
    if kind == 3:
        weekly, weeks = rng.randint(1, 25), rng.randint(2, 12)
        spent = rng.randint(0, weekly * weeks)
        text = (
            f"{name} saves {weekly} dollars every week for {weeks} weeks and then spends {spent} "
            f"dollars on a book. How many dollars does {name} have left?"
        )
        return text, weekly * weeks - spent, f"{weekly} * {weeks} - {spent}"
    if kind == 4:
        friends, each = rng.randint(2, 9), rng.randint(1, 15)
        text = (
            f"{name} shares {friends * each} cookies equally among {friends} friends. "
            "How many cookies does each friend get?"
        )
        return text, each, f"{friends * each} / {friends}"
    age, older, years = rng.randint(5, 40), rng.randint(1, 20), rng.randint(1, 15)
    text = (
        f"{name} is {age} years old and {friend} is {older} years older than {name}. "
        f"How old will {friend} be in {years} years?"
    )
    return text, age + older + years, f"{age} + {older} + {years}"


def builtin_dataset(name: str, *, num_rows: int, seed: int) -> datasets.Dataset:
    """Generate `builtin:NAME` rows (BUILTIN_COLUMNS) deterministically from `seed`.

    The recipe keys dataset_num_rows and dataset_seed give `num_rows` and `seed`.
    """
    if name not in BUILTIN_NAMES:
        raise DataError(
            f"unknown builtin dataset {name!r}; use one of: "
            + ", ".join(BUILTIN_PREFIX + n for n in BUILTIN_NAMES)
        )
    if isinstance(num_rows, bool) or not isinstance(num_rows, int) or num_rows < 1:
        raise DataError(f"dataset_num_rows: must be an integer >= 1 (got {num_rows!r}); e.g. 4096")
    rng = random.Random(seed)
    plain = name.removesuffix(SFT_SUFFIX)
    problems, solutions = [], []
    for _ in range(num_rows):
        word = plain == "word_problems" or (plain == "mixed" and rng.random() < 0.5)
        problem, answer, work = _word_problem(rng) if word else _arithmetic_problem(rng)
        problems.append(problem)
        solutions.append(demonstration(work, answer) if plain != name else str(answer))
    return datasets.Dataset.from_dict({"problem": problems, "solution": solutions})


def demonstration(work: str, answer: int) -> str:
    """A worked reply in the smoke recipes' format (their system prompt and rewards)."""
    return f"<think>{work} = {answer}</think>\n<answer>{answer}</answer>"
