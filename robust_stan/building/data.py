"""Turns user data plus robust-stan settings into a program's Stan data.

Every check runs here, before any compile or sampling, and every error names
the argument at fault.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from ..common.errors import RobustStanInputError, RobustStanWarning, require_positive
from .divergences import KL, Divergence, DivergenceCode, refuse_original_gamma
from .families import STAN_INT_MAX
from .formulas import Design
from .spec import LINEAR_PREDICTOR_MODELS, ModelSpec


class Mode(IntEnum):
    """The generated program's ``mode`` switch: what its model block computes."""

    POSTERIOR = 0  # prior plus the (robust) likelihood
    PER_EXAMPLE = 1  # one copy of the parameters per batch row, each row's loss on its own copy
    PRIOR = 2  # the prior alone
    PER_EXAMPLE_LINEAR_PREDICTOR = 3  # per-example, copying the intercept (the row's eta) but not the coefficients


class Pointwise(IntEnum):
    """The generated program's ``pointwise`` switch (``rs_pointwise`` in a robustified program,
    which has OFF and ON only): which per-observation generated quantities it fills."""

    OFF = 0
    ON = 1  # log_lik, robust_loss and y_rep
    Y_SCORE = 2  # also d/dy and d^2/dy^2 of log p, where the family has them


#: The mode names the code uses (``mode="per_example"``), by code.
MODES = {mode.name.lower(): mode for mode in Mode}


@dataclass(frozen=True)
class Scaling:
    """How the outcome was standardised: y_fitted = (y - center) / scale.

    Centre and scale are the median and 1.4826 * MAD (exponential: scale =
    median), so contamination does not change what beta or gamma means.
    """

    center: float = 0.0
    scale: float = 1.0


@dataclass(frozen=True)
class PreparedData:
    """A public call's data and settings, checked and converted once.

    Parameters
    ----------
    data : mapping
        The user's data as given (a fit reports its observed values).
    stan_data : dict
        The Stan data for the program (posterior mode).
    scaling : Scaling
        How the outcome was standardised.
    divergence : Divergence
        The divergence of the call.
    design : Design or None, default None
        A formula model's design on the training data (its names, levels and encoding, which
        predictions for new rows reuse); None without a formula.
    column_names : tuple of str or None, default None
        The names of the columns of ``X`` (a formula's, or a DataFrame's), None when X had none.
    """

    data: Mapping
    stan_data: dict
    scaling: Scaling
    divergence: Divergence
    design: Design | None = None
    column_names: tuple[str, ...] | None = None

    @property
    def learning_rate(self) -> float:
        """The learning rate w of the call (float)."""
        return float(self.stan_data["learning_rate"])


def column_names_of(data) -> tuple[str, ...] | None:
    """The column names of ``data["X"]`` when it is a pandas DataFrame (they name the coefficients),
    else None (also when the data hold no X or are not a mapping: prepare_data says what is wrong)."""
    try:
        X = data["X"]
    except (KeyError, TypeError, IndexError, ValueError):
        return None
    if hasattr(X, "columns") and hasattr(X, "to_numpy"):
        return tuple(str(c) for c in X.columns)
    return None


def outcome_values(data: Mapping) -> np.ndarray:
    """The user's outcome ``data["y"]`` as a NumPy array (a pandas column included)."""
    y = data["y"]
    return np.asarray(y.to_numpy() if hasattr(y, "to_numpy") else y)


def mode_code(mode: str) -> int:
    """The program's code for a mode name (a :class:`Mode` as a plain int, as Stan data), or an
    error naming ``mode``."""
    if mode not in MODES:
        raise RobustStanInputError(f"mode: must be one of {list(MODES)}, got {mode!r}")
    return int(MODES[mode])


def log_density_on_outcome_scale(spec: ModelSpec, log_lik, scaling: Scaling):
    """Log densities of the fitted (standardised) outcome as densities of the outcome in its own
    units: minus log(scale) for a continuous outcome the model standardised."""
    return log_lik - np.log(scaling.scale) if spec.standardize and spec.family.continuous else log_lik


def robust_scale(y: np.ndarray) -> float:
    """Scale for standardising an outcome: 1.4826 * MAD (the sd under normality),
    which outliers cannot inflate; the sd when the MAD is 0."""
    mad = 1.4826 * float(np.median(np.abs(y - np.median(y))))
    return mad if mad > 0 else (float(np.std(y)) or 1.0)


