"""The one error type for bad input."""

__all__ = ["UsageError"]


class UsageError(ValueError):
    """Bad input from the command line or a config: the commands report it as one line naming what was wrong and
    what is accepted, with exit status 2, before anything is written."""
