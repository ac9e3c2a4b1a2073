"""Fit objects: draws on the original scale, summaries, ArviZ output, outlier scores."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from .data import Scaling
from .divergences import Divergence
from .engines import NutsSettings, RawDraws
from .errors import RobustStanInputError

# ArviZ's names for Stan's sampler statistics.
_SAMPLE_STATS = {
    "lp__": "lp",
    "accept_stat__": "acceptance_rate",
    "stepsize__": "step_size",
    "treedepth__": "tree_depth",
    "n_leapfrog__": "n_steps",
    "divergent__": "diverging",
    "energy__": "energy",
}


def _element_labels(name: str, shape: tuple[int, ...]) -> list[str]:
    if not shape:
        return [name]
    return [f"{name}[{','.join(str(i + 1) for i in idx)}]" for idx in np.ndindex(*shape)]


class Fit:
    """Result of :meth:`Model.sample`: NUTS draws of the generalized posterior.

    Parameters are reported on the original scale of the outcome. ``raw`` is
    the engine-neutral output and ``raw.backend`` the engine's own object.
    """

    method = "nuts"

    def __init__(self, model, raw: RawDraws, *, data: Mapping, stan_data: dict, scaling: Scaling,
                 divergence: Divergence, learning_rate: float, settings: NutsSettings):
        from .model import to_original_scale

        self.model = model
        self.raw = raw
        self.stan_data = stan_data
        self.scaling = scaling
        self.divergence = divergence
        self.learning_rate = learning_rate
        self.settings = settings
        spec = model.spec
        self.parameter_names = spec.parameter_names
        self.posterior = {
            name: to_original_scale(spec.rescale.get(name), raw.variables[name], scaling)
            for name in self.parameter_names
        }
        family = spec.family
        rescaled = bool(spec.standardize) and family.continuous
        log_scale = np.log(scaling.scale) if rescaled else 0.0
        # Samplers driven from Python may leave generated quantities out (see rs.rob_ula).
        self.log_lik = raw.variables["log_lik"] - log_scale if "log_lik" in raw.variables else None
        self.robust_loss = raw.variables.get("robust_loss")
        y_rep = raw.variables.get("y_rep")
        self.y_rep = scaling.center + scaling.scale * y_rep if rescaled and y_rep is not None else y_rep
        y = np.asarray(data["y"].to_numpy() if hasattr(data["y"], "to_numpy") else data["y"])
        self.y = y

    # -- access -----------------------------------------------------------------
    def draws(self, name: str) -> np.ndarray:
        """Draws of a parameter (or 'log_lik', 'robust_loss', 'y_rep') as (chains, draws, ...)."""
        extra = {"log_lik": self.log_lik, "robust_loss": self.robust_loss, "y_rep": self.y_rep}
        if name in self.posterior:
            return self.posterior[name]
        if name in extra:
            if extra[name] is None:
                raise RobustStanInputError(f"name: this fit has no {name!r} draws (the sampler was asked to leave "
                                           "generated quantities out, or its engine cannot draw them freshly)")
            return extra[name]
        if name in self.raw.sampler:
            return self.raw.sampler[name]
        raise RobustStanInputError(f"name: no variable {name!r}; parameters are {self.parameter_names}")

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
        """Per scalar parameter: mean, sd, percentiles, MCSE of the mean, ESS (bulk, tail) and R-hat."""
        import arviz as az

        rows = {}
        for name, values in self.posterior.items():
            shape = values.shape[2:]
            flat = values.reshape(values.shape[:2] + (-1,))
            for j, label in enumerate(_element_labels(name, shape)):
                x = flat[:, :, j]
                row = {"mean": x.mean(), "sd": x.std(ddof=1)}
                row.update({f"{p:g}%": np.percentile(x, p) for p in percentiles})
                row["mcse_mean"] = float(az.mcse(x, method="mean"))
                row["ess_bulk"] = float(az.ess(x, method="bulk"))
                row["ess_tail"] = float(az.ess(x, method="tail"))
                row["r_hat"] = float(az.rhat(x))
                rows[label] = row
        return pd.DataFrame.from_dict(rows, orient="index")

    def diagnostics(self) -> dict:
        """Divergent transitions, tree-depth hits and the largest R-hat."""
        summary = self.summary()
        return {
            "divergent": int(self.raw.sampler["divergent__"].sum()),
            "max_treedepth_hits": int((self.raw.sampler["treedepth__"] >= self.settings.max_treedepth).sum()),
            "max_r_hat": float(summary["r_hat"].max()),
        }

    def outlier_scores(self, beta: float | None = None) -> pd.Series:
        """Per observation: posterior mean of p(y_i | theta)^beta relative to its median over observations.

        Low scores mark observations the robust loss down-weights. ``beta``
        defaults to the fit's beta or gamma; a KL fit needs it given.
        """
        if beta is None:
            if self.divergence.code == 0:
                raise RobustStanInputError("beta: a KL fit has no beta of its own; pass outlier_scores(beta=...)")
            beta = self.divergence.param
        if not beta > 0:
            raise RobustStanInputError(f"beta: must be positive, got {beta}")
        log_lik = self.draws("log_lik")
        log_lik = log_lik.reshape(-1, log_lik.shape[-1])
        mean_power = np.exp(beta * log_lik).mean(axis=0)
        return pd.Series(mean_power / np.median(mean_power), name="outlier_score").rename_axis("observation")

    def to_arviz(self):
        """ArviZ InferenceData: posterior, sample_stats, log_likelihood, posterior_predictive,
        observed_data, constant_data (weights) and a robust_loss group, with named dims
        (groups of generated quantities the fit left out are absent)."""
        import arviz as az

        dims = {name: [f"{name}_dim_{i}" for i in range(v.ndim - 2)] for name, v in self.posterior.items()}
        obs_dims = ["obs"] + (["outcome_dim"] if self.y.ndim > 1 else [])
        dims.update({"y": obs_dims, "weights": ["obs"], "robust_loss": ["obs"]})
        if "b" in dims and len(dims["b"]) == 1:
            dims["b"] = ["predictor"]
        optional = {"log_likelihood": self.log_lik, "posterior_predictive": self.y_rep}
        idata = az.from_dict(
            posterior=self.posterior,
            sample_stats={_SAMPLE_STATS.get(k, k): (v.astype(bool) if k == "divergent__" else v)
                          for k, v in self.raw.sampler.items()},
            **{group: {"y": values} for group, values in optional.items() if values is not None},
            observed_data={"y": self.y},
            constant_data={"weights": self.stan_data["weights"]},
            dims=dims,
            attrs={"divergence": repr(self.divergence), "learning_rate": self.learning_rate,
                   "engine": self.model.engine, "inference_library": "robust-stan"},
        )
        if self.robust_loss is not None:
            loss = az.from_dict(posterior={"robust_loss": self.robust_loss}, dims={"robust_loss": ["obs"]})
            idata.add_groups(robust_loss=loss.posterior)
        return idata

    def __repr__(self) -> str:
        c, d = next(iter(self.posterior.values())).shape[:2]
        return f"<robust_stan.Fit {self.divergence!r}, {c} chains x {d} draws, parameters {self.parameter_names}>"
