"""Fits from rs.calibrate: NUTS at the calibrated learning rate, or the sandwich-adjusted draws."""

from __future__ import annotations

import numpy as np

from ...common.errors import RobustStanInputError
from .mcmc import Fit


class CalibratedFit(Fit):
    """A fit from :func:`robust_stan.calibrate`, with the same methods as a NUTS fit.

    :meth:`to_arviz` records the method and w in its attributes.

    Parameters
    ----------
    *args
        The :class:`~robust_stan.results.fits.mcmc.Fit` arguments ``model, raw, prepared, settings``.
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
        Passed to :class:`~robust_stan.results.fits.mcmc.Fit` likewise.
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
