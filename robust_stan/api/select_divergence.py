"""rs.select_divergence: beta (or gamma) chosen from the data by the H-score, in a few NUTS fits."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

import numpy as np

from ..building.divergences import KL, BetaD, Divergence, DivergenceCode, GammaD, refuse_original_gamma
from ..common.cluster import Cluster, run_tasks
from ..common.errors import RobustStanInputError
from ..gradients.oracles import unconstrained_draws
from ..methods.mode_census import GridModes, ModeCensus
from ..methods.selection.calibration import minimum_loss
from ..methods.selection.divergence import (
    Evaluation,
    default_grid,
    fitted_points,
    grid_value,
    hscore_per_draw,
    iterated_warwick_jones,
    walk_grid,
)
from ..results.selection import Selection
from .any_model import AnyModel, require_model
from .mode_starts import GRID_CENSUS_STARTS, dispersed_starts, starts_in_largest_mode

CRITERIA = ("hscore", "mse")
FITS = ("reweight", "full")
#: Draws per chain unconstrained to place a fit's chains among the census's modes.
LOCATION_DRAWS = 100


def select_divergence(model: AnyModel, data: Mapping, grid=None, criterion: str = "hscore", fits: str = "reweight",
                      learning_rate: float = 1.0, pilot=None, confirm: bool = True, cluster: Cluster | None = None,
                      chains: int = 4, iter_warmup: int = 1000, iter_sampling: int = 1000, thin: int = 1,
                      seed: int | None = None, adapt_delta: float = 0.8, max_treedepth: int = 10,
                      show_progress: bool = False) -> Selection:
    """Choose the divergence (beta, or gamma) that minimises a criterion over a grid.

    Near a beta's breakdown point the generalized posterior has a second mode that follows the
    outliers, where NUTS chains from dispersed starts can settle; so the H-score first takes a
    census of each grid value's modes (L-BFGS from dispersed starts and from the neighbouring
    values' modes, each mode weighed by its Laplace approximation), and every NUTS fit here
    starts each chain in its value's largest mode. A value whose mass no single mode holds
    (none has 99%) is left out (NaN, the shares in ``source``). No grid value needs a new
    compile.

    Parameters
    ----------
    model : Model or StanProgramModel
        A built-in model, or a program from :func:`robust_stan.robustify` with one outcome
        (``criterion="mse"``; the H-score's y-derivatives are the built-in families').
    data : mapping
        The model's data.
    grid : sequence or None, default None
        Divergences (``rs.KL()``, ``rs.BetaD(b)``, or decomposable ``rs.GammaD(g)``; one kind
        besides KL) or positive numbers (beta values); None is KL and beta = 0.05, ..., 1.00.
    criterion : {"hscore", "mse"}, default "hscore"
        "hscore": the Hyvarinen score of the pseudo-model exp(-w l(y; theta)) in y, summed over
        the rows and averaged over the posterior draws (Yonekura and Sugasawa 2023; Jewson and
        Rossell 2022), with the y-derivatives in closed form; it needs a continuous outcome on
        the whole real line (normal and student_t models), on the outcome's own scale. "mse"
        (every family): the estimated mean squared error of the minimum-loss estimate, sandwich
        variance plus squared bias against a pilot estimate (Warwick and Jones 2005), the pilot
        moved to the minimiser until it stays (Basak, Basu and Ghosh 2021); it runs no NUTS fit,
        and :attr:`Selection.fit` samples the choice.
    fits : {"reweight", "full"}, default "reweight"
        H-score only. "reweight": one NUTS fit at ``pilot``, every other value from the draws of
        the nearest fit in the mode that holds its mass, by Pareto-smoothed importance sampling,
        with a new fit where there is none or k-hat exceeds 0.7; values above a stretch whose
        criterion rises from the best by more than 3 standard errors are left out (NaN). "full":
        an independent fit at every grid value (for checking).
    learning_rate : float, default 1.0
        Weight ``w`` on the data term.
    pilot : Divergence, float or None, default None
        The first fit's value ("reweight") or the MSE's starting pilot; None is the middle grid
        value (beta = 0.5 for "mse").
    confirm : bool, default True
        With "reweight": fit the best value if it was reweighted, and let that fit's own
        criterion replace the reweighted one, until the best value stands on its own fit (a
        breakdown the census missed sends the search back to the values in doubt).
    cluster : Cluster or None, default None
        With ``fits="full"``: run the fits side by side on its workers (same results as here).
    chains, iter_warmup, iter_sampling, thin, adapt_delta, max_treedepth : int or float
        Every NUTS fit's settings, as in :meth:`Model.sample` (CmdStanPy's names and defaults).
    seed : int or None, default None
        Seeds the census's starts and every NUTS fit; None draws fresh ones (not repeatable).
    show_progress : bool, default False
        Show the NUTS fits' progress bars.

    Returns
    -------
    Selection
        The criterion per grid value, the choice and its fit.

    Raises
    ------
    RobustStanInputError
        If the grid, the criterion (H-score on an outcome it does not support) or an option is
        invalid.
    """
    require_model(model, "rs.select_divergence")
    if criterion not in CRITERIA:
        raise RobustStanInputError(f"criterion: must be one of {list(CRITERIA)}, got {criterion!r}")
    if fits not in FITS:
        raise RobustStanInputError(f"fits: must be one of {list(FITS)}, got {fits!r}")
    if not isinstance(confirm, bool):
        raise RobustStanInputError(f"confirm: must be True or False, got {confirm!r}")
    refusal = model.hscore_refusal() if criterion == "hscore" else None
    if refusal is not None:
        raise RobustStanInputError(f"criterion: 'hscore' needs a continuous outcome on the whole real line "
                                   f"(normal, student_t) of a built-in model; {refusal}; criterion='mse' works for "
                                   "every model")
    sample_options: dict[str, Any] = dict(chains=chains, iter_warmup=iter_warmup, iter_sampling=iter_sampling,
                                          thin=thin, seed=seed, adapt_delta=adapt_delta,
                                          max_treedepth=max_treedepth, show_progress=show_progress)
    divergences = _grid(grid)
    pilot_index = _pilot(pilot, divergences)

    positions = np.array([grid_value(d) for d in divergences])
    modes = _grid_modes(model, data, divergences, learning_rate, seed) \
        if criterion == "hscore" else None

    def census_of(divergence: Divergence) -> ModeCensus | None:
        return None if modes is None else modes.censuses[int(np.argmin(np.abs(positions - grid_value(divergence))))]

    def inits_at(divergence: Divergence):
        return _starts(model, data, divergence, learning_rate, census_of(divergence), sample_options)

    def fit_at(divergence: Divergence, nearest):
        inits = _warm_start(nearest) if nearest is not None else inits_at(divergence)
        return _fit(divergence, inits, model, data, learning_rate, sample_options)

    def evaluate(fit, divergence: Divergence) -> Evaluation:
        return _hscore(fit, divergence, learning_rate)

    if criterion == "mse":
        found, start = [], None
        for divergence in divergences:  # in increasing order, each minimum started from the last
            target = model.langevin_target(model.stan_data(data, divergence, 1.0))
            found.append(minimum_loss(target.posterior, target.prior, target.per_example,
                                      start if start is not None else np.zeros(target.per_example.dimension)))
            start = found[-1].theta_hat
        default_pilot = int(np.argmin(np.abs(positions - 0.5))) if pilot is None else pilot_index
        points, _ = iterated_warwick_jones(divergences, found, default_pilot)
        return Selection(criterion, points, {}, lambda divergence: fit_at(divergence, None))
    if fits == "full":
        task = partial(_fit_and_hscore, model=model, data=data, learning_rate=learning_rate,
                       sample_options=sample_options)
        # the starts are computed here, where the census is: a worker builds no gradient model
        done = run_tasks(task, [(d, inits_at(d)) for d in divergences], cluster, "grid fits",
                         [model.compile()] if cluster else ())
        points = fitted_points(divergences, [evaluation for _, evaluation in done])
        fitted = {k: fit for k, (fit, _) in enumerate(done)}
    else:
        points, fitted = walk_grid(divergences, pilot_index, fit_at, evaluate, confirm=confirm, modes=modes)

    def fit_chosen(divergence: Divergence):  # a fit of its own, started in the value's dominant mode
        return fit_at(divergence, None)

    return Selection(criterion, points, {divergences[k]: fit for k, fit in fitted.items()}, fit_chosen)


def _fit(divergence: Divergence, inits, model: AnyModel, data: Mapping, learning_rate: float, sample_options: dict):
    """A NUTS fit at ``divergence`` from ``inits`` (None: the engine's dispersed starts)."""
    return model.sample(data, divergence=divergence, learning_rate=learning_rate, inits=inits, **sample_options)


def _warm_start(fit) -> dict:
    """Starts at the one draw of ``fit`` nearest its posterior means, each parameter's entries
    measured in their posterior sds (one dict for every chain; only the parameters: a formula model's
    posterior also holds quantities derived from them, its group effects). A draw and not the means,
    because a mean need not satisfy the parameter's constraint: the mean of unit vectors is not a unit
    vector, nor that of Cholesky factors of correlation matrices such a factor."""
    draws = {name: np.asarray(fit.posterior[name], dtype=float) for name in fit.parameter_names}
    chains, iterations = next(iter(draws.values())).shape[:2]
    distance = np.zeros((chains, iterations))
    for values in draws.values():
        entries = values.reshape(chains, iterations, -1)
        spread = entries.std(axis=(0, 1))
        spread[spread == 0] = 1.0
        distance += np.sum(((entries - entries.mean(axis=(0, 1))) / spread) ** 2, axis=2)
    chain, iteration = np.unravel_index(np.argmin(distance), distance.shape)
    return {name: values[chain, iteration] for name, values in draws.items()}


def _starts(model: AnyModel, data: Mapping, divergence: Divergence, learning_rate: float, census: ModeCensus | None,
            sample_options: dict) -> list[dict] | None:
    """Each chain's start, a draw of the Laplace approximation at the largest mode of ``census``
    (None, for the engine's dispersed starts, when there is no census or it found no mode)."""
    if census is None or not census.modes:
        return None
    return starts_in_largest_mode(model, model.prepare(data, divergence, learning_rate), census,
                                  sample_options.get("chains", 4), sample_options.get("seed"))


def _grid_modes(model: AnyModel, data: Mapping, divergences: list[Divergence], learning_rate: float,
                seed: int | None) -> GridModes:
    """The modes of each grid value's generalized posterior and their shares of its mass
    (:class:`robust_stan.methods.mode_census.GridModes`), from
    :data:`~robust_stan.api.mode_starts.GRID_CENSUS_STARTS` dispersed starts."""
    oracles = [model.oracle_for(model.switched(model.stan_data(data, d, learning_rate), pointwise=False))
               for d in divergences]
    starts = dispersed_starts(oracles[0].dimension, seed, GRID_CENSUS_STARTS)
    return GridModes([oracle.log_density_gradient for oracle in oracles], starts, partial(_chain_locations, model))


def _chain_locations(model: AnyModel, fit) -> list[np.ndarray]:
    """Each chain's mean on the unconstrained scale, from :data:`LOCATION_DRAWS` of its draws."""
    names = model.raw_parameter_names
    draws = fit.raw.variables[names[0]].shape[1]
    stride = max(1, draws // LOCATION_DRAWS)
    some = {name: fit.raw.variables[name][:, ::stride] for name in names}
    oracle = model.oracle_for(model.switched(fit.stan_data, pointwise=False))
    return list(unconstrained_draws(oracle, some, names).mean(axis=1))


def _hscore(fit, divergence: Divergence, learning_rate: float) -> Evaluation:
    """The H-score per draw of ``fit``'s draws at ``divergence``, and their total losses there."""
    computed = fit.generated_quantities_at(divergence, y_score=True)
    per_draw = hscore_per_draw(computed["log_lik"], computed["robust_loss"], computed["y_score"], divergence,
                               learning_rate)
    # on the outcome's own scale: each y-derivative of the standardised outcome divides by its scale (1 where
    # the model does not standardise)
    scale = fit.scaling.scale
    return Evaluation(learning_rate * computed["robust_loss"].sum(axis=-1), per_draw / scale**2)


def _fit_and_hscore(task: tuple[Divergence, list[dict] | None], model: AnyModel, data: Mapping, learning_rate: float,
                    sample_options: dict) -> tuple:
    """One task of ``fits="full"`` (run here or on a worker): the fit of its own from the given starts
    (in its value's largest mode) and its H-score."""
    divergence, inits = task
    fit = _fit(divergence, inits, model, data, learning_rate, sample_options)
    return fit, _hscore(fit, divergence, learning_rate)


def _grid(grid) -> list[Divergence]:
    """The grid as divergences in increasing order of their parameter (KL first)."""
    if grid is None:
        return default_grid()
    values = list(grid) if not isinstance(grid, (str, bytes)) and np.ndim(grid) == 1 else None
    if not values:
        raise RobustStanInputError(f"grid: give a non-empty list of divergences or positive beta values, got {grid!r}")
    out = []
    for value in values:
        if isinstance(value, Divergence):
            refuse_original_gamma(value, "grid", "it has no H-score per row",
                                  "use rs.GammaD(gamma) (decomposable) or rs.BetaD")
            out.append(value)
        elif isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) \
                and np.isfinite(value) and value > 0:
            out.append(BetaD(float(value)))
        else:
            raise RobustStanInputError(f"grid: every value must be a divergence or a positive number, got {value!r}")
    kinds = {type(d) for d in out} - {KL}
    if len(kinds) > 1:
        raise RobustStanInputError("grid: mixes beta and gamma divergences; choose one kind (KL may join either)")
    if kinds == {GammaD} and not all(d.code == DivergenceCode.GAMMA for d in out if isinstance(d, GammaD)):
        raise RobustStanInputError("grid: gamma divergences must be the decomposable form")
    out.sort(key=grid_value)
    if len({grid_value(d) for d in out}) != len(out):
        raise RobustStanInputError(f"grid: repeats a value: {[repr(d) for d in out]}")
    return out


def _pilot(pilot, divergences: list[Divergence]) -> int:
    """The grid index of ``pilot`` (a divergence or a number of the grid; default the middle value)."""
    if pilot is None:
        return len(divergences) // 2
    position = grid_value(pilot) if isinstance(pilot, Divergence) else pilot
    matches = [k for k, d in enumerate(divergences) if np.isclose(grid_value(d), position, rtol=0, atol=1e-12)]
    if not matches:
        raise RobustStanInputError(f"pilot: must be a value of the grid, got {pilot!r}")
    return matches[0]
