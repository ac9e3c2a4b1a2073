"""The modes of a posterior and the share of its mass in each, from optimisation alone.

NUTS cannot move between well-separated modes: a chain stays in the basin it starts in, so a fit
from dispersed starts can put most of its chains in a mode that holds a negligible share of the
mass (a robust regression's generalized posterior near a beta's breakdown point has a mode that
follows the outliers), and draws reweighted from one mode say nothing of another. A census finds
the modes by L-BFGS from several starts and weighs each by its Laplace approximation
(:mod:`robust_stan.methods.laplace`):

    share_m = Z_m / sum_j Z_j,   log Z_m ~= log p(mode_m) + (d / 2) log(2 pi) + (1 / 2) log det(Sigma_m),

which is exact for a mixture of well-separated Gaussians and has relative error O(1 / N) in each
Z_m for a posterior that concentrates (Tierney and Kadane 1986). A point (say, a chain's mean) lies
in the mode that L-BFGS reaches from it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..common.errors import RobustStanWarning
from .laplace import LaplaceApproximation, laplace_approximation

#: A mode that holds at least this share of the mass is the posterior's for a single-mode sampler.
DOMINANT_SHARE = 0.99
#: Two optima closer than this many sds (Mahalanobis) are the same mode.
SAME_MODE_DISTANCE = 0.1


@dataclass(frozen=True)
class ModeCensus:
    """The modes found (Laplace approximations, by decreasing share) and their shares of the mass."""

    modes: tuple[LaplaceApproximation, ...]
    shares: np.ndarray

    @property
    def dominant(self) -> LaplaceApproximation | None:
        """The mode holding at least :data:`DOMINANT_SHARE` of the mass (None: no mode was found,
        or several carry mass)."""
        return self.modes[0] if self.modes and self.shares[0] >= DOMINANT_SHARE else None

    def describe(self) -> str:
        """The shares, for messages: "0.62, 0.38"."""
        return ", ".join(f"{share:.3g}" for share in self.shares)


def mode_census(log_density_gradient: Callable[[np.ndarray], tuple[float, np.ndarray]],
                starts: Iterable[np.ndarray]) -> tuple[ModeCensus, list[int]]:
    """The distinct modes reached by L-BFGS from ``starts`` and their Laplace shares of the mass,
    and for each start the index (in the census) of the mode it reached, -1 where the optimum is
    left out: not a strict maximum (the optimiser did not converge, or the Hessian there is not
    negative definite)."""
    found: list[LaplaceApproximation] = []
    reached: list[int] = []
    for start in starts:
        reached.append(-1)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                approx = laplace_approximation(log_density_gradient, np.asarray(start, dtype=float))
            except (np.linalg.LinAlgError, ValueError, RuntimeError):
                continue
        not_strict = any(issubclass(w.category, RobustStanWarning) for w in caught)  # the Hessian was floored
        if not_strict or not np.isfinite(approx.log_normaliser) or not _settled(log_density_gradient, approx):
            continue
        same = [j for j, kept in enumerate(found) if _mahalanobis(kept, approx.mode) < SAME_MODE_DISTANCE]
        if not same:
            found.append(approx)
        reached[-1] = same[0] if same else len(found) - 1
    if not found:
        return ModeCensus((), np.zeros(0)), reached
    log_z = np.array([mode.log_normaliser for mode in found])
    shares = np.exp(log_z - log_z.max())
    shares /= shares.sum()
    order = np.argsort(-shares, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return (ModeCensus(tuple(found[j] for j in order), shares[order]),
            [int(rank[j]) if j >= 0 else -1 for j in reached])


def grid_censuses(log_density_gradients: list[Callable], dispersed_starts: list[np.ndarray]) -> list[ModeCensus]:
    """A census at each of a sequence of related posteriors (a grid of divergences), each from the
    dispersed starts and from the modes found at its neighbours: once up the sequence and once
    down it, so that a mode followed by continuation from either end is found wherever it exists."""
    count = len(log_density_gradients)
    censuses: list[ModeCensus] = []
    for k in range(count):
        carried = [mode.mode for mode in censuses[k - 1].modes] if k > 0 else []
        censuses.append(mode_census(log_density_gradients[k], list(dispersed_starts) + carried)[0])
    for k in reversed(range(count - 1)):
        extra = [mode.mode for mode in censuses[k + 1].modes
                 if all(_mahalanobis(kept, mode.mode) >= SAME_MODE_DISTANCE for kept in censuses[k].modes)]
        if extra:
            censuses[k] = mode_census(log_density_gradients[k], [m.mode for m in censuses[k].modes] + extra)[0]
    return censuses


class GridModes:
    """The modes of each value of a grid of related posteriors (:func:`grid_censuses`), refined as
    fits are placed among them: a fit's chains lie in the mode that L-BFGS reaches from their means,
    which adds any mode the census had missed. ``chain_locations(fit)`` gives a fit's chains' means
    on the unconstrained scale."""

    def __init__(self, log_density_gradients: list[Callable], dispersed_starts: list[np.ndarray],
                 chain_locations: Callable[[object], list[np.ndarray]]):
        self._densities = list(log_density_gradients)
        self.censuses = grid_censuses(self._densities, dispersed_starts)
        self._chain_locations = chain_locations
        # by id(fit), with the fit itself, which keeps it alive so that its id is not reused
        self._locations: dict[int, tuple[object, list[np.ndarray]]] = {}
        # (k, id(fit)) -> (answer, the number of modes of census k it was given against)
        self._holds: dict[tuple[int, int], tuple[bool, int]] = {}

    def mode_count(self, k: int) -> int:
        """The number of modes census ``k`` holds; it only grows, as :meth:`holds` finds modes."""
        return len(self.censuses[k].modes)

    def several(self, k: int) -> str | None:
        """Why value ``k`` cannot be sampled by one NUTS fit (several modes carry its mass), or None."""
        census = self.censuses[k]
        if census.modes and census.dominant is None:
            return (f"its posterior has several modes (shares {census.describe()}), which one NUTS fit cannot "
                    "sample in proportion")
        return None

    def holds(self, k: int, fit) -> bool:
        """Whether every chain of ``fit`` lies in the mode that holds value ``k``'s mass (True when the
        census found no mode, and so cannot tell). An answer given before the census of ``k`` found
        another mode is given again."""
        key = (k, id(fit))
        cached = self._holds.get(key)
        if cached is not None and cached[1] == self.mode_count(k):
            return cached[0]
        if id(fit) not in self._locations:
            self._locations[id(fit)] = (fit, self._chain_locations(fit))
        points = list(self._locations[id(fit)][1])
        census = self.censuses[k]
        if not census.modes or not points:
            answer = True
        else:
            census, reached = mode_census(self._densities[k], [m.mode for m in census.modes] + points)
            self.censuses[k] = census
            answer = census.dominant is not None and all(j == 0 for j in reached[len(reached) - len(points):])
        self._holds[key] = (answer, self.mode_count(k))
        return answer


def _settled(log_density_gradient: Callable, approx: LaplaceApproximation) -> bool:
    """Whether L-BFGS reached a stationary point: it says so, or (it can stop "abnormally" in its line
    search once rounding swamps the last gain, as when started at the optimum) the gradient there is
    below 1e-6 of the log density's size."""
    if approx.converged:
        return True
    value, gradient = log_density_gradient(approx.mode)
    return bool(np.max(np.abs(gradient)) <= 1e-6 * max(1.0, abs(float(value))))


def _mahalanobis(mode: LaplaceApproximation, point: np.ndarray) -> float:
    """The distance of ``point`` from the mode in sds of its Laplace approximation."""
    offset = np.linalg.solve(mode.cholesky, np.asarray(point, dtype=float) - mode.mode)
    return float(np.sqrt(offset @ offset))
