"""Fits of robust-stan's variational inference: draws from the fitted q, with the ELBO and its
importance-sampling check."""

from __future__ import annotations

import numpy as np

from ...methods.variational.robust_vi import GaussianQ
from ..arviz_output import pareto_khat
from .mcmc import Fit


class VariationalFit(Fit):
    """Draws from a fitted variational q, with the same methods as a NUTS fit.

    sample_stats hold ``lp`` (log pi) and ``log_q`` of each draw, whose difference gives
    importance weights (see :meth:`diagnostics`); the ELBO trace is also in the group
    ``variational_elbo``.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fits.mcmc.Fit` arguments ``model, raw, prepared, settings``.
    q : GaussianQ
        The Gaussian on the unconstrained scale.
    elbo : float
        The final ELBO estimate from the output draws.
    elbo_se : float
        Its Monte Carlo error.
    elbo_trace : dict of numpy.ndarray
        The ELBO during the fit: ``"iteration"`` and ``"elbo"`` (its estimate there).
    **kwargs
        Passed to :class:`~robust_stan.results.fits.mcmc.Fit` likewise.
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


class PartitionedVariationalFit(VariationalFit):
    """A robust variational fit whose rows were held in partitions on a cluster: as
    :class:`PartitionedRobULAFit`, draws and summaries but no per-observation quantities.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fits.mcmc.Fit` arguments ``model, raw, prepared, settings``.
    q : GaussianQ
        As for :class:`VariationalFit`.
    elbo : float
        As for :class:`VariationalFit`.
    elbo_se : float
        As for :class:`VariationalFit`.
    elbo_trace : pandas.DataFrame
        As for :class:`VariationalFit`.
    **kwargs
        Passed to :class:`~robust_stan.results.fits.mcmc.Fit` likewise.
    """

    rows_here = False
