"""The one error type users see: a single line naming the file, the key, the value and the fix."""


class UserError(ValueError):
    """A mistake in the user's input: entry points print it as one line and exit non-zero."""


# Exit codes shared by the trainer, the launcher and the Slurm wrapper.
EXIT_USER_ERROR = 2
# The trainer saved a complete checkpoint because it was asked to stop (Slurm signal): requeue me.
EXIT_CHECKPOINTED = 85
