"""Starting NUTS's chains in a posterior's largest mode (``Model.sample(inits="mode")`` and
:func:`robust_stan.select_divergence`).

A robust posterior can have a mode that follows the outliers and holds almost none of the mass;
NUTS cannot leave the basin a chain starts in, so from Stan's dispersed starts (uniform(-2, 2) on
the unconstrained scale) chains can settle there. The mode census
(:mod:`robust_stan.methods.mode_census`) finds the modes by L-BFGS and weighs them by their
Laplace approximations; each chain then starts from its own draw of the largest mode's Laplace
approximation.
"""

from __future__ import annotations

import numpy as np

from ..building.data import PreparedData, with_switches
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


def census_from_dispersed_starts(program, prepared: PreparedData, seed: int | None) -> ModeCensus:
    """The census of the posterior of ``prepared`` from :func:`dispersed_starts`. A search, not a
    guarantee: a mode whose basin none of the starts falls in is missed."""
    oracle = program.oracle_for(with_switches(prepared.stan_data, pointwise=False))
    return mode_census(oracle.log_density_gradient, dispersed_starts(oracle.dimension, seed))[0]


def starts_in_largest_mode(program, prepared: PreparedData, census: ModeCensus, chains: int,
                           seed: int | None) -> list[dict]:
    """One start per chain, each a draw of the largest mode's Laplace approximation, as constrained
    values by parameter name on the outcome's own scale (as :meth:`Model.sample` takes them)."""
    rng = np.random.default_rng(None if seed is None else [seed, 11])
    return program.inits_at(census.modes[0].draws(chains, rng), prepared.stan_data, prepared.scaling)
