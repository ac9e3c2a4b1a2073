"""Fits of Rob-ULA: its draws, the final metric and the unconstrained chains."""

from __future__ import annotations

import numpy as np

from .mcmc import Fit


class RobULAFit(Fit):
    """Draws from Rob-ULA, with the same methods as a NUTS fit.

    ``sample_stats`` holds per draw ``lp`` (log density, unless left out), ``step_size`` and
    ``kept_fraction`` (rows the robust estimator kept at that step).

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fits.mcmc.Fit` arguments ``model, raw, prepared, settings``.
    inverse_metric : numpy.ndarray
        The final M = L L^T, d x d.
    unconstrained_draws : numpy.ndarray
        The draws of theta, (chains, draws, d).
    **kwargs
        Passed to :class:`~robust_stan.results.fits.mcmc.Fit` likewise.
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
        The :class:`~robust_stan.results.fits.mcmc.Fit` arguments ``model, raw, prepared, settings``
        (``prepared`` holds one row).
    inverse_metric : numpy.ndarray
        As for :class:`RobULAFit`.
    unconstrained_draws : numpy.ndarray
        As for :class:`RobULAFit`.
    **kwargs
        Passed to :class:`~robust_stan.results.fits.mcmc.Fit` likewise.
    """

    rows_here = False
