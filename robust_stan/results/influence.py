"""The influence curves of :func:`robust_stan.influence`, drawn (the refits are
:mod:`robust_stan.methods.variational.influence`)."""

from __future__ import annotations

from collections.abc import Mapping

import pandas as pd


def plot_influence(tables: Mapping[str, pd.DataFrame], ax=None, xlabel: str = "value of the moved point"):
    """Plot ``change`` against ``value`` for each labelled table (e.g. {"KL": ..., "beta": ...})."""
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
