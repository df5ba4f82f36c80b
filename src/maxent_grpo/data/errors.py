"""The data package's one error type."""

from maxent_grpo.errors import UserError


class DataError(UserError):
    """A user error in the data configuration; the message is one line: what is wrong, the fix."""
