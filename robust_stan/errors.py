"""Exceptions raised by robust-stan, and the one check of a positive number."""

import math


class RobustStanInputError(ValueError):
    """Bad input from the user; the message names the argument at fault."""


class StanCompileError(RuntimeError):
    """Stan could not compile a program; the message points at the user's lines."""


def require_positive(name: str, value) -> float:
    """``value`` as a float if positive and finite; otherwise an error naming ``name``."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RobustStanInputError(f"{name}: must be a positive number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise RobustStanInputError(f"{name}: must be positive and finite, got {value}")
    return number
