"""Code rewards: the model's Python program, run locally against the row's tests in a sandbox.

Test cases come in open-r1's ``verification_info`` column: ``{"language": "python",
"test_cases": [{"input": "...", "output": "..."}, ...]}`` (a mapping or its JSON text). The
program is the completion's last Markdown code block tagged ``python``, run once per test case
with the case's input on stdin; it passes when it exits 0 within the limits and its stdout
equals the expected output line by line (surrounding whitespace of each line and trailing
blank lines ignored). See :mod:`maxent_grpo.rewards.sandbox` for the limits.
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from maxent_grpo.rewards import unit_tests
from maxent_grpo.rewards.common import RewardError, column, contents, references
from maxent_grpo.rewards.sandbox import Limits, run_python

#: Rewards that need a judge this toolkit does not have, with the reason (`maxent-grpo
#: migrate` reads them too: it leaves them out with this reason).
JUDGED_REWARDS = {
    "ioi_code": "needs open-r1's IOI judge (C++ subtasks graded on a Piston server or "
    "MorphCloud, over the network)",
    "cf_code": "needs open-r1's Codeforces judge (checkers on a Piston server or MorphCloud, "
    "over the network)",
}

logger = logging.getLogger("maxent_grpo.rewards")

# open-r1's extract_code: the last ```python block (the fence must end its line).
_PYTHON_BLOCK_RE = re.compile(r"```python\n(.*?)```", re.DOTALL)

#: Providers open-r1 knows that need a network (and an account); refused with this reason.
REMOTE_PROVIDERS = {
    "e2b": "runs programs in E2B's hosted sandboxes",
    "morph": "runs programs on MorphCloud",
}


def refuse_provider(provider: str) -> None:
    """Raise the one-line error for a remote code_provider."""
    if provider in REMOTE_PROVIDERS:
        raise RewardError(
            f"code_provider: {provider!r} {REMOTE_PROVIDERS[provider]}, which needs a network "
            "this toolkit does not assume; set code_provider: local (the default) to run the "
            "tests in a local sandbox"
        )


def refuse_judged(name: str) -> None:
    """Raise the one-line error for ioi_code / cf_code."""
    raise RewardError(
        f"reward {name!r} {JUDGED_REWARDS[name]}; this toolkit runs Python tests locally only: "
        "use code or binary_code with a verification_info column instead"
    )


def extract_code(text: str) -> str | None:
    """The last Markdown code block tagged ``python`` of a completion, or None."""
    blocks = _PYTHON_BLOCK_RE.findall(text)
    return blocks[-1] if blocks else None


def same_output(actual: str, expected: str) -> bool:
    """Line-by-line equality, ignoring each line's surrounding whitespace and trailing blanks."""

    def lines(text: str) -> list[str]:
        return [line.strip() for line in text.strip().splitlines()]

    return lines(actual) == lines(expected)


def _test_cases(info: Any) -> list[tuple[str, str]] | None:
    """(input, output) pairs of one row's verification_info; None for another language."""
    if isinstance(info, str):
        try:
            info = json.loads(info)
        except json.JSONDecodeError as err:
            raise RewardError(f"verification_info is not valid JSON ({err.msg})") from err
    if not isinstance(info, Mapping) or not isinstance(info.get("test_cases"), list):
        raise RewardError(
            "verification_info must be a mapping with a 'test_cases' list of "
            f"{{'input': ..., 'output': ...}} (open-r1's format), got {str(info)[:80]!r}"
        )
    if (info.get("language") or "python") != "python":
        return None
    cases = []
    for case in info["test_cases"]:
        if not isinstance(case, Mapping) or "output" not in case:
            raise RewardError(f"a test case needs 'input' and 'output', got {str(case)[:80]!r}")
        cases.append((str(case.get("input") or ""), str(case["output"])))
    return cases


