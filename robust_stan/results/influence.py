"""The influence curves of :func:`robust_stan.influence`, drawn (the refits are
:mod:`robust_stan.methods.variational.influence`)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd


def plot_influence(tables: Mapping[str, pd.DataFrame], ax=None, xlabel: str = "value of the moved point"):
    """Plot ``change`` against ``value`` for each labelled table of :func:`robust_stan.influence`.

    Parameters
    ----------
    tables : mapping of str to pandas.DataFrame
        Tables by label, e.g. ``{"KL": ..., "beta": ...}``.
    ax : matplotlib.axes.Axes or None, default None
        Axes to draw on; None makes a new figure.
    xlabel : str, default "value of the moved point"
        The x axis label.

    Returns
    -------
    matplotlib.axes.Axes
        The axes drawn on.
    """
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(5, 3.5))
    for label, table in tables.items():
        ax.plot(table["value"], table["change"], marker="o", label=label)
    ax.axhline(0, color="grey", lw=0.5)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("change in test log-likelihood")
    ax.legend()
    return ax
