"""Choosing the divergence's beta (or gamma) by the H-score, from few fits (Yonekura and Sugasawa 2023).

The pseudo-model of a loss is f(y; theta) propto exp(-w l(y; theta)); its Hyvarinen score at
an observation is H_i = 2 d^2/dy^2 log f + (d/dy log f)^2, which needs no normalising
constant (Hyvarinen 2005; Jewson and Rossell 2022 for improper models). The criterion of a
divergence is the posterior mean of sum_i H_i(theta) under that divergence's generalized
posterior, minimised over a grid. With s = d/dy log p(y_i | theta) and s2 = d^2/dy^2 log p
(the program's ``y_score``), -l's derivatives are, per divergence (the losses of
:mod:`robust_stan.building.divergences`):

- KL:    s,                          s2
- beta:  p^b s,                      p^b (b s^2 + s2)
- gamma: g (-l) s,                   g (-l) (g s^2 + s2)     (decomposable form; -l = c p^g)

and H_i = 2 w (second) + w^2 (first)^2.

The ``"mse"`` criterion (every family, discrete ones included) needs no posterior draws: the
estimated mean squared error of the minimum-loss estimate theta_hat_g at each grid value,
tr(J_g^-1 I_g J_g^-1) / N + ||theta_hat_g - theta_hat_pilot||^2 on the unconstrained scale
(Warwick and Jones 2005), with the pilot then moved to the minimiser until it stays
(Basak, Basu and Ghosh 2021's iterated version); J and I come from
:func:`robust_stan.methods.selection.calibration.minimum_loss`.

Reweighting (``fits="reweight"``): draws of the posterior at divergence f stand in for the
one at g through importance ratios exp(-w (L_g(theta) - L_f(theta))), L = sum_i l_i (the
prior cancels), Pareto-smoothed (:mod:`robust_stan.methods.importance`), provided f's draws lie
in the mode that holds g's mass (:mod:`robust_stan.methods.mode_census`: k-hat cannot flag a
mode the draws never visited); where k-hat exceeds 0.7, or no fit lies in that mode, a new fit
is made at g, unless g lies beyond a stretch of values whose criterion rises from the best one
(it cannot be the best: it is left out). The grid is walked outwards from the pilot, so each
value is reweighted from the nearest suitable value fitted so far.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ...building.divergences import KL, BetaD, Divergence, DivergenceCode, GammaD
from ..importance import K_HAT_LIMIT, psis
from ..mode_census import GridModes
from .calibration import MinimumLoss

#: A confirming fit whose criterion is worse than its reweighted value by this many combined standard
#: errors, or whose chains disagree on it (R-hat above MODES_RHAT), marks a breakdown.
BREAKDOWN_Z = 3.0
MODES_RHAT = 1.1


def grid_value(divergence: Divergence) -> float:
    """A grid point's position: beta or gamma, and 0 for KL."""
    return 0.0 if divergence.code == DivergenceCode.KL else float(divergence.stan_data()["divergence_param"])


def loss_y_derivatives(log_lik: np.ndarray, robust_loss: np.ndarray, y_score: np.ndarray,
                       divergence: Divergence) -> tuple[np.ndarray, np.ndarray]:
    """d/dy and d^2/dy^2 of -l(y_i; theta) per row, from log p, the loss and the y_score pairs
    (..., N, 2) of the program (module docstring)."""
    s, s2 = y_score[..., 0], y_score[..., 1]
    if divergence.code == DivergenceCode.KL:
        return s, s2
    if divergence.code == DivergenceCode.BETA:
        b = grid_value(divergence)
        power = np.exp(b * log_lik)
        return power * s, power * (b * s**2 + s2)
    g = grid_value(divergence)  # decomposable gamma: -l = c p^g
    return g * -robust_loss * s, g * -robust_loss * (g * s**2 + s2)


def hscore_per_draw(log_lik: np.ndarray, robust_loss: np.ndarray, y_score: np.ndarray, divergence: Divergence,
                    learning_rate: float) -> np.ndarray:
    """sum_i H_i at each draw: (chains, draws) from per-row (chains, draws, N) log p, loss and the
    y_score pairs (chains, draws, N, 2), all on the program's own (fitted) scale of y."""
    first, second = loss_y_derivatives(log_lik, robust_loss, y_score, divergence)
    return (2 * learning_rate * second + learning_rate**2 * first**2).sum(axis=-1)


@dataclass(frozen=True)
class Evaluation:
    """What a set of draws says at one divergence: the total loss L (chains, draws) and the
    criterion's value at each draw (chains, draws)."""

    total_loss: np.ndarray
    criterion: np.ndarray


