"""Predictions of a fitted glm for new rows (:meth:`robust_stan.Fit.predict`): the draws, and
ArviZ's ``predictions`` and ``predictions_constant_data`` groups."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..common.errors import RobustStanInputError
from .arviz_output import draws_dataset, native_inference_data

#: The dim of the new rows in the ``predictions`` group (ArviZ's name for out-of-sample rows).
NEW_ROWS_DIM = "obs_new"


class Predictions:
    """Draws of the mean of y, or of y itself, for some rows at every posterior draw.

    Parameters
    ----------
    draws : numpy.ndarray
        (chains, draws, N): the mean (``kind="mean"``) or a draw of y (``kind="response"``); a
        categorical glm's means have a last axis of K class probabilities (dim ``class``), a
        multi_normal glm's means and draws one of D values (dim ``outcome_dim``).
    kind : {"mean", "response"}
        What the draws are.
    outcome : str
        The outcome's name (the formula's left-hand side, or ``"y"``).
    rows : pandas.Index
        The rows' labels (the new data's index).
    X : numpy.ndarray
        (N, P) the rows' population-level design, without the intercept.
    columns : tuple of str
        The design's column names.
    value_dim : str, default "outcome_dim"
        The name of a last axis of each row's values (``class`` for class probabilities).
    """

    def __init__(self, draws: np.ndarray, kind: str, outcome: str, rows: pd.Index, X: np.ndarray,
                 columns: tuple[str, ...], value_dim: str = "outcome_dim"):
        self.draws = draws
        self._value_dims = [value_dim] * (np.ndim(draws) - 3)
        self.kind = kind
        self.outcome = outcome
        self.rows = rows
        self.X = X
        self.columns = tuple(columns)

    @property
    def name(self) -> str:
        """The variable's name in the ``predictions`` group: the outcome's, ``<outcome>_mean`` for
        means (str)."""
        return self.outcome if self.kind == "response" else f"{self.outcome}_mean"

    def mean(self) -> pd.Series:
        """The average over draws of each row's predictions.

        Returns
        -------
        pandas.Series
            One value per row, indexed by the rows' labels.

        Raises
        ------
        RobustStanInputError
            If each row has several values (categorical means, multi_normal).
        """
        if np.ndim(self.draws) != 3:
            raise RobustStanInputError("predictions: each row has several values (a class's probabilities or an "
                                       "outcome's dimensions); average .draws over its first two axes instead")
        return pd.Series(self.draws.reshape(-1, self.draws.shape[-1]).mean(axis=0), index=self.rows, name=self.name)

    def to_arviz(self):
        """The predictions as the installed ArviZ's object, with the groups ``predictions`` (dims
        chain, draw, ``obs_new`` named by the rows' labels) and ``predictions_constant_data`` (the
        rows' design ``X``, dims ``obs_new`` and ``predictor``).

        Returns
        -------
        arviz.InferenceData or xarray.DataTree
            InferenceData on ArviZ 0.x, DataTree on 1.x.
        """
        coords = {NEW_ROWS_DIM: [str(label) for label in self.rows], "predictor": list(self.columns)}
        attrs = {"kind": self.kind, "inference_library": "robust-stan"}
        return native_inference_data({
            "predictions": draws_dataset({self.name: self.draws}, {self.name: [NEW_ROWS_DIM, *self._value_dims]}, attrs,
                                         coords=coords),
            "predictions_constant_data": draws_dataset({"X": self.X}, {"X": [NEW_ROWS_DIM, "predictor"]}, attrs,
                                                       sample_dims=(), coords=coords),
        })

    def __repr__(self) -> str:
        chains, draws, n = self.draws.shape[:3]  # categorical means and multi_normal have a value axis more
        return f"<robust_stan.Predictions {self.name!r} ({self.kind}), {chains} chains x {draws} draws, {n} rows>"
