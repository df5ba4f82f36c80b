"""Every problem of a recipe in one pass: where the collecting happens, in one place.

Each rule is written once and raises a one-line ConfigError (recipe/checks.py, the parser, the
sections' `__post_init__`, TRL's own checks). The stages of reading a recipe (`read_recipe`,
`build_recipe`, `check_recipe`) run their rules inside `collecting(source)`:

    with collecting(path) as problems:
        with problems.check("num_generations"):
            rule_that_may_raise()          # a ConfigError becomes one problem; the stage goes on

A failing rule adds its line and marks its keys bad; the stage goes on with the values that
are fine, and rules that depend on a bad key are skipped (`problems.failed(key)`), so one
mistake is reported once. The outermost `collecting` raises one ConfigProblems with every line
when it ends; nested ones (`parse_recipe` around read + build, `maxent-grpo check` around the
whole of `prepare`) hand their lines outwards instead.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from maxent_grpo.errors import ConfigError, ConfigProblems, UserError

_ACTIVE: ContextVar[Problems | None] = ContextVar("maxent_grpo_recipe_problems", default=None)


class Problems:
    """The problems found so far in one recipe, one line each, in the order found."""

    def __init__(self, source: str):
        self.source = source
        self.lines: list[str] = []
        self.bad_keys: set[str] = set()

    def add(self, message: str, keys: Iterable[str] = ()) -> None:
        """One problem; lines that do not name a file get the recipe's path in front."""
        line = " ".join(message.split())
        if not line.startswith((f"{self.source}:", "command line:")):
            line = f"{self.source}: {line}"
        if line not in self.lines:
            self.lines.append(line)
        self.bad_keys.update(keys)

    def add_error(self, exc: UserError, keys: Iterable[str] = ()) -> None:
        keys = tuple(keys)
        lines = exc.problems if isinstance(exc, ConfigProblems) else (str(exc),)
        for line in lines:
            self.add(line, keys)

    def failed(self, *keys: str) -> bool:
        """Whether a problem was already found with one of these keys."""
        return bool(self.bad_keys.intersection(keys))

    @contextmanager
    def check(self, *keys: str) -> Iterator[None]:
        """Run one rule: its ConfigError becomes a problem of `keys`, and execution goes on."""
        try:
            yield
        except ConfigError as exc:
            self.add_error(exc, keys)

    def raise_if_any(self) -> None:
        if self.lines:
            raise ConfigProblems(self.source, self.lines)


@contextmanager
def collecting(source: str) -> Iterator[Problems]:
    """The problems of a stage; raised together when the outermost stage ends.

    A UserError that stops the stage (an unreadable file, an impossible allocation) is raised
    as it is when it is the only problem, and joins the others otherwise.
    """
    outer = _ACTIVE.get()
    if outer is not None:
        yield outer
        return
    problems = Problems(source)
    token = _ACTIVE.set(problems)
    try:
        yield problems
    except UserError as exc:
        if not problems.lines:
            raise
        problems.add_error(exc)
    finally:
        _ACTIVE.reset(token)
    problems.raise_if_any()


@contextmanager
def rule(source: str, *keys: str) -> Iterator[None]:
    """One rule run outside a stage (e.g. by the launcher): inside an outer `collecting` its
    problem joins the others and execution goes on; alone it raises as usual."""
    with collecting(source) as problems, problems.check(*keys):
        yield


def run_checks(*checks: Callable[[], None]) -> None:
    """Run every check of a section (its `__post_init__`), then raise their problems together.

    The lines carry no file name: the stage that builds the section adds it.
    """
    lines: list[str] = []
    for check in checks:
        try:
            check()
        except ConfigProblems as exc:
            lines.extend(exc.problems)
        except ConfigError as exc:
            lines.append(str(exc))
    if len(lines) == 1:
        raise ConfigError(lines[0])
    if lines:
        raise ConfigProblems("the recipe", lines)
