"""A tool module that cannot be imported on this node (`maxent-grpo rehearse`'s test)."""

import no_such_package_here  # noqa: F401 - on purpose: the package is on no node


def compute(code: str) -> str:
    """Never reached.

    Args:
        code: ignored.
    """
    return ""