@dataclass
class GridPoint:
    """One grid value's criterion: its estimate and Monte Carlo standard error, where it came from
    (``source``: "fit", or the grid value whose draws were reweighted) and the k-hat of that."""

    divergence: Divergence
    criterion: float
    mcse: float
    source: str
    pareto_k: float = float("nan")
    estimate: np.ndarray | None = None  # the minimum-loss estimate (unconstrained), for "mse"


def direct_estimate(values: np.ndarray) -> tuple[float, float]:
    """The mean of per-draw values (chains, draws) and its Monte Carlo standard error (ArviZ's)."""
    import arviz

    return float(values.mean()), float(arviz.mcse(np.asarray(values, dtype=float), method="mean"))


def reweighted_estimate(values: np.ndarray, log_ratios: np.ndarray) -> tuple[float, float, float]:
    """Self-normalised PSIS estimate of the mean of ``values`` under the target, its standard
    error and k-hat. The error is the importance-sampling one, sqrt(sum w^2 (v - mean)^2), times
    sqrt(S / ESS) of the values under the proposal (the draws' autocorrelation)."""
    import arviz

    log_weights, khat = psis(log_ratios)
    weights = np.exp(log_weights)
    estimate = float(np.sum(weights * values))
    spread = float(np.sqrt(np.sum(weights**2 * (values - estimate) ** 2)))
    ess = float(arviz.ess(np.asarray(values, dtype=float), method="bulk"))
    return estimate, spread * float(np.sqrt(values.size / max(ess, 1.0))), khat