def _run_all(jobs: list[Callable[[], bool]], workers: int) -> list[bool]:
    """Run the jobs on at most `workers` threads (each waits on one sandboxed process)."""
    if workers <= 1 or len(jobs) <= 1:
        return [job() for job in jobs]
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="code-reward")
    try:
        return list(pool.map(lambda job: job(), jobs))
    finally:
        # On a reward timeout (the guard's alarm) queued runs are dropped, not started.
        pool.shutdown(wait=True, cancel_futures=True)


class CodeTests:
    """``code``: the fraction of the row's test cases the program passes (0.0 to 1.0).

    ``binary_code`` scores 1.0 when every test case passes and 0.0 otherwise (open-r1:
    fraction above 0.99). A completion without a Markdown code block tagged ``python`` scores 0.0
    without running anything; a row whose ``verification_info`` language is not Python, or
    that has no test case, scores None. Settings: ``code_timeout_seconds`` (wall time of one
    run, default 5), ``code_memory_mb`` (address space, default 1024) and
    ``parallel_code_exec_per_proc`` (runs at once per training process, default 2).

    Example: with ``verification_info`` ``{"language": "python", "test_cases": [{"input":
    "2 3", "output": "5"}, {"input": "1 1", "output": "2"}]}``, a completion whose
    last ``python`` block is ``print(sum(map(int, input().split())))`` scores 1.0 for
    both; one printing ``5`` always scores 0.5 with ``code`` and 0.0 with ``binary_code``.
    """

    def __init__(self, binary: bool = False, limits: Limits | None = None, workers: int = 2):
        self.binary = binary
        self.limits = limits or Limits()
        self.workers = workers
        self.__name__ = "binary_code" if binary else "code"

    def __repr__(self) -> str:
        return f"CodeTests(binary={self.binary}, limits={self.limits}, workers={self.workers})"

    def _passes(self, code: str, stdin: str, expected: str) -> bool:
        result = run_python(code, stdin, self.limits)
        return result.ok and same_output(result.stdout, expected)

    def __call__(
        self, completions: Sequence[Any], verification_info: Any = None, **kwargs: Any
    ) -> list[float | None]:
        texts = contents(completions)
        infos = column(
            self.__name__, "verification_info", verification_info, len(texts),
            "the test cases (open-r1's 'verification_info' column)",
        )  # fmt: skip
        owners: list[int] = []
        jobs: list[Callable[[], bool]] = []
        totals: list[int] = []  # test cases per completion; 0: not scored (None)
        for i, (text, info) in enumerate(zip(texts, infos, strict=True)):
            cases, code = _test_cases(info) or [], extract_code(text)
            totals.append(len(cases))
            for stdin, expected in cases if code is not None else []:
                owners.append(i)
                jobs.append(lambda c=code, s=stdin, e=expected: self._passes(c, s, e))
        passed = [0] * len(texts)
        for owner, ok in zip(owners, _run_all(jobs, self.workers), strict=True):
            passed[owner] += ok
        scores: list[float | None] = []
        for n, total in zip(passed, totals, strict=True):
            if not total:
                scores.append(None)
            else:
                scores.append(float(n == total) if self.binary else n / total)
        return scores


