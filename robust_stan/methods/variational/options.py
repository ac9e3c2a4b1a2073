"""The options of a model's ``variational`` beyond the common ones, each sent to the method that takes
it (robust-stan's driver, or Stan's ADVI, Pathfinder and Laplace through CmdStanPy)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ...common.errors import RobustStanInputError
from .robust_vi import GaussianQ


@dataclass(frozen=True)
class VariationalOptions:
    """The options of :meth:`robust_stan.Model.variational` beyond the common ones, sent to the method that
    takes them. None leaves an option at the method's own default.

    Parameters
    ----------
    iter, grad_samples, elbo_samples, eta, tol_rel_obj, eval_elbo : int, int, int, float, float, int or None
        Options robust-stan's driver and Stan's ADVI share (CmdStanPy's names).
    batch_size, init_radius, init_sd, warm_start, oracle : int, float, float, GaussianQ, str or None
        Options of robust-stan's driver only.
    stan_options : mapping or None, default None
        Further arguments of CmdStanPy's method (``method="advi"``, ``"pathfinder"``, ``"laplace"``).
    """

    iter: int | None = None
    grad_samples: int | None = None
    elbo_samples: int | None = None
    eta: float | None = None
    tol_rel_obj: float | None = None
    eval_elbo: int | None = None
    batch_size: int | None = None
    init_radius: float | None = None
    init_sd: float | None = None
    warm_start: GaussianQ | None = None
    oracle: str | None = None
    stan_options: Mapping | None = None

    _SHARED = ("iter", "grad_samples", "elbo_samples", "eta", "tol_rel_obj", "eval_elbo")
    _DRIVER = ("batch_size", "init_radius", "init_sd", "warm_start", "oracle")

    def _given(self, names: tuple[str, ...]) -> dict:
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

    def for_method(self, method: str) -> dict:
        """The keyword arguments of ``method``'s run (robust-stan's driver, or CmdStanPy's method).

        Parameters
        ----------
        method : str
            "robust-stan", "advi", "pathfinder" or "laplace".

        Returns
        -------
        dict
            The options given, by name.

        Raises
        ------
        RobustStanInputError
            If an option was given that ``method`` does not take (the message names it).
        """
        shared = self._given(self._SHARED)
        if method == "robust-stan":
            if self.stan_options:
                raise RobustStanInputError("stan_options: for Stan's methods (method='advi', 'pathfinder' or "
                                           "'laplace'); robust-stan's driver takes its options by name")
            return {**shared, **self._given(self._DRIVER)}
        driver_only = sorted(self._given(self._DRIVER))
        if driver_only:
            raise RobustStanInputError(f"{', '.join(driver_only)}: options of robust-stan's driver "
                                       f"(method='robust-stan'), not of Stan's {method!r}")
        if shared and method != "advi":
            raise RobustStanInputError(f"{', '.join(sorted(shared))}: options of ADVI and robust-stan's driver; give "
                                       f"Stan's {method!r} its own in stan_options")
        return {**shared, **dict(self.stan_options or {})}
