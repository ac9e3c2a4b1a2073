"""A neural network as a robust-stan custom specification (Futami et al. 2018's benchmarks).

Two hidden layers of H ReLU units (H is data, 20 in the paper), a Gaussian or
Student-t output (regression, with scale sigma; the t's nu is learned) or a
Bernoulli output (classification, logit link). It is an ordinary :func:`robust_stan.custom` model: the per-row expression
serves the per-example mode and a vectorised one the posterior mode.

Data: ``X`` (N x P, inputs best standardised), ``y``, ``H``. Priors: every weight
and bias N(0, 1); sigma ~ exponential(1) (standardise y for regression);
nu ~ gamma(2, 0.1).
"""

from __future__ import annotations

import numpy as np

from ..common.errors import RobustStanInputError
from .builtin import custom
from .model import Model

_PARAMETERS = "matrix[P, H] W1; vector[H] b1; matrix[H, H] W2; vector[H] b2; vector[H] w3; real b3;"
_PRIORS = ("to_vector(W1) ~ normal(0, 1); b1 ~ normal(0, 1); to_vector(W2) ~ normal(0, 1); "
           "b2 ~ normal(0, 1); w3 ~ normal(0, 1); b3 ~ normal(0, 1);")
_WEIGHTS = ("W1", "b1", "W2", "b2", "w3", "b3")
_PER_ROW = "fmax(fmax(X[n] * W1 + b1', 0) * W2 + b2', 0) * w3 + b3"
_ALL_ROWS = "fmax(fmax(X * W1 + rep_matrix(b1', N), 0) * W2 + rep_matrix(b2', N), 0) * w3 + b3"


def mlp(family: str = "normal", engine: str = "auto") -> Model:
    """A two-hidden-layer ReLU network as a model.

    The width H is data, so every width shares one compiled program.

    Parameters
    ----------
    family : {"normal", "student_t", "bernoulli"}, default "normal"
        Regression ("normal", "student_t") or classification ("bernoulli").
    engine : str, default "auto"
        "cmdstan" or "httpstan"; "auto" takes $ROBUST_STAN_ENGINE, else the one installed.

    Returns
    -------
    Model
        The network as a :class:`Model` (every divergence and method applies).
    """
    data = "int<lower=1> P; matrix[N, P] X; int<lower=1> H;"
    title = f"robust-stan neural network, two ReLU layers, {family} output"
    if family == "normal":
        return custom("normal", data=data, parameters=_PARAMETERS + " real<lower=0> sigma;",
                      priors=_PRIORS + " sigma ~ exponential(1);", mu=_PER_ROW, sigma="sigma",
                      vectorised={"mu": _ALL_ROWS}, engine=engine, title=title)
    if family == "student_t":
        return custom("student_t", data=data, parameters=_PARAMETERS + " real<lower=0> sigma; real<lower=1> nu;",
                      priors=_PRIORS + " sigma ~ exponential(1); nu ~ gamma(2, 0.1);", nu="nu", mu=_PER_ROW,
                      sigma="sigma", vectorised={"mu": _ALL_ROWS}, engine=engine, title=title)
    if family == "bernoulli":
        return custom("bernoulli", data=data, parameters=_PARAMETERS, priors=_PRIORS, eta=_PER_ROW,
                      vectorised={"eta": _ALL_ROWS}, engine=engine, title=title)
    raise RobustStanInputError(
        f"family: the network has a 'normal', 'student_t' or 'bernoulli' output, not {family!r}")


def network_output(fit, X) -> np.ndarray:
    """The network's output at new inputs for every posterior draw of a fitted :func:`mlp`.

    The output is the normal or t location, or the Bernoulli logit; the arithmetic is the
    program's vectorised form, in NumPy.

    Parameters
    ----------
    fit : Fit
        A fit of a model from :func:`mlp`.
    X : array_like
        Inputs, rows x P.

    Returns
    -------
    numpy.ndarray
        Shape (draws, rows), chains stacked.
    """
    missing = [name for name in _WEIGHTS if name not in fit.parameter_names]
    if missing:
        raise RobustStanInputError(f"fit: not a fit of rs.mlp (no {', '.join(missing)})")
    draw = {name: np.asarray(fit.draws(name)) for name in _WEIGHTS}
    draw = {name: value.reshape((-1,) + value.shape[2:]) for name, value in draw.items()}
    X = np.asarray(X, dtype=float)
    if X.ndim != 2 or X.shape[1] != draw["W1"].shape[1]:
        raise RobustStanInputError(f"X: expected a (rows, {draw['W1'].shape[1]}) array, got shape {X.shape}")
    hidden = np.maximum(X @ draw["W1"] + draw["b1"][:, None, :], 0)
    hidden = np.maximum(hidden @ draw["W2"] + draw["b2"][:, None, :], 0)
    return np.einsum("snh,sh->sn", hidden, draw["w3"]) + draw["b3"][:, None]
