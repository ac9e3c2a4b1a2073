"""Results of DP-VI: the fit (which holds the release), and posteriors computed from the release alone."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..common.errors import RobustStanInputError
from ..gradients.oracles import constrained_draws
from ..methods.dpvi.mechanism import DPVIRelease
from .arviz_output import draws_dataset, native_inference_data
from .convergence import summary_table, warn_if_poor_convergence


class DPVIFit:
    """The result of :func:`robust_stan.dpvi`.

    The fit holds no data; every posterior is computed from ``release``
    (:func:`robust_stan.noise_aware`, :func:`robust_stan.dpvi_baseline`).

    Parameters
    ----------
    release : DPVIRelease
        Everything the mechanism released: the iterates, the noisy gradients and the public
        settings, among them the privacy accounting.
    seconds : float
        Wall time of the run.
    """

    def __init__(self, release: DPVIRelease, seconds: float):
        self.release = release
        self.seconds = seconds

    @property
    def accounting(self):
        """The privacy accounting of the release (epsilon, delta, noise multiplier, ...)."""
        return self.release.accounting

    def __repr__(self) -> str:
        a = self.release.accounting
        return (f"<robust_stan.DPVIFit ({a.epsilon:g}, {a.delta:g})-DP, sigma {a.noise_multiplier:.4g}, "
                f"C {self.release.clip:g}, kappa {a.sampling_rate:g}, T {a.steps}, {a.accountant} {a.accountant_version}>")


class PrivatePosterior:
    """Draws of the model's parameters computed from a DP-VI release.

    It has the fit objects' :meth:`draws`, :meth:`summary` and :meth:`to_arviz`. For
    "noise_aware", ``trace_summary`` holds the convergence figures of the trace model's draws
    (a warning is given when they are poor).

    Parameters
    ----------
    release : DPVIRelease
        What :func:`robust_stan.dpvi` released.
    kind : {"noise_aware", "last_iterate", "averaged"}
        The mixture over draws of phi* of q(theta; phi*) (eq. 23 of Alrawajfeh, Jälkö and Honkela
        (2025, arXiv:2410.19371)), q(theta; phi_T) (the naive baseline) or q of the mean of the
        post-burn-in iterates (DPVIm).
    unconstrained : numpy.ndarray
        The draws on the program's unconstrained scale, (chains, draws, n).
    trace_draws : dict of numpy.ndarray or None, default None
        "noise_aware": the draws of phi* and A = softplus(v) (the InferenceData group
        ``noise_aware``).
    method : str or None, default None
        "noise_aware": how the trace model was fitted ("nuts" or "laplace").
    burn_in : int or None, default None
        The first iterate the posterior uses, T*.
    """

    def __init__(self, release: DPVIRelease, kind: str, unconstrained: np.ndarray,
                 trace_draws: dict[str, np.ndarray] | None = None, method: str | None = None,
                 burn_in: int | None = None):
        self.release = release
        self.kind = kind
        self.method = method
        self.burn_in = burn_in  # T*, for the noise-aware posterior
        self.unconstrained = unconstrained
        self.trace_draws = trace_draws
        self.parameter_names = release.model.spec.parameter_names
        oracle = release.model.oracle_for(release.public_data)
        variables = constrained_draws(oracle, unconstrained)
        self.posterior = {name: variables[name] for name in self.parameter_names}
        self.trace_summary = None
        if trace_draws is not None and method == "nuts":
            self.trace_summary = summary_table(trace_draws)
            warn_if_poor_convergence(self.trace_summary, "noise-aware NUTS", stacklevel=4)

    def draws(self, name: str) -> np.ndarray:
        """Draws of a parameter.

        Parameters
        ----------
        name : str
            The parameter.

        Returns
        -------
        numpy.ndarray
            Shape (chains, draws, ...).
        """
        if name in self.posterior:
            return self.posterior[name]
        if self.trace_draws is not None and name in self.trace_draws:
            return self.trace_draws[name]
        raise RobustStanInputError(f"name: no variable {name!r}; parameters are {self.parameter_names}")

    def summary(self, percentiles: tuple[float, ...] = (5, 50, 95)) -> pd.DataFrame:
        """Per scalar parameter: mean, sd, percentiles (and the draws' MCSE, ESS and R-hat).

        Parameters
        ----------
        percentiles : tuple of float, default (5, 50, 95)
            Percentiles of the draws to report.

        Returns
        -------
        pandas.DataFrame
            One row per scalar parameter.
        """
        return summary_table(self.posterior, percentiles)

    def to_arviz(self):
        """The draws as the installed ArviZ's object.

        Returns
        -------
        arviz.InferenceData or xarray.DataTree
            Group ``posterior`` (the model's parameters) and, for the noise-aware posterior,
            ``noise_aware`` (phi* and A).
        """
        a = self.release.accounting
        attrs = {"inference_library": "robust-stan", "method": f"dpvi_{self.kind}", "epsilon": a.epsilon,
                 "delta": a.delta, "noise_multiplier": a.noise_multiplier, "accountant": a.accountant,
                 "engine": self.release.model.engine, "q_scale": self.release.q_scale}
        groups = {"posterior": draws_dataset(self.posterior, attrs=attrs)}
        if self.trace_draws is not None:
            groups["noise_aware"] = draws_dataset(self.trace_draws, {"phi_star": ["phi"], "a": ["phi"]}, attrs)
        return native_inference_data(groups)

    def __repr__(self) -> str:
        chains, draws, _ = self.unconstrained.shape
        return f"<robust_stan.PrivatePosterior {self.kind}, {chains} x {draws} draws, parameters {self.parameter_names}>"

