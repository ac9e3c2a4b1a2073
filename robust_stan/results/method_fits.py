"""Fit objects of the methods other than NUTS: the same draws(), summary() and to_arviz(),
plus what each method knows about its own run."""

from __future__ import annotations

import numpy as np

from ..common.errors import RobustStanInputError
from ..methods.variational.robust_vi import GaussianQ
from .arviz_output import pareto_khat
from .fit import Fit


class VariationalFit(Fit):
    """Draws from a fitted variational q, with the same methods as a NUTS fit.

    sample_stats hold ``lp`` (log pi) and ``log_q`` of each draw, whose difference gives
    importance weights (see :meth:`diagnostics`); the ELBO trace is also in the group
    ``variational_elbo``.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fit.Fit` arguments ``model, raw, prepared, settings``.
    q : GaussianQ
        The Gaussian on the unconstrained scale.
    elbo : float
        The final ELBO estimate from the output draws.
    elbo_se : float
        Its Monte Carlo error.
    elbo_trace : pandas.DataFrame
        (iteration, ELBO estimate) during the fit.
    **kwargs
        Passed to :class:`~robust_stan.results.fit.Fit` likewise.
    """

    method = "variational"

    def __init__(self, *args, q: GaussianQ, elbo: float, elbo_se: float, elbo_trace, **kwargs):
        super().__init__(*args, **kwargs)
        self.q, self.elbo, self.elbo_se, self.elbo_trace = q, elbo, elbo_se, elbo_trace

    def diagnostics(self) -> dict:
        """The final ELBO, its Monte Carlo error, convergence, and the Pareto k-hat of pi/q.

        Above 0.7 the k-hat says q is a poor stand-in for pi (Yao, Vehtari, Simpson and Gelman 2018,
        arXiv:1802.02538).

        Returns
        -------
        dict
            The diagnostics by name.
        """
        log_ratio = (self.raw.sampler["lp__"] - self.raw.sampler["log_q"]).ravel()
        khat = pareto_khat(log_ratio[np.isfinite(log_ratio)])
        return {"elbo": self.elbo, "elbo_se": self.elbo_se, "converged": self.settings.converged,
                "iterations": self.settings.iterations_run, "pareto_k": float(khat)}

    def _arviz_groups(self) -> dict:
        import xarray as xr

        groups = super()._arviz_groups()
        groups["variational_elbo"] = xr.Dataset({"elbo": ("iteration", np.asarray(self.elbo_trace["elbo"]))},
                                                coords={"iteration": np.asarray(self.elbo_trace["iteration"])})
        return groups

    def __repr__(self) -> str:
        s = self.settings
        return (f"<robust_stan.VariationalFit {self.divergence!r}, {s.family}, ELBO {self.elbo:.4g} "
                f"+/- {self.elbo_se:.2g}, {s.draws} draws, parameters {self.parameter_names}>")


class RobULAFit(Fit):
    """Draws from Rob-ULA, with the same methods as a NUTS fit.

    ``sample_stats`` holds per draw ``lp`` (log density, unless left out), ``step_size`` and
    ``kept_fraction`` (rows the robust estimator kept at that step).

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fit.Fit` arguments ``model, raw, prepared, settings``.
    inverse_metric : numpy.ndarray
        The final M = L L^T, d x d.
    unconstrained_draws : numpy.ndarray
        The draws of theta, (chains, draws, d).
    **kwargs
        Passed to :class:`~robust_stan.results.fit.Fit` likewise.
    """

    method = "rob_ula"

    def __init__(self, *args, inverse_metric: np.ndarray, unconstrained_draws: np.ndarray, **kwargs):
        super().__init__(*args, **kwargs)
        self.inverse_metric, self.unconstrained_draws = inverse_metric, unconstrained_draws

    def diagnostics(self) -> dict:
        """Chains that diverged, the mean kept fraction and the largest R-hat.

        Returns
        -------
        dict
            The diagnostics by name.
        """
        return {
            "diverged_chains": int(sum(not np.all(np.isfinite(chain)) for chain in next(iter(self.posterior.values())))),
            "mean_kept_fraction": float(np.nanmean(self.raw.sampler["kept_fraction"])),
            "max_r_hat": float(self.summary()["r_hat"].max()),
        }

    def __repr__(self) -> str:
        s = self.settings
        return (f"<robust_stan.RobULAFit {self.divergence!r}, estimator {s.estimator!r}, "
                f"contamination {s.contamination:g}, {s.chains} chains x {s.iter_sampling // s.thin} draws, "
                f"parameters {self.parameter_names}>")


