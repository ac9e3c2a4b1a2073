"""Starting NUTS's chains in a posterior's largest mode (``inits="mode"`` of :meth:`Model.sample` and
:meth:`StanProgramModel.sample`, and :func:`robust_stan.select_divergence`).

A robust posterior can have a mode that follows the outliers and holds almost none of the mass;
NUTS cannot leave the basin a chain starts in, so from Stan's dispersed starts (uniform(-2, 2) on
the unconstrained scale) chains can settle there. The mode census
(:mod:`robust_stan.methods.mode_census`) finds the modes by L-BFGS and weighs them by their
Laplace approximations; each chain then starts from its own draw of the largest mode's Laplace
approximation.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np

from ..building.data import PreparedData
from ..common.errors import RobustStanInputError, RobustStanWarning
from ..gradients.oracles import GradientOracle
from ..methods.mode_census import ModeCensus, mode_census

#: Dispersed starts of a census of one posterior (uniform(-2, 2) on the unconstrained scale, as Stan's
#: inits). On high-leverage outliers at beta = 0.2 (N = 200) 10 of 64 such starts reach the mode that
#: holds the mass, so 8 starts miss it a quarter of the time and 32 starts 0.4% of the time.
CENSUS_STARTS = 32
#: Dispersed starts at each value of a grid, whose census also starts from its neighbours' modes.
GRID_CENSUS_STARTS = 8


def dispersed_starts(dimension: int, seed: int | None, count: int = CENSUS_STARTS) -> list[np.ndarray]:
    """``count`` points drawn as Stan draws its inits, from a generator seeded by ``seed`` (None: fresh
    entropy, so an unseeded run is not repeatable here either)."""
    rng = np.random.default_rng(None if seed is None else [seed, 7])
    return list(rng.uniform(-2.0, 2.0, size=(count, dimension)))


def inits_in_largest_mode(inits: str, oracle: GradientOracle, inits_at: Callable[[np.ndarray], list[dict]],
                          chains: int, seed: int | None) -> list[dict] | None:
    """``inits="mode"`` for any model: one start per chain in the largest mode of ``oracle``'s
    posterior, warning when no mode holds the mass; None (the engine's own starts, with a warning)
    when the census finds no strict mode. ``inits_at`` turns unconstrained points (one per row) into
    the starting values the model's ``sample`` takes."""
    if inits != "mode":
        raise RobustStanInputError(f"inits: give starting values (a dict, or one per chain), or 'mode'; "
                                   f"got {inits!r}")
    census = mode_census(oracle.log_density_gradient, dispersed_starts(oracle.dimension, seed))[0]
    if not census.modes:
        warnings.warn(f"inits='mode': L-BFGS found no strict mode from {CENSUS_STARTS} dispersed starts; the "
                      "chains start from the engine's own starts", RobustStanWarning, stacklevel=3)
        return None
    if census.dominant is None:
        warnings.warn(f"inits='mode': the posterior has several modes (shares {census.describe()}); every chain "
                      "starts in the largest, and NUTS will not visit the others", RobustStanWarning, stacklevel=3)
    return inits_at(largest_mode_draws(census, chains, seed))


def largest_mode_draws(census: ModeCensus, chains: int, seed: int | None) -> np.ndarray:
    """One draw per chain of the largest mode's Laplace approximation (unconstrained points, one per row)."""
    return census.modes[0].draws(chains, np.random.default_rng(None if seed is None else [seed, 11]))


def starts_in_largest_mode(program, prepared: PreparedData, census: ModeCensus, chains: int,
                           seed: int | None) -> list[dict]:
    """:func:`largest_mode_draws` of a model's ``census``, as constrained values by parameter name on
    the outcome's own scale (as the model's ``sample`` takes them)."""
    return program.inits_at(largest_mode_draws(census, chains, seed), prepared.stan_data, prepared.scaling)
