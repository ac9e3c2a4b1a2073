"""Which ArviZ line is installed: 0.x (``InferenceData``) or 1.x (arviz-base, arviz-stats)."""

from __future__ import annotations

from functools import cache


@cache
def arviz_major() -> int:
    """Major version of the installed ArviZ (0 or 1).

    Returns
    -------
    int
        The first number of ``arviz.__version__``.
    """
    import arviz

    return int(arviz.__version__.split(".")[0])
