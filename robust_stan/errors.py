"""Exceptions raised by robust-stan."""


class RobustStanInputError(ValueError):
    """Bad input from the user; the message names the argument at fault."""


class StanCompileError(RuntimeError):
    """Stan could not compile a program; the message points at the user's lines."""
