"""Leave-one-out cross-validation (PSIS-LOO) of a generalized posterior, as ArviZ's own ELPD result.

A generalized posterior is pi(theta) propto prior(theta) * exp(-w * sum_i v_i * l_i(theta)).
Leaving row i out multiplies it by exp(w * v_i * l_i(theta)), so PSIS-LOO's log importance
ratios are ``w * v_i * l_i(theta)``, while the quantity predicted stays the model's density
p(y_i | theta):

    elpd_i = log sum_s W_is p(y_i | theta_s),

W the Pareto-smoothed, normalised weights of the ratios. Under KL with w * v_i = 1
(l_i = -log p_i) this is ordinary PSIS-LOO, and ``arviz.loo`` on the ``log_likelihood``
group gives the same. For any other fit ``arviz.loo`` would use 1 / p(y_i | theta) as the
ratio and give a wrong number, so :func:`ordinary_loo_applies` tells the fit objects where
to put log p(y_i | theta) in their ArviZ output.

This module computes from stored draws and runs no inference (like the summaries of
:mod:`.fit`), and its output is an ArviZ object built through :mod:`.arviz_output`'s
two-line abstraction, so it belongs to the results layer.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np

from ..building.divergences import DivergenceCode, refuse_original_gamma
from ..common.errors import RobustStanInputError, RobustStanWarning
from .arviz_output import SAMPLE_DIMS, arviz_major, draws_dataset, native_inference_data

#: The group that holds log p(y_i | theta) of a fit for which ordinary PSIS-LOO is wrong.
MODEL_LOG_LIKELIHOOD = "model_log_likelihood"

#: Attribute of that group that says why it is not ArviZ's ``log_likelihood``.
MODEL_LOG_LIKELIHOOD_NOTE = (
    "log p(y_i | theta) of each row under the model. It is not in the log_likelihood group because "
    "this posterior is a generalized one (a robust divergence, a learning rate other than 1 or row "
    "weights other than 1): ArviZ's loo, waic, compare and loo_pit would weight the draws by "
    "1 / p(y_i | theta), which is not what leaving row i out does here. fit.loo() gives the "
    "leave-one-out elpd of this posterior as ArviZ's own ELPD object.")


def ordinary_loo_applies(divergence, learning_rate: float, weights: Sequence[np.ndarray]) -> bool:
    """Whether leaving row i out divides the posterior by p(y_i | theta), so that ordinary PSIS-LOO
    on log p(y_i | theta) is this posterior's LOO: KL with learning rate times every weight equal to 1.

    Parameters
    ----------
    divergence : Divergence or None
        The fit's divergence (None: a program fitted as written, whose likelihood is its own).
    learning_rate : float
        The fit's learning rate w.
    weights : sequence of arrays
        The row weights v (one array per outcome).
    """
    if divergence is not None and divergence.code != DivergenceCode.KL:
        return False
    return all(np.all(learning_rate * np.asarray(v, dtype=float) == 1.0) for v in weights)


def require_loo_draws(method: str, divergence) -> None:
    """Refuse, with the reason, a fit whose draws :func:`generalized_loo` cannot use: draws that are
    not NUTS draws of the posterior, or the original gamma form (its loss is not a sum over rows).

    Parameters
    ----------
    method : str
        The fit's method ("nuts", "variational", "rob_ula", ...).
    divergence : Divergence or None
        The fit's divergence.
    """
    if method != "nuts":
        raise RobustStanInputError(f"fit: loo needs NUTS draws of the posterior; this is a {method} fit, whose "
                                   "draws come from an approximation of it")
    if divergence is not None:
        refuse_original_gamma(divergence, "fit", "leaving one row out has no per-row importance ratio",
                              "use GammaD(gamma) (decomposable)")


def generalized_log_ratios(robust_loss: np.ndarray, weights: np.ndarray, learning_rate: float) -> np.ndarray:
    """PSIS-LOO's log importance ratios of a generalized posterior, w * v_i * l_i(theta) of every draw.

    Parameters
    ----------
    robust_loss : ndarray
        The per-row loss l_i(theta) of every draw, (chains, draws, n).
    weights : ndarray
        The row weights v_i, (n,).
    learning_rate : float
        The learning rate w.
    """
    return learning_rate * np.asarray(weights, dtype=float) * np.asarray(robust_loss, dtype=float)


def _arviz_stats():
    """The ``arviz_stats`` module, used on the ArviZ 1.x line only. ArviZ 1.x requires it, so it is
    not declared here (declaring it would pull ArviZ 1.x's stack into an ArviZ 0.x install); an
    installation that lacks it anyway gets an error saying what to install."""
    try:
        import arviz_stats
    except ImportError as error:
        raise ImportError("ArviZ 1.x is installed without arviz-stats, which it requires and robust-stan's "
                          "LOO uses: pip install arviz-stats") from error
    return arviz_stats


def relative_efficiency(posterior: Mapping[str, np.ndarray]) -> float:
    """ArviZ's relative efficiency of the draws for PSIS: the mean over every element of
    ``posterior`` of its ESS (method "mean") over the number of draws; 1 for one chain.

    Parameters
    ----------
    posterior : mapping
        name -> draws (chains, draws, ...), as in the fit's posterior group.
    """
    first = np.asarray(next(iter(posterior.values())))
    chains, draws = first.shape[:2]
    if chains == 1:
        return 1.0
    dataset = draws_dataset(posterior)
    if arviz_major() >= 1:
        _arviz_stats()  # registers the azstats accessor
        ess = dataset.azstats.ess(method="mean")
    else:
        import arviz

        ess = arviz.ess(dataset, method="mean")
    return float(np.hstack([ess[name].values.ravel() for name in ess.data_vars]).mean() / (chains * draws))


def smoothed_log_weights(log_ratios: np.ndarray, reff: float) -> tuple[np.ndarray, np.ndarray]:
    """ArviZ's PSIS of each row separately: normalised smoothed log weights (chains, draws, n) and
    Pareto k-hat (n,) of the log importance ratios (chains, draws, n), on either ArviZ line.

    Parameters
    ----------
    log_ratios : ndarray
        log importance ratios, (chains, draws, n).
    reff : float
        Relative efficiency of the draws (:func:`relative_efficiency`).
    """
    ratios = np.asarray(log_ratios, dtype=float)
    chains, draws, rows = ratios.shape
    if arviz_major() >= 1:
        import xarray as xr

        _arviz_stats()  # registers the azstats accessor

        # arviz_stats smooths exp(-input), the convention of log-likelihood input: hand it minus the ratios
        log_weights, khat = xr.DataArray(-ratios, dims=(*SAMPLE_DIMS, "row")).azstats.psislw(
            r_eff=reff, dim=list(SAMPLE_DIMS))
        log_weights = log_weights.transpose(*SAMPLE_DIMS, "row")
    else:
        import arviz

        # ArviZ 0.x takes (rows, samples), the samples in chain-major order as arviz.loo stacks them
        log_weights, khat = arviz.psislw(ratios.reshape(chains * draws, rows).T.copy(), reff)
        log_weights = np.asarray(log_weights).T.reshape(chains, draws, rows)
    return np.asarray(log_weights, dtype=float), np.asarray(khat, dtype=float)


def generalized_loo(log_lik: np.ndarray, log_ratios: np.ndarray, posterior: Mapping[str, np.ndarray],
                    var_name: str = "y", obs_dims: Sequence[str] | None = None):
    """PSIS-LOO with the importance ratios ``exp(log_ratios)`` and the predictive density
    ``exp(log_lik)``, as the installed ArviZ's own ELPD result with the pointwise values and
    Pareto k (``arviz.ELPDData`` on ArviZ 0.x, ``arviz_stats``' ``ELPDDataLOO`` on 1.x), which
    ``arviz.compare`` takes. Warns when a row's k-hat is above ArviZ's ``good_k``
    (min(1 - 1 / log10(S), 0.7) for S draws).

    Parameters
    ----------
    log_lik : ndarray
        log p(y_i | theta) of every draw, (chains, draws, *obs_shape).
    log_ratios : ndarray
        log importance ratios of leaving each row out, the same shape
        (:func:`generalized_log_ratios`).
    posterior : mapping
        name -> draws (chains, draws, ...): the posterior group, for the relative efficiency.
    var_name : str
        Name of the observed variable (as in the ``log_likelihood`` group).
    obs_dims : sequence of str, optional
        Names of the observation axes (default ``<var_name>_dim_<k>``).
    """
    log_lik = np.asarray(log_lik, dtype=float)
    log_ratios = np.asarray(log_ratios, dtype=float)
    if log_ratios.shape != log_lik.shape:
        raise ValueError(f"log_ratios: shape {log_ratios.shape} differs from log_lik's {log_lik.shape}")
    for name, values in (("log_lik", log_lik), ("log_ratios", log_ratios)):
        bad = np.flatnonzero(~np.all(np.isfinite(values.reshape(values.shape[:2] + (-1,))), axis=(0, 1)))
        if bad.size:
            raise RobustStanInputError(f"fit: {name} is not finite in every draw for rows {bad[:5].tolist()}"
                                       f"{' ...' if bad.size > 5 else ''} (0-based), so they have no LOO estimate")
    chains, draws = log_lik.shape[:2]
    obs_shape = log_lik.shape[2:]
    obs_dims = list(obs_dims) if obs_dims is not None else [f"{var_name}_dim_{k}" for k in range(len(obs_shape))]
    reff = relative_efficiency(posterior)
    flat_weights, flat_khat = smoothed_log_weights(log_ratios.reshape(chains, draws, -1), reff)
    log_weights, khat = flat_weights.reshape(log_lik.shape), flat_khat.reshape(obs_shape)
    n_samples = chains * draws
    good_k = min(1 - 1 / np.log10(n_samples), 0.7) if n_samples > 1 else 0.7
    if np.any(khat > good_k):
        rows = np.flatnonzero(khat.ravel() > good_k)
        warnings.warn(f"loo: Pareto k-hat above {good_k:.2f} for {rows.size} of {khat.size} rows "
                      f"({rows[:5].tolist()}{' ...' if rows.size > 5 else ''}, 0-based; largest "
                      f"{khat.max():.2f}): their importance-sampling estimate of the leave-one-out "
                      "predictive density is unreliable; refit without those rows for their elpd",
                      RobustStanWarning, stacklevel=3)
    if arviz_major() >= 1:
        return _arviz_stats_loo(log_lik, log_weights, khat, posterior, var_name, obs_dims, reff)
    return _arviz_0_elpd(log_lik, log_weights, khat, obs_dims, good_k)


def _arviz_stats_loo(log_lik, log_weights, khat, posterior, var_name, obs_dims, reff):
    """arviz_stats.loo itself, given the smoothed weights and k-hat (ArviZ 1.x)."""
    import xarray as xr

    arviz_stats = _arviz_stats()

    tree = native_inference_data({"posterior": draws_dataset(posterior),
                                  "log_likelihood": draws_dataset({var_name: log_lik}, {var_name: obs_dims})})
    weights = xr.DataArray(log_weights, dims=(*SAMPLE_DIMS, *obs_dims))
    pareto_k = xr.DataArray(khat, dims=tuple(obs_dims))
    with warnings.catch_warnings():  # generalized_loo has warned about k-hat, naming the rows
        warnings.filterwarnings("ignore", message="Estimated shape parameter of Pareto distribution")
        return arviz_stats.loo(tree, pointwise=True, var_name=var_name, reff=reff, log_weights=weights,
                               pareto_k=pareto_k)


def _arviz_0_elpd(log_lik, log_weights, khat, obs_dims, good_k):
    """arviz.ELPDData with the fields and pointwise arrays of ``arviz.loo(pointwise=True)`` (ArviZ 0.x,
    whose loo takes no precomputed weights), on the log scale."""
    import arviz
    import xarray as xr
    from scipy.special import logsumexp

    chains, draws = log_lik.shape[:2]
    n_samples = chains * draws
    coords = {dim: np.arange(size) for dim, size in zip(obs_dims, log_lik.shape[2:])}
    elpd_i = logsumexp(log_weights + log_lik, axis=(0, 1))
    lppd_i = logsumexp(log_lik, axis=(0, 1)) - np.log(n_samples)
    elpd = float(elpd_i.sum())
    return arviz.ELPDData(
        data=[elpd, float(np.sqrt(elpd_i.size * np.var(elpd_i))), float(lppd_i.sum()) - elpd, n_samples,
              int(elpd_i.size), bool(np.any(khat > good_k)),
              xr.DataArray(elpd_i, dims=obs_dims, coords=coords, name="loo_i"),
              xr.DataArray(khat, dims=obs_dims, coords=coords), "log", good_k],
        index=["elpd_loo", "se", "p_loo", "n_samples", "n_data_points", "warning", "loo_i", "pareto_k", "scale",
               "good_k"])
