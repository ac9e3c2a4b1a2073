"""Exceptions raised by robust-stan, and the checks of a positive number, a count, a seed and inits."""

import math
from collections.abc import Mapping

import numpy as np


class RobustStanInputError(ValueError):
    """Bad input from the user; the message names the argument at fault."""


class RobustStanWarning(UserWarning):
    """A run that will go ahead but probably not as the user means (e.g. data with almost no influence)."""


class StanCompileError(RuntimeError):
    """Stan could not compile a program; the message points at the user's lines."""


def require_positive(name: str, value) -> float:
    """``value`` as a float if positive and finite; otherwise an error naming ``name``."""
    if isinstance(value, (bool, np.bool_)):
        raise RobustStanInputError(f"{name}: must be a positive number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise RobustStanInputError(f"{name}: must be a positive number, got {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise RobustStanInputError(f"{name}: must be positive and finite, got {value}")
    return number


def require_count(name: str, value, low: int = 1) -> int:
    """``value`` as an int if it is an integer (not a bool) >= ``low``; otherwise an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise RobustStanInputError(f"{name}: must be an integer >= {low}, got {value!r}")
    return int(value)


def require_seed(seed) -> int | None:
    """``seed`` as an int if it is None or an integer (not a bool) >= 0; otherwise an error naming it."""
    if seed is None:
        return None
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise RobustStanInputError(f"seed: must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def require_inits(inits, chains: int, parameter_names, every: bool = False) -> list[dict] | None:
    """Starting values by parameter name -- one dict for every chain, or a list of one per chain --
    as one dict of float arrays per chain; None stays None. Unknown names, values that are not
    finite numbers and, with ``every``, a parameter left out are errors naming ``inits``."""
    if inits is None:
        return None
    per_chain = [inits] * chains if isinstance(inits, Mapping) else list(inits)
    if len(per_chain) != chains or not all(isinstance(i, Mapping) for i in per_chain):
        raise RobustStanInputError(f"inits: give one dict, or a list of {chains} dicts (one per chain)")
    names = list(parameter_names)
    out = []
    for init in per_chain:
        missing = sorted(set(names) - set(init))
        if every and missing:
            raise RobustStanInputError(f"inits: give a value for every parameter; missing {missing}")
        unknown = sorted(set(init) - set(names))
        if unknown:
            raise RobustStanInputError(f"inits: unknown parameter(s) {unknown}; the model has {names}")
        values = {}
        for name, value in init.items():
            try:
                values[name] = np.asarray(value, dtype=float)
            except (TypeError, ValueError):
                values[name] = np.asarray(np.nan)
            if not np.all(np.isfinite(values[name])):
                raise RobustStanInputError(f"inits: {name} must be finite numbers, got {value!r}")
        out.append(values)
    return out