class PartitionedRobULAFit(RobULAFit):
    """A Rob-ULA fit whose rows were held in partitions on a cluster: its draws, summary and the
    posterior and sample_stats groups of ArviZ; the per-observation quantities (log_lik,
    robust_loss, y_rep, outlier scores) would need every row here, so they are refused.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fit.Fit` arguments ``model, raw, prepared, settings``
        (``prepared`` holds one row).
    inverse_metric : numpy.ndarray
        As for :class:`RobULAFit`.
    unconstrained_draws : numpy.ndarray
        As for :class:`RobULAFit`.
    **kwargs
        Passed to :class:`~robust_stan.results.fit.Fit` likewise.
    """

    rows_here = False


class PartitionedVariationalFit(VariationalFit):
    """A robust variational fit whose rows were held in partitions on a cluster: as
    :class:`PartitionedRobULAFit`, draws and summaries but no per-observation quantities.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fit.Fit` arguments ``model, raw, prepared, settings``.
    q : GaussianQ
        As for :class:`VariationalFit`.
    elbo : float
        As for :class:`VariationalFit`.
    elbo_se : float
        As for :class:`VariationalFit`.
    elbo_trace : pandas.DataFrame
        As for :class:`VariationalFit`.
    **kwargs
        Passed to :class:`~robust_stan.results.fit.Fit` likewise.
    """

    rows_here = False


class StanMethodFit(Fit):
    """Draws from Stan's ADVI, Pathfinder or Laplace approximation, as a robust-stan fit.

    sample_stats hold CmdStan's own per-draw columns (``lp__``, ``log_p__``,
    ``log_g__``, ...); ``raw.backend`` is CmdStanPy's result object.

    Parameters
    ----------
    model : Model or StanProgramModel
        The model that was run.
    raw : RawDraws
        The engine-neutral output.
    prepared : PreparedData
        The data and settings the run used.
    settings : StanMethodSettings
        The run's settings (``settings.method`` names the algorithm).
    """

    @property
    def method(self) -> str:  # type: ignore[override]  # read from the settings, unlike Fit's class attribute
        """The algorithm: "advi", "pathfinder" or "laplace" (str)."""
        return self.settings.method

    def diagnostics(self) -> dict:
        """The algorithm and the number of draws.

        Returns
        -------
        dict
            The diagnostics by name.
        """
        return {"method": self.settings.method, "draws": self.settings.draws}

    def __repr__(self) -> str:
        return (f"<robust_stan.StanMethodFit {self.settings.method}, {self.divergence!r}, "
                f"{self.settings.draws} draws, parameters {self.parameter_names}>")


class CalibratedFit(Fit):
    """A fit from :func:`robust_stan.calibrate`, with the same methods as a NUTS fit.

    :meth:`to_arviz` records the method and w in its attributes.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fit.Fit` arguments ``model, raw, prepared, settings``.
    calibration : {"lhw", "bootstrap", "sandwich"}
        "lhw" or "bootstrap": NUTS at the calibrated learning rate ``w``; "sandwich": the
        original draws mapped so their covariance is ``sandwich_covariance``.
    w : float
        The calibrated learning rate (the original one for "sandwich").
    curvature : numpy.ndarray
        J, the sandwich's curvature matrix on the unconstrained scale.
    information : numpy.ndarray
        I, the sandwich's information matrix on the unconstrained scale.
    sandwich_covariance : numpy.ndarray
        J^-1 I J^-1.
    bootstrap_trace : list of dict or None, default None
        "bootstrap": the coverage at each w tried.
    **kwargs
        Passed to :class:`~robust_stan.results.fit.Fit` likewise.
    """

    def __init__(self, *args, calibration: str, w: float, curvature: np.ndarray, information: np.ndarray,
                 sandwich_covariance: np.ndarray, bootstrap_trace: list[dict] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.calibration, self.w, self.bootstrap_trace = calibration, float(w), bootstrap_trace
        self.curvature, self.information, self.sandwich_covariance = curvature, information, sandwich_covariance

    def loo(self, outcome: str | None = None):
        """As :meth:`Fit.loo`, for the NUTS draws at the calibrated w ("lhw", "bootstrap").

        Parameters
        ----------
        outcome : str or None, default None
            As for :meth:`Fit.loo`.

        Returns
        -------
        arviz.ELPDData or arviz_stats.ELPDDataLOO
            The installed ArviZ's ELPD result.

        Raises
        ------
        RobustStanInputError
            For the sandwich calibration, whose draws are the original draws moved, not draws of a
            posterior.
        """
        if self.calibration == "sandwich":
            raise RobustStanInputError("fit: the sandwich calibration moves the original draws to the sandwich "
                                       "covariance; they are not draws of a posterior that leaving a row out "
                                       "reweights, so loo is not available (calibrate by 'lhw' or 'bootstrap')")
        return super().loo(outcome)

    def _arviz_groups(self) -> dict:
        groups = super()._arviz_groups()
        for group in groups.values():
            group.attrs.update(calibration=self.calibration, calibrated_w=self.w)
        return groups

    def __repr__(self) -> str:
        return f"<robust_stan.CalibratedFit ({self.calibration}, w = {self.w:.4g}) {self.divergence!r}>"