def walk_grid(grid: list[Divergence], pilot: int, fit_at: Callable[[Divergence, object], object],
              evaluate: Callable[[object, Divergence], Evaluation], confirm: bool = True,
              modes: GridModes | None = None) -> tuple[list[GridPoint], dict]:
    """Each grid value's criterion: a fit at ``grid[pilot]``, then the other values in order of their
    distance from it, each reweighted from the nearest fitted value (a new fit where k-hat > 0.7,
    unless the value lies beyond a stretch that rises from the best value so far: then it is left
    out as NaN, :func:`_best_below_a_rise`).
    ``fit_at(divergence, nearest_fit)`` fits (warm-started
    from the nearest fit; None: a fit of its own, as for the pilot);
    ``evaluate(fit, divergence)`` gives an :class:`Evaluation`. Returns the points in grid order
    and the fits by grid index.

    ``modes`` (a :class:`~robust_stan.methods.mode_census.GridModes` of the grid): reweighted draws
    describe only the modes their base fit visited, and near a beta's breakdown point the
    generalized posterior has a second mode, which k-hat cannot flag when the base fit never
    visited it. With a census, a value is reweighted only from a fit whose chains all lie in the
    mode that holds its mass (the nearest such fit; a new fit where there is none), every fit is
    one of its own (``fit_at(d, None)``: the caller starts it in its value's dominant mode), and a
    value whose mass no single mode holds is left out (NaN: one NUTS fit cannot sample its modes
    in proportion).

    ``confirm``: the best value, unless it was fitted on its own, is fitted so and its criterion
    replaced by that fit's own; this repeats until the best value is such a fit (one extra fit when
    the choice stands, and the choice's fit is then at hand). A confirming fit that finds what its
    reweighted value did not (a worse criterion, or chains in several modes: :func:`_breaks_down`;
    without a census, fits from dispersed starts find the other mode this way) marks a breakdown:
    the values below it that are still in doubt (unconfirmed, and below the best confirmed
    criterion) are re-evaluated from its draws (NaN, with the reason in ``source``, where k-hat >
    0.7), and the next fit bisects, by grid position, the values still in doubt instead of walking
    up from the breakdown one grid step at a time. This rests on robustness growing with beta: a
    posterior that follows the outliers at one value does so at the smaller ones. Where that fails,
    a value below a breakdown whose reweighting from it has k-hat > 0.7 is left out (NaN) and could
    be the best one missed; so is a value whose reweighting has k-hat > 0.7 above a rise from the
    best value (and it is fitted at the end if the final points no longer show that rise); the
    others keep a criterion from a fit or from a reweighting that k-hat accepts. A probe whose own
    chains split between modes keeps its own (mixture) criterion and may still be chosen; its fit
    then carries the engine's convergence warning."""
    positions = np.array([grid_value(d) for d in grid])
    left_out: set[int] = set()  # left out (NaN) above a rise from the best value: refitted if the rise goes
    several_modes: set[int] = set()  # left out (NaN): no single mode holds the mass
    fits: dict[int, object] = {}
    own: dict[int, Evaluation] = {}  # each fit's evaluation at its own divergence
    points: dict[int, GridPoint] = {}

    def fit_here(k: int, nearest) -> None:
        fits[k] = fit_at(grid[k], None if modes is not None else nearest)
        own[k] = evaluate(fits[k], grid[k])
        points[k] = GridPoint(grid[k], *direct_estimate(own[k].criterion), "fit")
        if modes is not None:
            independent.add(k)

    def in_its_mode(base: int, k: int) -> bool:
        """Whether the draws of the fit at grid[base] lie in the mode that holds grid[k]'s mass."""
        return modes is None or modes.holds(k, fits[base])

    def reweighted(base: int, k: int) -> tuple[float, float, float]:
        """grid[k]'s criterion from the draws of the fit at grid[base]: estimate, its error, k-hat."""
        there = evaluate(fits[base], grid[k])
        return reweighted_estimate(there.criterion, -(there.total_loss - own[base].total_loss))

    def nearest_fit(k: int, among=None) -> int | None:
        """The fitted value nearest grid[k] among those that pass ``among`` (None: any)."""
        for j in sorted(fits, key=lambda j: (abs(positions[j] - positions[k]), j)):
            if among is None or among(j):
                return j
        return None

    def base_in_its_mode(k: int) -> int | None:
        """The nearest fit whose draws lie in the mode holding grid[k]'s mass, asked again should the
        asking find another mode of grid[k] (the census only grows, so this ends)."""
        while True:
            count = modes.mode_count(k) if modes is not None else 0
            base = nearest_fit(k, among=lambda j: in_its_mode(j, k))
            if modes is None or modes.mode_count(k) == count:
                return base

    def leave_out_if_several_modes(k: int) -> bool:
        """Whether grid[k] has several modes that carry its mass (then it is left out: NaN, the reason)."""
        reason = modes.several(k) if modes is not None else None
        if reason:
            points[k] = GridPoint(grid[k], float("nan"), float("nan"), f"not evaluated: {reason}",
                                  points[k].pareto_k if k in points else float("nan"))
            several_modes.add(k)
        return bool(reason)

    independent = {pilot}
    fit_here(pilot, None)
    in_its_mode(pilot, pilot)  # places the pilot's chains, which may find another mode of its value
    leave_out_if_several_modes(pilot)  # its fit stays, for reweighting the others
    for k in sorted(range(len(grid)), key=lambda j: (abs(positions[j] - positions[pilot]), j)):
        if k in points or leave_out_if_several_modes(k):
            continue
        base = base_in_its_mode(k)
        if leave_out_if_several_modes(k):  # placing the fits' chains found another mode that carries mass
            continue
        khat = float("nan")
        if base is not None:
            estimate, mcse, khat = reweighted(base, k)
            if khat <= K_HAT_LIMIT:
                points[k] = GridPoint(grid[k], estimate, mcse, f"reweighted from {grid[base]!r}", khat)
                continue
        why = (f"k-hat {khat:.2f} from {grid[base]!r}" if base is not None else
               "no fit so far lies in the mode that holds its mass")
        best = _best_below_a_rise(points, positions, k, left_out | several_modes)
        if best is not None:
            points[k] = GridPoint(grid[k], float("nan"), float("nan"),
                                  f"not evaluated: {why}, and above a stretch that "
                                  f"rises from the best value so far, {grid[best]!r}", khat)
            left_out.add(k)
            continue
        fit_here(k, fits[base] if base is not None else None)
        points[k].pareto_k = khat  # the reweighting's k-hat, which called for this fit (NaN: none was tried)
    broken = False
    while True:
        while confirm:  # until the best value stands on a fit of its own
            best = min(points, key=lambda j: (_finite_or_inf(points[j].criterion), j))
            if best in independent or np.isnan(points[best].criterion):  # (NaN: no value has a criterion)
                break
            floor = min(_finite_or_inf(points[j].criterion) for j in independent)
            suspects = sorted((j for j in points if j not in independent and points[j].criterion <= floor),
                              key=lambda j: positions[j])
            probe = suspects[len(suspects) // 2] if broken and suspects else best
            before = points[probe]
            fit_here(probe, None)
            independent.add(probe)
            points[probe].source = f"fit of its own (the {before.source} value was {before.criterion:.6g})"
            points[probe].pareto_k = before.pareto_k
            if not _breaks_down(own[probe], points[probe], before):
                continue
            broken = True
            for j in (j for j in suspects if positions[j] < positions[probe]):
                reason = f"below the breakdown found at {grid[probe]!r}"
                if not in_its_mode(probe, j):
                    points[j] = GridPoint(grid[j], float("nan"), float("nan"), f"not evaluated: {reason}, and its "
                                          "fit's draws are not in the mode that holds its mass")
                    continue
                estimate, mcse, khat = reweighted(probe, j)
                points[j] = (GridPoint(grid[j], estimate, mcse, f"reweighted from {grid[probe]!r} ({reason})", khat)
                             if khat <= K_HAT_LIMIT else
                             GridPoint(grid[j], float("nan"), float("nan"), f"not evaluated: {reason}, and k-hat "
                                       f"{khat:.2f} from its fit", khat))
        # the confirming fits may have moved the best value: a value left out above a rise that the
        # final points no longer show is fitted after all (and the choice confirmed again)
        revived = [k for k in sorted(left_out) if _best_below_a_rise(points, positions, k,
                                                                     left_out | several_modes) is None]
        if not revived:
            return [points[k] for k in range(len(grid))], fits
        for k in revived:
            left_out.discard(k)
            khat = points[k].pareto_k
            nearest = nearest_fit(k)
            assert nearest is not None  # fits holds the fits of the grid values evaluated so far
            fit_here(k, fits[nearest])
            points[k].pareto_k = khat


def _best_below_a_rise(points: dict[int, GridPoint], positions: np.ndarray, k: int,
                       left_out: set[int]) -> int | None:
    """The best value so far, if grid value ``k`` lies above it beyond a stretch of evaluated values
    that rises from it: each value no lower than the one before it by more than :data:`BREAKDOWN_Z`
    combined standard errors, and the last worse than the best by more than that. Robustness grows
    with beta and efficiency falls, so the criterion does not fall again past such a rise, and a
    value there needs no fit of its own when its reweighting is unreliable (None: it may). Values
    in the stretch that were left out by this rule (``left_out``) are passed over; any other value
    there without a criterion means no decision (None)."""
    finite = {j for j in points if np.isfinite(points[j].criterion)}
    if not finite:
        return None
    best = min(finite, key=lambda j: (points[j].criterion, j))
    if positions[best] >= positions[k]:
        return None
    in_range = [j for j in points if positions[best] <= positions[j] < positions[k]]
    if any(j not in finite and j not in left_out for j in in_range):
        return None
    stretch = sorted((j for j in in_range if j in finite), key=lambda j: positions[j])
    if len(stretch) < 2:
        return None

    def rise(a: int, b: int) -> float:  # NaN (no error to judge by) fails both tests below: no decision
        with np.errstate(divide="ignore", invalid="ignore"):
            return (points[b].criterion - points[a].criterion) / np.hypot(points[a].mcse, points[b].mcse)

    rising = all(rise(a, b) > -BREAKDOWN_Z for a, b in zip(stretch, stretch[1:]))
    return best if rising and rise(best, stretch[-1]) > BREAKDOWN_Z else None


def _breaks_down(own: Evaluation, fitted: GridPoint, reweighted: GridPoint) -> bool:
    """Whether a fit of its own finds what its reweighted value did not see: a criterion
    worse by more than :data:`BREAKDOWN_Z` combined standard errors, or chains that disagree
    (R-hat of the criterion above :data:`MODES_RHAT`: the posterior has several modes there)."""
    import arviz

    worse = fitted.criterion - reweighted.criterion > BREAKDOWN_Z * np.hypot(fitted.mcse, reweighted.mcse)
    return bool(worse or float(arviz.rhat(np.asarray(own.criterion, dtype=float))) > MODES_RHAT)


def _finite_or_inf(value: float) -> float:
    """NaN (a value not evaluated) as +inf, so that it is never the best."""
    return np.inf if np.isnan(value) else value


def fitted_points(grid: list[Divergence], evaluations: list[Evaluation]) -> list[GridPoint]:
    """Each grid value's criterion from its own fit (``fits="full"``)."""
    return [GridPoint(divergence, *direct_estimate(evaluation.criterion), "fit")
            for divergence, evaluation in zip(grid, evaluations)]


def default_grid(kind: str = "beta") -> list[Divergence]:
    """KL and beta (or gamma) = 0.05, 0.10, ..., 1.00: 21 values."""
    make = BetaD if kind == "beta" else GammaD
    return [KL()] + [make(round(0.05 * j, 2)) for j in range(1, 21)]


def iterated_warwick_jones(grid: list[Divergence], found: list[MinimumLoss], pilot: int,
                           max_rounds: int = 20) -> tuple[list[GridPoint], list[int]]:
    """Each grid value's estimated MSE against the final pilot, and the pilots tried (module
    docstring): start from ``pilot``, move it to the minimiser, stop when it stays (or would
    return to a pilot already tried, then at the smaller MSE of the two)."""
    history = [pilot]

    def mse_against(k: int) -> np.ndarray:
        centre = found[k].theta_hat
        return np.array([np.trace(f.covariance) + float(np.sum((f.theta_hat - centre) ** 2)) for f in found])

    mse = mse_against(pilot)
    for _ in range(max_rounds):
        best = int(np.argmin(mse))
        if best == history[-1] or best in history:
            break
        history.append(best)
        mse = mse_against(best)
    final = history[-1]
    points = [GridPoint(d, float(mse[k]), float("nan"), f"minimum-loss estimate; bias against {grid[final]!r}",
                        estimate=found[k].theta_hat) for k, d in enumerate(grid)]
    return points, history
