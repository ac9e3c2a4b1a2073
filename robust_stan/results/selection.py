"""The result of rs.select_divergence: the criterion over the grid, the choice, and its fit."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from ..building.divergences import Divergence
from ..methods.selection.divergence import GridPoint, grid_value


class Selection:
    """A divergence chosen from a grid by a criterion (:func:`robust_stan.select_divergence`).

    ``divergence`` is the grid value with the smallest criterion; ``curve`` has one row per grid
    value: the divergence, its beta or gamma (``value``, 0 for KL), the criterion, its Monte
    Carlo standard error, where it came from (``source``: "fit", "reweighted from ...", "fit of
    its own (...)" for a value that ``confirm`` fitted after reweighting it, "not evaluated: ..."
    with NaN and the reason (several modes hold its mass; beyond a rise from the best value;
    below a breakdown that ``confirm`` found), or a value reweighted from such a breakdown's fit), and
    ``pareto_k``: the k-hat of the reweighting that gave the value, or that was tried and called
    for a fit (above 0.7; NaN for the pilot and with fits="full"); ``fits`` are the NUTS fits
    made, by divergence;
    :attr:`fit` is the fit at the chosen value (made on first use when the chosen value was
    reweighted rather than fitted, and always for ``"mse"``, which fits nothing); ``estimates``
    (``"mse"``) the minimum-loss estimate at each value; :meth:`plot` draws the curve with the choice marked.
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
        """The criterion against beta (or gamma) with +-2 Monte Carlo standard errors, fitted
        values filled and reweighted ones open, the choice marked; returns the axes."""
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
