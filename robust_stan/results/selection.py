"""The result of rs.select_divergence: the criterion over the grid, the choice, and its fit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..building.divergences import Divergence
from ..methods.selection.divergence import GridPoint, grid_value


class Selection:
    """A divergence chosen from a grid by a criterion (:func:`robust_stan.select_divergence`).

    Parameters
    ----------
    criterion : {"hscore", "mse"}
        The criterion minimised.
    points : list of GridPoint
        Each grid value's criterion, its Monte Carlo standard error, source and k-hat.
    fits : dict
        The NUTS fits made, by divergence.
    fit_at : callable
        Fits a divergence, for :attr:`fit` when the choice was not fitted.

    Attributes
    ----------
    divergence : Divergence
        The grid value with the smallest criterion.
    curve : pandas.DataFrame
        One row per grid value: the divergence, its beta or gamma (``value``, 0 for KL), the
        criterion, its Monte Carlo standard error, ``source`` ("fit", "reweighted from ...",
        "fit of its own (...)" for a value ``confirm`` fitted, or "not evaluated: ..." with NaN
        and the reason) and ``pareto_k`` (the k-hat of the reweighting that gave the value, or
        that was tried and called for a fit; NaN for the pilot and with fits="full").
    fits : dict
        The NUTS fits made, by divergence.
    estimates : dict
        "mse": the minimum-loss estimate at each value.
    """

    def __init__(self, criterion: str, points: list[GridPoint], fits: dict[Divergence, object],
                 fit_at: Callable[[Divergence], object]):
        self.criterion = criterion
        self.curve = pd.DataFrame({
            "divergence": [repr(p.divergence) for p in points],
            "value": [grid_value(p.divergence) for p in points],
            "criterion": [p.criterion for p in points],
            "mcse": [p.mcse for p in points],
            "source": [p.source for p in points],
            "pareto_k": [p.pareto_k for p in points],
        })
        best = int(np.nanargmin(self.curve["criterion"].to_numpy()))
        self.divergence: Divergence = points[best].divergence
        self.fits = dict(fits)
        #: criterion "mse": each grid value's minimum-loss estimate on the unconstrained scale
        self.estimates = {p.divergence: p.estimate for p in points if p.estimate is not None}
        self._fit_at = fit_at

    def __repr__(self) -> str:
        return (f"<robust_stan.Selection by {self.criterion}: {self.divergence!r} of {len(self.curve)} grid values, "
                f"{len(self.fits)} NUTS fits>")

    @property
    def fit(self):
        """The NUTS fit at the chosen divergence (made now if it was not fitted: for the H-score, started in
        its largest mode)."""
        if self.divergence not in self.fits:
            self.fits[self.divergence] = self._fit_at(self.divergence)
        return self.fits[self.divergence]

    def plot(self, ax=None):
        """The criterion against beta (or gamma) with +-2 Monte Carlo standard errors.

        Fitted values are filled and reweighted ones open; the choice is marked.

        Parameters
        ----------
        ax : matplotlib.axes.Axes or None, default None
            Axes to draw on; None makes a new figure.

        Returns
        -------
        matplotlib.axes.Axes
            The axes drawn on.
        """
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(5, 3.5))
        curve = self.curve
        ax.errorbar(curve["value"], curve["criterion"], yerr=2 * curve["mcse"], color="C0", linestyle="-",
                    linewidth=1, capsize=2)
        fitted = curve["source"].str.startswith("fit")   # "fit", or "fit of its own (...)"
        ax.plot(curve["value"][fitted], curve["criterion"][fitted], "o", color="C0", label="NUTS fit")
        ax.plot(curve["value"][~fitted], curve["criterion"][~fitted], "o", color="C0", markerfacecolor="white",
                label="reweighted (PSIS)")
        chosen = grid_value(self.divergence)
        ax.axvline(chosen, color="C3", linestyle="--", label=f"chosen: {self.divergence!r}")
        ax.set_xlabel("divergence parameter (0: KL)")
        ax.set_ylabel(f"{self.criterion} (posterior mean)")
        ax.legend(fontsize=7)
        return ax
