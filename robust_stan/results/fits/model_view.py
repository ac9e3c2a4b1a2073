"""What a fit reads of the model that produced it: the same calls on a built-in model and on your own
program, so that one fit class per method serves both."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ...building.data import PreparedData
from ...building.divergences import Divergence
from ...engines import RawDraws


@dataclass(frozen=True)
class Outcome:
    """One observed outcome of a fitted model, named as its fit and ArviZ groups name it.

    Parameters
    ----------
    name : str
        The variable's name in log_likelihood, observed_data, posterior_predictive and
        robust_loss, and in :meth:`robust_stan.Fit.draws` (``"log_lik_<name>"``).
    values : numpy.ndarray or None
        The observed values, in the outcome's own units; None for an outcome a program computes in
        its transformed data (robust-stan does not run them), which observed_data then leaves out.
    dims : list of str
        Names of the axes of ``values``; the first is the row (observation) axis.
    weights : numpy.ndarray or None, default None
        The rows' weights on a robust loss; None for a likelihood fitted as written.
    weights_name : str, default "weights"
        The weights' name in the constant_data group.
    """

    name: str
    values: np.ndarray | None
    dims: list[str]
    weights: np.ndarray | None = None
    weights_name: str = "weights"


class FittedModel(Protocol):
    """What a fit asks of the model that produced it, whether built in (:class:`robust_stan.Model`)
    or the user's own program (:class:`robust_stan.StanProgramModel`)."""

    @property
    def parameter_names(self) -> list[str]:
        """The model's parameters."""

    @property
    def engine(self) -> str:
        """The engine's name."""

    def posterior_draws(self, raw: RawDraws, prepared: PreparedData) -> dict[str, np.ndarray]:
        """The posterior group's variables by name (chains, draws, ...), in the user's units."""

    def posterior_dims(self, posterior: dict[str, np.ndarray]) -> dict[str, list[str]]:
        """Names of the non-sample axes of the posterior variables that are not ArviZ's defaults."""

    def posterior_coords(self, prepared: PreparedData) -> dict[str, list[str]]:
        """Names along the posterior's named dims (column and level names), by dim."""

    def summary_labels(self, posterior: dict[str, np.ndarray], prepared: PreparedData) -> dict[str, list]:
        """The variables of a summary, in order, each with a label per element (None: left out)."""

    def predictions(self, posterior: dict[str, np.ndarray], prepared: PreparedData, new_data, kind: str,
                    new_levels: str, seed: int | None):
        """A glm's :class:`~robust_stan.results.predictions.Predictions` for new rows; other models refuse."""

    def observed_outcomes(self, prepared: PreparedData) -> list[Outcome]:
        """The observed outcomes, with their values, axis names and weights."""

    def pointwise_draws(self, raw: RawDraws, prepared: PreparedData, seed: int) -> dict[str, dict[str, np.ndarray]]:
        """``{"log_lik": {name: (chains, draws, n)}, "robust_loss": {...}, "y_rep": {...}}`` in the
        user's units; an outcome without a quantity is left out of that kind."""

    def generated_quantities(self, raw: RawDraws, prepared: PreparedData, seed: int,
                             divergence: Divergence | None = None, y_score: bool = False) -> dict:
        """``log_lik``, ``robust_loss`` (and ``y_score``) of the one robust outcome at every draw,
        on the fitted program's own scale, computed afresh."""
