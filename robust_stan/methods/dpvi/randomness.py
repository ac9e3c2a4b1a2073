"""The random numbers that protect a private release: Poisson subsamples and Gaussian noise.

Whoever holds a release and knows how its random numbers were made must not be able to
make them again: with the noise known, the clipped gradient sums come out of the released
noisy gradients and the privacy is gone. So by default every private random number comes
from ChaCha20 (``randomgen.ChaCha`` with 20 rounds, a NumPy bit generator) keyed with 256
bits from the operating system's entropy (:func:`os.urandom`). The key is held only by the
generator while the mechanism runs; it is never returned or stored.

Why ChaCha20: it is a stream cipher, so its output cannot be told from random or predicted
without the key (NumPy's PCG64 makes no such claim, and a seed of 31 or 64 bits can be
searched). d3p (DP VI in JAX) uses the same cipher for the same reason, as Opacus' secure
mode uses a cipher-based generator (AES-CTR) seeded from the OS; ``randomgen`` gives it to
NumPy's ``Generator`` unchanged, so the samplers (``random``, ``standard_normal``) are
NumPy's own.

A user seed makes a run reproducible (tests, examples, papers' tables): the generator is
then NumPy's PCG64 seeded from it, as before, and the release is only as private as the
seed is secret (:func:`warn_seeded_release`).

Floating-point noise: Mironov (2012) showed for the Laplace mechanism, and Jin et al. (2022)
for Gaussian samplers, that the low-order bits of x + Z in floating point can reveal x.
A private run draws each noise value as the sum of 4 standard normals halved
(:func:`private_normal`), Holohan and Braghin's (2021) defence, which Opacus' secure mode
uses too: the sum is exactly N(0, 1) in real arithmetic and smears the floating-point
artefacts that the attacks read. It is a mitigation, not a proof: nothing here snaps or
discretises the noise (Mironov's snapping, or a discrete Gaussian), and the guarantee is
the real-valued Gaussian mechanism's. A seeded run keeps one normal per value, so seeded
releases made before this defence are drawn again exactly.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from ...common.errors import RobustStanWarning

KEY_BYTES = 32  # ChaCha20's key: 256 bits
PRIVATE_NORMAL_DRAWS = 4  # normals summed per noise value in a private run (Holohan and Braghin 2021)
CHACHA_ROUNDS = 20

SEEDED_RELEASE_WARNING = ("seed: a DP-VI run with a seed is only as private as the seed is secret: anyone who "
                          "learns or guesses it can draw the noise again and subtract it from the release. Use a "
                          "seed for tests and examples; leave seed=None for a private release (the noise then "
                          "comes from ChaCha20 keyed from the operating system's entropy)")


def fresh_key() -> int:
    """256 bits from the operating system's entropy, as an integer (a ChaCha20 key)."""
    return int.from_bytes(os.urandom(KEY_BYTES), "little")


def chacha_generator(key: int, counter: int = 0) -> np.random.Generator:
    """NumPy's ``Generator`` on ChaCha20 with this 256-bit ``key``, reading its keystream from
    position ``counter`` (positions far apart give independent streams of one key).

    Parameters
    ----------
    key : int
        The cipher's key, in [0, 2**256).
    counter : int
        The keystream position to start at, in 32-bit words (block k starts at 16 k), in
        [0, 2**128).
    """
    from randomgen import ChaCha

    return np.random.Generator(ChaCha(key=key, counter=counter, rounds=CHACHA_ROUNDS))


def is_secure(generator: np.random.Generator) -> bool:
    """Whether ``generator`` draws from ChaCha20 (the default of a private run)."""
    bit_generator = generator.bit_generator
    return type(bit_generator).__name__ == "ChaCha" and bit_generator.state["state"]["rounds"] == CHACHA_ROUNDS


def private_generator(seed: int | None) -> np.random.Generator:
    """The generator of a private mechanism's noise and subsamples: ChaCha20 with a fresh key
    when ``seed`` is None; else NumPy's default generator from ``seed`` (reproducible; the
    release is then only as private as the seed is secret: :func:`warn_seeded_release`).

    Parameters
    ----------
    seed : int or None
        None for a private run; an integer for a reproducible one.
    """
    return chacha_generator(fresh_key()) if seed is None else np.random.default_rng(seed)


def warn_seeded_release(seed: int | None, stacklevel: int = 2) -> None:
    """A :class:`~robust_stan.common.errors.RobustStanWarning` when ``seed`` is given: the release
    is then only as private as the seed is secret.

    Parameters
    ----------
    seed : int or None
        The run's seed.
    stacklevel : int
        Passed to :func:`warnings.warn`, so that the warning points at the user's call.
    """
    if seed is not None:
        warnings.warn(SEEDED_RELEASE_WARNING, RobustStanWarning, stacklevel=stacklevel + 1)


def private_normal(rng: np.random.Generator, size: int, draws: int = PRIVATE_NORMAL_DRAWS) -> np.ndarray:
    """``size`` standard normals, each the sum of ``draws`` independent standard normals divided by
    sqrt(``draws``) (exactly N(0, 1); with several draws, Holohan and Braghin's defence against
    floating-point attacks on the Gaussian mechanism).

    Parameters
    ----------
    rng : numpy.random.Generator
        The generator (ChaCha20 in a private run).
    size : int
        How many values.
    draws : int
        Normals summed per value (1: a plain draw).
    """
    if draws == 1:
        return rng.standard_normal(size)
    return rng.standard_normal((draws, size)).sum(axis=0) / np.sqrt(draws)


class SubsampleKey:
    """The key from which each partition draws its rows of each step's Poisson subsample, where
    the rows live (``robust_stan/methods/dpvi/partitioned.py``); it is not the noise's key, so
    the workers that hold it cannot remove the noise.

    Parameters
    ----------
    seed : int or None
        None: a fresh 256-bit ChaCha20 key, and each (step, partition) its own counter range of
        that key's stream. An integer: a key derived from it by NumPy's ``SeedSequence`` and
        PCG64 generators per (step, partition), as before (reproducible, not private).
    """

    STREAM_WORDS = 2**64  # keystream words of one (step, partition) stream: never exhausted

    def __init__(self, seed: int | None):
        self.key: int | np.ndarray = (fresh_key() if seed is None
                                      else np.random.SeedSequence([seed, 1]).generate_state(4))

    def generator(self, step: int, partition: int) -> np.random.Generator:
        """The generator of ``partition``'s rows of step ``step``'s subsample.

        Parameters
        ----------
        step : int
            The DP-SGD step t (0-based).
        partition : int
            The partition's index.
        """
        if isinstance(self.key, int):  # a ChaCha20 key (no seed); an array is the seeded SeedSequence state
            return chacha_generator(self.key, ((step << 32) + partition) * self.STREAM_WORDS)
        return np.random.default_rng([*self.key, step, partition])
