"""Seeds: a run given ``seed=None`` draws one from the operating system's entropy, once, where
it is needed, and records None (the run cannot be repeated); a run given a seed records it."""

import secrets

from .errors import require_seed

#: Drawn seeds lie in [0, SEED_LIMIT): every engine accepts them (httpstan's seed is a C int).
SEED_LIMIT = 2**31 - 1


def fresh_seed() -> int:
    """A seed drawn from the operating system's entropy, in [0, SEED_LIMIT)."""
    return secrets.randbelow(SEED_LIMIT)


def seed_to_use(seed) -> int:
    """The seed a run uses: ``seed`` (checked, an error naming it when it is not a non-negative
    integer or None), or a fresh one when it is None.

    Parameters
    ----------
    seed : int or None
        The user's seed.

    Returns
    -------
    int
        ``seed``, or a seed from :func:`fresh_seed`.
    """
    seed = require_seed(seed)
    return fresh_seed() if seed is None else seed