def code_format(completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
    """1.0 when the completion's last ``python`` code block parses, else 0.0.

    Only the last such block counts; it is parsed (``ast.parse``), never run. Unlike
    open-r1's ``code_format``, the ``<think>``/``<answer>`` layout is not required: add
    ``format`` for that.

    Example: a block holding ``print(1)`` scores 1.0; one holding ``print(`` and a completion
    ``print(1)`` with no block score 0.0.
    """
    out: list[float | None] = []
    for text in contents(completions):
        code = extract_code(text)
        try:
            out.append(0.0 if code is None else float(ast.parse(code) is not None))
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            out.append(0.0)
    return out


def _unit_test_source(tests: Any) -> str:
    """The test code of a row: Python source, or a list of assert lines (MBPP's test_list)."""
    text = str(tests)
    if text.lstrip().startswith("["):
        try:
            lines = ast.literal_eval(text)  # str() of a list column, or its JSON
        except (ValueError, SyntaxError):
            lines = None
        if isinstance(lines, list) and all(isinstance(line, str) for line in lines):
            return "\n".join(lines)
    return text


def count_unjudged(tests: Sequence[Any], entry_points: Sequence[Any] | None = None) -> int:
    """How many rows' tests ``python_unit_tests`` cannot judge in the trainer (they score 0.0
    whatever the program): for ``check`` to say of a dataset it can see. Nothing is run."""
    count = 0
    for i, row in enumerate(tests):
        entry = entry_points[i] if entry_points is not None else None
        try:
            count += bool(unit_tests.prepare(_unit_test_source(row), entry).unjudged)
        except SyntaxError:
            count += 1
    return count


class UnitTests:
    """``python_unit_tests``: 1.0 when the program followed by the row's tests runs clean.

    The tests are the reference answer (the ``solution`` keyword, i.e.
    ``dataset_answer_column``): Python source such as ``assert`` lines, or a list of them
    (MBPP's ``test_list``). When the tests define ``check(candidate)`` (HumanEval) and the
    row has an ``entry_point`` column, ``check(<entry_point>)`` is appended. The completion's
    last Markdown code block tagged ``python`` runs in the sandbox (settings as for ``code``),
    then the tests, one top-level statement at a time, reporting each ``assert``'s operands
    over a pipe (``maxent_grpo.rewards.unit_tests``): 1.0 when every statement ran to its
    end, every assert holds when compared in the trainer on plain data, and the run exits 0
    within the limits; anything else 0.0. No code block scores 0.0, a missing reference None.

    Example: with solution ``"assert add(2, 3) == 5"``, a completion whose block is
    ``def add(a, b):\\n    return a + b`` scores 1.0 and one returning ``a - b`` 0.0.
    """

    __name__ = "python_unit_tests"

    def __init__(self, limits: Limits | None = None, workers: int = 2):
        self.limits = limits or Limits()
        self.workers = workers

    def __repr__(self) -> str:
        return f"UnitTests(limits={self.limits}, workers={self.workers})"

    def _prepare(self, tests: Any, entry_point: Any) -> unit_tests.Prepared:
        try:
            prepared = unit_tests.prepare(_unit_test_source(tests), entry_point)
        except SyntaxError as err:
            raise RewardError(f"python_unit_tests: the row's tests do not parse ({err})") from err
        if prepared.unjudged:
            logger.warning("python_unit_tests: scored 0.0, %s", prepared.unjudged)
        return prepared

    def _passes(self, code: str, prepared: unit_tests.Prepared) -> bool:
        nonce, message = unit_tests.control(prepared.statements)
        result = run_python(code, "", self.limits, runner=unit_tests.RUNNER, control=message)
        # The records' cost is bounded (outside.decode) and so is their time: the run's own.
        budget = self.limits.wall_seconds
        return result.ok and unit_tests.verdict(result.channel, nonce, prepared, budget)

    def __call__(
        self,
        completions: Sequence[Any],
        solution: Any = None,
        entry_point: Any = None,
        **kwargs: Any,
    ) -> list[float | None]:
        texts = contents(completions)
        refs = references(self.__name__, solution, len(texts))
        entries = entry_point if isinstance(entry_point, list) else [None] * len(texts)
        scores: list[float | None] = []
        owners, jobs, unjudged = [], [], 0
        for i, (text, tests, entry) in enumerate(zip(texts, refs, entries, strict=True)):
            code = None if tests is None else extract_code(text)
            scores.append(None if tests is None else 0.0)
            prepared = None if code is None else self._prepare(tests, entry)
            unjudged += bool(prepared and prepared.unjudged)
            if prepared and not prepared.unjudged:
                owners.append(i)
                jobs.append(lambda c=code, p=prepared: self._passes(c, p))
        for owner, ok in zip(owners, _run_all(jobs, self.workers), strict=True):
            scores[owner] = float(ok)
        log_metric = kwargs.get("log_metric")
        if unjudged and callable(log_metric):  # a dataset whose tests this cannot judge
            log_metric(f"rewards/{self.__name__}/unjudged", float(unjudged))
        return scores
