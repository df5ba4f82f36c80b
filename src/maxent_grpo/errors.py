"""The one error type users see: a single line naming the file, the key, the value and the fix."""


class UserError(ValueError):
    """A mistake in the user's input: entry points print it as one line and exit non-zero."""


class ConfigError(UserError):
    """A bad recipe key or value."""


class ConfigProblems(ConfigError):
    """Every problem found in one pass over a recipe: one line each (recipe/problems.py)."""

    def __init__(self, source: str, problems: list[str] | tuple[str, ...]):
        self.source = source
        self.problems = tuple(problems)
        super().__init__("\n".join(self.problems))

    @property
    def summary(self) -> str:
        count = len(self.problems)
        return f"{count} problem{'s' if count != 1 else ''} in {self.source}"


def error_report(exc: UserError) -> str:
    """What an entry point prints for a user error: `error: ` before each problem's line, and
    the count after several (`3 problems in recipe.yaml`)."""
    if isinstance(exc, ConfigProblems) and len(exc.problems) > 1:
        return "\n".join([*(f"error: {line}" for line in exc.problems), exc.summary])
    return f"error: {exc}"


def exception_text(exc: BaseException) -> str:
    """A library exception as one line: its message (a ValueError's), else `Type: message`
    (a bare assert, a KeyError of an enum lookup: their message alone says nothing)."""
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    if not isinstance(exc, ValueError):
        text = f"{type(exc).__name__}: {text}".rstrip(": ")
    return " ".join(text.split())


# Exit codes shared by the trainer, the launcher and the Slurm wrapper.
EXIT_USER_ERROR = 2
# The trainer saved a complete checkpoint because it was asked to stop (Slurm signal): requeue me.
EXIT_CHECKPOINTED = 85