def to_fitted_scale(rule: str | None, value, scaling: Scaling):
    """Inverse of :func:`to_original_scale`."""
    value = np.asarray(value, dtype=float)
    if rule == "location":
        return (value - scaling.center) / scaling.scale
    if rule == "scale":
        return value / scaling.scale
    if rule == "inverse_scale":
        return value * scaling.scale
    if rule == "log_scale":
        return value - np.log(scaling.scale)
    return value


def to_original_scale(rule: str | None, value, scaling: Scaling):
    """Map draws of a parameter fitted on the standardised outcome back to the original units."""
    value = np.asarray(value, dtype=float)
    if rule == "location":
        return scaling.center + scaling.scale * value
    if rule == "scale":
        return scaling.scale * value
    if rule == "inverse_scale":
        return value / scaling.scale
    if rule == "log_scale":
        return value + np.log(scaling.scale)
    return value


def _as_array(name: str, value) -> np.ndarray:
    if hasattr(value, "to_numpy"):  # pandas Series / DataFrame
        value = value.to_numpy()
    arr = np.asarray(value)
    if arr.dtype == bool:
        arr = arr.astype(np.int64)
    if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise RobustStanInputError(f"{name}: must be numeric, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and not np.all(np.isfinite(arr)):
        raise RobustStanInputError(f"{name}: contains non-finite values (NaN or inf)")
    if np.issubdtype(arr.dtype, np.integer) and arr.size and np.abs(arr).max() > STAN_INT_MAX:
        raise RobustStanInputError(f"{name}: Stan's integers hold at most {STAN_INT_MAX}, got {np.abs(arr).max()}")
    return arr


def check_learning_rate(learning_rate) -> float:
    return require_positive("learning_rate", learning_rate)


def check_weights(weights, n: int) -> np.ndarray:
    if weights is None:
        return np.ones(n)
    try:
        arr = np.asarray(weights, dtype=float)
    except (TypeError, ValueError):
        raise RobustStanInputError(f"weights: must be numbers, one per observation; got {weights!r:.60}") from None
    if arr.shape != (n,):
        raise RobustStanInputError(f"weights: need one weight per observation, shape ({n},); got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise RobustStanInputError("weights: contains non-finite values")
    if np.any(arr < 0):
        raise RobustStanInputError(f"weights: must be >= 0; entry {int(np.flatnonzero(arr < 0)[0])} is negative")
    if n and arr.sum() <= 0:
        raise RobustStanInputError("weights: at least one weight must be positive")
    return arr


#: Below this effective sample size the beta loss leaves the posterior close to the prior.
NEGLIGIBLE_DATA = 1.0


def beta_loss_effective_sample_size(family, y: np.ndarray, beta: float, weights: np.ndarray,
                                    learning_rate: float = 1.0) -> float | None:
    """How many observations' worth the beta loss gives the data: w * sum_i v_i p_i^beta.

    The gradient of the beta loss of row i is p_i^beta times that of its log-likelihood (plus
    the integral term, which does not depend on y_i), so p_i^beta is the weight row i keeps.
    p_i comes from a pilot fit on the scale the model is fitted on: normal with the median
    and 1.4826 x MAD (normal, student_t), exponential with the median (exponential), the
    observed frequencies (discrete families). None for multi_normal and for continuous families
    that the built-in models do not standardise (lognormal, gamma, weibull, beta): no pilot here.
    """
    y = np.asarray(y)
    if family.multivariate or y.size == 0 or (family.continuous and family.standardize is None):
        return None
    if family.standardize == "affine":
        scale = robust_scale(y)
        log_p = -np.log(scale) - 0.5 * np.log(2 * np.pi) - 0.5 * ((y - np.median(y)) / scale) ** 2
    elif family.standardize == "scale":
        rate = np.log(2.0) / (float(np.median(y)) or float(np.mean(y)) or 1.0)
        log_p = np.log(rate) - rate * y
    else:
        _, index, counts = np.unique(y, return_inverse=True, return_counts=True)
        log_p = np.log(counts[np.ravel(index)] / y.size)
    return float(learning_rate * np.sum(weights * np.exp(beta * log_p)))


def warn_if_the_data_barely_count(family, y_fitted: np.ndarray, weights: np.ndarray, learning_rate: float,
                                  divergence: Divergence, stacklevel: int = 5) -> None:
    """A RobustStanWarning when a beta loss leaves the data less than one observation's worth
    (:func:`beta_loss_effective_sample_size`; ``stacklevel`` points the warning at the user's call)."""
    if divergence.code != DivergenceCode.BETA:
        return
    ess = beta_loss_effective_sample_size(family, y_fitted, divergence.param, weights, learning_rate)
    if ess is not None and ess < NEGLIGIBLE_DATA:
        warnings.warn(
            f"divergence: with beta = {divergence.param:g} the data have almost no influence: the beta loss "
            f"weighs the {len(y_fitted)} observations like {ess:.3g} (sum of p_i^beta at a pilot fit), so the "
            "posterior will be close to the prior. Choose a smaller beta (0.1-1 is usual).",
            RobustStanWarning, stacklevel=stacklevel)


def default_prior_scales(column_sd: np.ndarray) -> np.ndarray:
    """The built-in glms' prior scales of the coefficients, 2.5 / sd(X[:, j]) (1 for a constant column)."""
    return 2.5 / np.where(column_sd > 0, column_sd, 1.0)


def prepare_data(
    spec: ModelSpec,
    data: Mapping,
    divergence: Divergence | None = None,
    learning_rate: float = 1.0,
    weights=None,
    mode: str = "posterior",
    batch=None,
    scaling: Scaling | None = None,
) -> tuple[dict, Scaling]:
    """Validate ``data`` and return (Stan data dict, outcome scaling).

    ``divergence`` is a :class:`Divergence` already checked by the public entry
    (None means KL); ``learning_rate`` and ``weights`` are checked here.

    ``scaling`` imposes another data set's outcome scaling (test data seen by a
    model fitted to training data); by default it is computed from ``data``."""
    if not isinstance(data, Mapping) and not hasattr(data, "columns"):
        raise RobustStanInputError(f"data: expected a dict of arrays (or a pandas DataFrame), got {type(data).__name__}")
    data = {k: data[k] for k in (data.columns if hasattr(data, "columns") else data)}
    if "y" not in data:
        raise RobustStanInputError("data: missing the outcome 'y'")
    family = spec.family
    raw = {k: _as_array(k, v) for k, v in data.items()}
    if family.class_labels and "K" not in raw:
        raw["K"] = np.asarray(int(np.max(raw["y"])) if raw["y"].size else 2)
        raw["K_inferred"] = np.asarray(True)
    y = family.check_outcome(raw["y"], raw)
    raw.pop("K_inferred", None)
    n = len(y)
    if n == 0:
        raise RobustStanInputError("y: no observations (N = 0); the posterior would be the prior")
    out: dict = {"N": n, **family.extra_stan_data(y, raw)}
    if "X" in spec.data_names() and "X" not in raw:
        raise RobustStanInputError("data: missing the predictor matrix 'X'")
    for name in spec.data_names():
        if name in spec.known:
            if name in raw:
                raise RobustStanInputError(f"data: {name!r} is fixed by the model's known={{{name!r}: "
                                           f"{spec.known[name]}}}; give it in one place, not also in the data")
            continue
        if name in out or (name in ("P", "prior_scale_b") and "X" in raw):
            continue
        if name not in raw:
            raise RobustStanInputError(f"data: missing {name!r}, which the model declares")
        out[name] = raw[name]
    if "X" in spec.data_names():
        # present: checked before the loop above; in C order, so that the prior scales (sums along columns)
        # are the same to the last bit whatever the layout the user's X had (a DataFrame's is often Fortran)
        X = np.ascontiguousarray(raw["X"], dtype=float)
        if X.ndim == 1:
            X = X[:, None]
        if X.ndim != 2 or X.shape[0] != n:
            raise RobustStanInputError(f"X: must be a matrix with one row per observation ({n}); got shape {X.shape}")
        out["X"] = X
        if "P" in spec.data_names():
            out["P"] = X.shape[1]
        if "prior_scale_b" in spec.data_names():
            if "prior_scale_b" in raw:
                scale_b = np.asarray(raw["prior_scale_b"], dtype=float)
                if scale_b.shape != (X.shape[1],) or np.any(scale_b <= 0):
                    raise RobustStanInputError(f"prior_scale_b: need {X.shape[1]} positive prior scales")
            else:
                scale_b = default_prior_scales(X.std(axis=0) if n > 1 else np.ones(X.shape[1]))
            out["prior_scale_b"] = scale_b

    y_fitted = y.astype(float) if family.continuous else y
    if scaling is not None:
        pass
    elif spec.standardize == "affine" and n > 1:
        scaling = Scaling(float(np.median(y)), robust_scale(y))
    elif spec.standardize == "spread" and n > 1:  # a model without an intercept: not centred
        scaling = Scaling(0.0, robust_scale(y))
    elif spec.standardize == "scale" and n > 0:
        scaling = Scaling(0.0, float(np.median(y)) or float(np.mean(y)) or 1.0)
    else:
        scaling = Scaling()
    if spec.standardize and family.continuous:
        y_fitted = (y - scaling.center) / scaling.scale
    out["y"] = y_fitted
    for name, value in spec.known.items():  # a known scale moves with y
        out[name] = float(to_fitted_scale(spec.known_rescale.get(name), value, scaling))

    div = divergence if divergence is not None else KL()  # the public entry has checked it
    out.update(div.stan_data())
    out["learning_rate"] = check_learning_rate(learning_rate)
    out["weights"] = check_weights(weights, n)
    if mode == "posterior" and batch is None:
        warn_if_the_data_barely_count(family, y_fitted, out["weights"], out["learning_rate"], div)
    out["mode"] = mode_code(mode)
    if mode == "per_example_linear_predictor" and spec.linear_predictor is None:
        raise RobustStanInputError(f"mode: 'per_example_linear_predictor' needs {LINEAR_PREDICTOR_MODELS}")
    if mode.startswith("per_example"):
        refuse_original_gamma(div, "divergence", "it has no per-example gradients")
    rows = np.arange(n) if batch is None else np.asarray(batch)
    if rows.ndim != 1 or not np.issubdtype(rows.dtype, np.integer):
        raise RobustStanInputError("batch: must be a 1-D array of row indices (0-based)")
    if rows.size and (rows.min() < 0 or rows.max() >= n):
        raise RobustStanInputError(f"batch: row indices must lie in 0..{n - 1}")
    out["n_batch"] = int(rows.size)
    out["batch"] = (rows + 1).astype(np.int64)
    out["pointwise"] = int(Pointwise.ON)  # the program's per-observation generated quantities (NUTS turns them off)
    return out, scaling


def with_switches(stan_data: dict, *, mode: str | None = None, learning_rate: float | None = None,
                  weights=None, pointwise: bool | Pointwise | None = None, divergence: Divergence | None = None) -> dict:
    """A copy of prepared Stan data with another ``mode``, ``learning_rate``, ``weights`` (checked),
    ``pointwise`` (whether the generated quantities include log_lik, robust_loss and y_rep) or
    ``divergence`` (a checked :class:`Divergence`): the variants a method needs (the prior alone,
    a reweighted posterior, the classical posterior of the same rows, draws without the
    per-observation quantities) without preparing the data again."""
    out = dict(stan_data)
    if divergence is not None:
        out.update(divergence.stan_data())
    if pointwise is not None:  # False / True, or Pointwise.Y_SCORE: also the y-derivatives where the family has them
        y_score = pointwise == Pointwise.Y_SCORE and not isinstance(pointwise, bool)
        out["pointwise"] = int(Pointwise.Y_SCORE if y_score else Pointwise.ON if pointwise else Pointwise.OFF)
    if mode is not None:
        out["mode"] = mode_code(mode)
    if learning_rate is not None:
        out["learning_rate"] = check_learning_rate(learning_rate)
    if weights is not None:
        out["weights"] = check_weights(weights, int(stan_data["N"]))
    return out


def slice_rows(spec: ModelSpec, stan_data: dict, rows: np.ndarray, weight_factor: float = 1.0) -> dict:
    """The prepared Stan data restricted to ``rows`` (0-based), each weight times
    ``weight_factor`` (N / B makes a minibatch's loss an unbiased estimate of the
    whole data's). Data computed from all rows (prior scales, standardisation)
    stay as they were, so the batch program is the full one seen on fewer rows."""
    out = dict(stan_data)
    for name in spec.row_data_names():
        out[name] = np.asarray(stan_data[name])[rows]
    out["weights"] = out["weights"] * weight_factor
    out["N"] = int(rows.size)
    out["n_batch"] = int(rows.size)
    out["batch"] = np.arange(1, rows.size + 1, dtype=np.int64)
    return out


def zero_row_data(spec: ModelSpec, stan_data: dict) -> dict:
    """The prepared Stan data with zero rows (sizes, priors and switches only, no per-row values
    and no per-observation outputs): enough for the program to turn unconstrained draws into
    its parameters, and nothing of the rows themselves."""
    return with_switches(slice_rows(spec, stan_data, np.zeros(0, dtype=int)), pointwise=False)
