"""A coreset: weights on a few rows (or groups) of the data, and the usual fits on those rows."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..building.data import PreparedData
from ..building.divergences import KL, Divergence
from ..common.errors import RobustStanInputError
from ..methods.variational.options import VariationalOptions
from .fits.mcmc import Fit


class Coreset:
    """The result of :func:`robust_stan.coreset`.

    :meth:`sample` and :meth:`variational` fit the coreset posterior with the same compiled
    program, the weights passed as data: a built-in model on the coreset rows only, your own
    program on all its rows with weight 0 off the coreset (its data cannot be cut to rows).

    Parameters
    ----------
    program : Model or StanProgramModel
        The model the coreset was built for.
    prepared : PreparedData
        The data (with rows in partitions: the fetched coreset rows only).
    method : str
        The construction (``rs.coreset``'s ``method``).
    unit_weights : numpy.ndarray
        The weights of the units chosen from (rows, or groups in the order of ``group_labels``).
    unit_rows : list of numpy.ndarray or None
        The rows of each group; None when the units are rows.
    trace : pandas.DataFrame
        One row per addition: size, chosen unit, seconds, the KL estimate, the exact KL where
        known.
    seconds : float
        Wall time of the construction.
    group_labels : array_like or None, default None
        The groups' labels, when the units are groups.
    path : list of tuple or None, default None
        (units, weights) after each addition, for :meth:`at_step`.
    local_rows : numpy.ndarray or None, default None
        With rows in partitions: the rows of the data held here.

    Attributes
    ----------
    weights : numpy.ndarray
        Each row's weight (N,), zero outside the coreset.
    indices : numpy.ndarray
        The rows with a positive weight.
    """

    def __init__(self, program, prepared: PreparedData, method: str, unit_weights: np.ndarray,
                 unit_rows: list[np.ndarray] | None, trace: pd.DataFrame, seconds: float, group_labels=None,
                 path: list[tuple[np.ndarray, np.ndarray]] | None = None, local_rows: np.ndarray | None = None):
        self.program = program
        self.prepared = prepared
        self.method = method
        self.divergence: Divergence = prepared.divergence
        self.unit_weights = np.asarray(unit_weights, dtype=float)
        self.group_labels = group_labels
        if unit_rows is None:  # every row is a unit
            self.weights = self.unit_weights.copy()
        else:
            self.weights = np.zeros(sum(rows.size for rows in unit_rows))
            for unit in np.flatnonzero(self.unit_weights):
                self.weights[unit_rows[unit]] = self.unit_weights[unit]
        self.indices = np.flatnonzero(self.weights)
        self.trace = trace
        self.seconds = seconds
        self.unit_rows = unit_rows
        self.path = path or []
        # rows held in partitions: ``prepared`` has only the rows fetched here, in the order of
        # their row numbers ``local_rows`` (None: ``prepared`` has every row)
        self.local_rows = None if local_rows is None else np.asarray(local_rows, dtype=int)

    def at_step(self, step: int) -> Coreset:
        """The coreset as it was after one addition.

        Parameters
        ----------
        step : int
            The addition, 0-based (a row of ``trace``).

        Returns
        -------
        Coreset
            The coreset then.
        """
        if not 0 <= step < len(self.path):
            raise RobustStanInputError(f"step: must lie in 0..{len(self.path) - 1}, got {step}")
        units, weights = self.path[step]
        unit_weights = np.zeros(self.unit_weights.size)
        unit_weights[units] = weights
        return type(self)(self.program, self.prepared, self.method, unit_weights, self.unit_rows,
                       self.trace.iloc[:step + 1], self.trace["seconds"].iloc[step], self.group_labels,
                       self.path[:step + 1], self.local_rows)

    def __repr__(self) -> str:
        units = "groups" if self.group_labels is not None else "rows"
        return (f"<robust_stan.Coreset {self.method}: {np.count_nonzero(self.unit_weights)} {units}, "
                f"{self.indices.size} rows, total weight {self.weights.sum():.4g}>")

    def divergence_of(self, posterior: str) -> Divergence:
        """The loss of one of the coreset's posteriors.

        Parameters
        ----------
        posterior : {"beta", "classical"}
            The coreset's divergence, or KL.

        Returns
        -------
        Divergence
            That divergence.

        Raises
        ------
        RobustStanInputError
            If ``posterior`` is neither, or no row has a weight yet.
        """
        if posterior not in ("beta", "classical"):
            raise RobustStanInputError(f"posterior: must be 'beta' or 'classical', got {posterior!r}")
        if self.indices.size == 0:
            raise RobustStanInputError("coreset: no row has a positive weight yet; there is no posterior to fit")
        return self.divergence if posterior == "beta" else KL()

    def prepared_for(self, posterior: str) -> PreparedData:
        """The coreset posterior's prepared data: the weights as data, the beta or the classical loss
        (:meth:`robust_stan.Model.with_row_weights`).

        Parameters
        ----------
        posterior : {"beta", "classical"}
            As for :meth:`divergence_of`.

        Returns
        -------
        PreparedData
            Ready for the model's compiled program.
        """
        divergence = self.divergence_of(posterior)
        rows = self.indices
        held = rows
        if self.local_rows is not None:  # positions in prepared
            held = np.minimum(np.searchsorted(self.local_rows, rows), max(self.local_rows.size - 1, 0))
            if not np.array_equal(self.local_rows[held], rows):
                raise RobustStanInputError("coreset: some of its rows were not fetched from their partitions")
        return self.program.with_row_weights(self.prepared, held, self.weights[rows], divergence)

    def sample(self, posterior: str = "beta", chains: int = 4, iter_warmup: int = 1000, iter_sampling: int = 1000,
               thin: int = 1, seed: int | None = None, adapt_delta: float = 0.8, max_treedepth: int = 10,
               show_progress: bool = True) -> Fit:
        """NUTS on the coreset posterior.

        Parameters
        ----------
        posterior : {"beta", "classical"}, default "beta"
            The coreset's divergence, or KL.
        chains, iter_warmup, iter_sampling, thin, seed, adapt_delta, max_treedepth, show_progress
            As for :meth:`robust_stan.Model.sample`.

        Returns
        -------
        Fit
            The draws.
        """
        return self.program.sample_prepared(self.prepared_for(posterior), chains=chains, iter_warmup=iter_warmup,
                                            iter_sampling=iter_sampling, thin=thin, seed=seed,
                                            adapt_delta=adapt_delta, max_treedepth=max_treedepth,
                                            show_progress=show_progress)

    def variational(self, posterior: str = "beta", family: str = "meanfield", draws: int = 1000,
                    seed: int | None = None, show_progress: bool = True, **options):
        """robust-stan's variational approximation of the coreset posterior.

        Parameters
        ----------
        posterior : {"beta", "classical"}, default "beta"
            The coreset's divergence, or KL.
        family, draws, seed, show_progress
            As for :meth:`robust_stan.Model.variational`.
        **options
            Passed to :meth:`robust_stan.Model.variational`.

        Returns
        -------
        VariationalFit
            Draws from q.
        """
        return self.program.variational_prepared(self.prepared_for(posterior), family=family, draws=draws, seed=seed,
                                                 show_progress=show_progress, options=VariationalOptions(**options))
