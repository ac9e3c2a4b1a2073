"""What every robust-stan model runs the same way: NUTS and variational inference, on a built-in
model and on your own program alike, through the calls each kind of model answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from ..building.data import PreparedData, Scaling
from ..building.divergences import Divergence
from ..building.partitions import is_partitioned, refuse_cluster_for_rows_here
from ..common.cluster import Cluster
from ..engines import NutsSettings, RawDraws
from ..gradients.oracles import GradientOracle
from ..methods.nuts import nuts_settings
from ..methods.stan_methods import run_stan_method
from ..methods.variational.options import VariationalOptions
from ..methods.variational.robust_vi import GaussianQ, fit_variational
from ..results.fits.mcmc import Fit
from ..results.fits.model_view import FittedModel
from ..results.fits.stan_methods import StanMethodFit
from ..results.fits.variational import PartitionedVariationalFit, VariationalFit
from .mode_starts import inits_in_largest_mode


class _ModelHooks(FittedModel, Protocol):
    """The calls :class:`ModelMethods` makes of a model (both kinds define them)."""

    def prepare(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                weights=None) -> PreparedData: ...

    def sample_prepared(self, prepared: PreparedData, chains: int = 4, iter_warmup: int = 1000,
                        iter_sampling: int = 1000, thin: int = 1, seed: int | None = None,
                        inits: dict | list[dict] | str | None = None, adapt_delta: float = 0.8,
                        max_treedepth: int = 10, show_progress: bool = True) -> Fit: ...

    def oracle_for(self, stan_data: dict, oracle: str = "auto") -> GradientOracle: ...

    def switched(self, stan_data: dict, *, learning_rate: float | None = None, weights=None,
                 divergence: Divergence | None = None, pointwise: bool | None = None) -> dict: ...

    def inits_at(self, thetas, stan_data: dict, scaling: Scaling,
                 oracle: GradientOracle | None = None) -> list[dict]: ...

    def chain_inits(self, inits, chains: int, scaling: Scaling) -> list[dict] | None: ...

    def unconstrain_init(self, init: Mapping, stan_data: dict, scaling: Scaling) -> np.ndarray: ...

    def nuts_draws(self, stan_data: dict, settings: NutsSettings, chain_inits: list[dict] | None) -> RawDraws: ...

    def variational_on_partitions(self, data, divergence, learning_rate, weights, family, method, draws, seed,
                                  show_progress, inits, cluster, options) -> PartitionedVariationalFit: ...

    def variational_prepared(self, prepared: PreparedData, family: str = "meanfield", method: str = "robust-stan",
                             draws: int = 1000, seed: int | None = None, show_progress: bool = True,
                             inits: Mapping | None = None,
                             options: VariationalOptions | None = None) -> VariationalFit | StanMethodFit: ...


class ModelMethods:
    """NUTS (:meth:`sample`) and variational inference (:meth:`variational`) for every robust-stan
    model: :class:`robust_stan.Model` and :class:`robust_stan.StanProgramModel` inherit them, so
    both run the same code on the calls each answers (``prepare``, ``chain_inits``, ``inits_at``,
    ``switched``, ``nuts_draws``, ...)."""

    def sample(self: _ModelHooks, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
               weights=None, chains: int = 4, iter_warmup: int = 1000, iter_sampling: int = 1000,
               thin: int = 1, seed: int | None = None, inits: dict | list[dict] | str | None = None,
               adapt_delta: float = 0.8, max_treedepth: int = 10, show_progress: bool = True) -> Fit:
        """Sample the generalized posterior with Stan's NUTS.

        With outliers the robust posterior can have a second mode that follows them and holds almost
        none of the mass, where chains from Stan's dispersed starts can settle; ``inits="mode"``
        starts every chain in the largest mode found by L-BFGS from 32 dispersed starts (a search,
        not a guarantee) and warns when no mode holds 99% of the mass. A run whose R-hat or ESS is
        poor warns.

        Parameters
        ----------
        data, divergence, learning_rate, weights
            As for the model's ``prepare``.
        chains : int, default 4
            Number of chains.
        iter_warmup : int, default 1000
            Warmup iterations per chain.
        iter_sampling : int, default 1000
            Kept iterations per chain.
        thin : int, default 1
            Keep every ``thin``-th draw.
        seed : int or None, default None
            Seed of the run; None draws fresh entropy (not reproducible).
        inits : dict, list of dict, "mode" or None, default None
            Constrained starting values by parameter name (one dict for all chains, or one per
            chain); "mode" as above; None leaves the starts to Stan.
        adapt_delta : float, default 0.8
            NUTS's target acceptance rate, in (0, 1).
        max_treedepth : int, default 10
            NUTS's maximum tree depth.
        show_progress : bool, default True
            Show a progress bar.

        Returns
        -------
        Fit
            The draws, on the outcome's own scale.

        Raises
        ------
        RobustStanInputError
            If an argument is invalid (the message names it).
        """
        return self.sample_prepared(self.prepare(data, divergence, learning_rate, weights), chains=chains,
                                    iter_warmup=iter_warmup, iter_sampling=iter_sampling, thin=thin, seed=seed,
                                    inits=inits, adapt_delta=adapt_delta, max_treedepth=max_treedepth,
                                    show_progress=show_progress)

    def sample_prepared(self: _ModelHooks, prepared: PreparedData, chains: int = 4, iter_warmup: int = 1000,
                        iter_sampling: int = 1000, thin: int = 1, seed: int | None = None,
                        inits: dict | list[dict] | str | None = None, adapt_delta: float = 0.8,
                        max_treedepth: int = 10, show_progress: bool = True) -> Fit:
        """:meth:`sample` on data already prepared (a coreset's weighted rows, say).

        Parameters
        ----------
        prepared : PreparedData
            From :meth:`prepare` or a variant of it.
        chains, iter_warmup, iter_sampling, thin, seed, inits, adapt_delta, max_treedepth, show_progress
            As for :meth:`sample`.

        Returns
        -------
        Fit
            The draws.
        """
        settings = nuts_settings(chains, iter_warmup, iter_sampling, thin, seed, adapt_delta, max_treedepth,
                                 show_progress)
        if isinstance(inits, str):  # one oracle serves the census and the starts
            oracle = self.oracle_for(self.switched(prepared.stan_data, pointwise=False))
            inits = inits_in_largest_mode(
                inits, oracle, lambda thetas: self.inits_at(thetas, prepared.stan_data, prepared.scaling, oracle),
                settings.chains, seed)
        chain_inits = self.chain_inits(inits, settings.chains, prepared.scaling)
        fit = Fit(self, self.nuts_draws(prepared.stan_data, settings, chain_inits), prepared, settings)
        fit.warn_if_not_converged()
        return fit

    def variational(self: _ModelHooks, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                    weights=None, family: str = "meanfield", method: str = "robust-stan", draws: int = 1000,
                    seed: int | None = None, show_progress: bool = True, inits: Mapping | None = None,
                    cluster: Cluster | None = None, iter: int | None = None, grad_samples: int | None = None,
                    elbo_samples: int | None = None, eta: float | None = None, tol_rel_obj: float | None = None,
                    eval_elbo: int | None = None, batch_size: int | None = None, init_radius: float | None = None,
                    init_sd: float | None = None, warm_start: GaussianQ | None = None, oracle: str | None = None,
                    stan_options: Mapping | None = None):
        """Variational approximation of the generalized posterior.

        The default, robust-stan's own driver, fits a Gaussian q on the unconstrained scale by Adam on
        reparameterisation gradients, on either engine (the robust VI of Futami, Sato and Sugiyama
        2018, arXiv:1710.06595). ``method="advi"``, ``"pathfinder"`` and ``"laplace"`` run Stan's
        own algorithms on the same program through CmdStanPy (CmdStan engine only); ADVI that stops
        at its iteration limit warns instead of raising (``stan_options={"require_converged": True}`` raises).

        Parameters
        ----------
        data, divergence, learning_rate, weights
            As for the model's ``prepare``. Rows held in partitions (a built-in model's only: Dask
            arrays split into row chunks, Dask DataFrames or Series, or lists of ``.npy`` or ``.parquet``
            paths; ``standardize=False``, robust-stan's driver, no ``weights``) have each step's data
            term computed where they live and only its sum travels.
        family : {"meanfield", "fullrank"}, default "meanfield"
            The Gaussian q's covariance: diagonal or full.
        method : {"robust-stan", "advi", "pathfinder", "laplace"}, default "robust-stan"
            The algorithm (see above).
        draws : int, default 1000
            Draws from q kept in the fit.
        seed : int or None, default None
            Seed of the run; None draws fresh entropy (not reproducible).
        show_progress : bool, default True
            Show a progress bar.
        inits : mapping or None, default None
            Parameter values by name (any subset for Stan's methods) where the optimisation starts;
            None: q's mean uniform on (-init_radius, init_radius).
        cluster : Cluster or None, default None
            Workers for rows held in partitions; None computes here.
        iter : int or None, default None
            Iterations at most (robust-stan's driver: 10000; ADVI: CmdStan's default).
        grad_samples : int or None, default None
            Draws from q per gradient step (robust-stan's driver: 5).
        elbo_samples : int or None, default None
            Draws per ELBO estimate (robust-stan's driver: 100).
        eta : float or None, default None
            The step size (robust-stan's driver: 0.05, Adam's step decayed as eta / sqrt(1 + t / eval_elbo)).
        tol_rel_obj : float or None, default None
            Stop when the ELBO changes by less than this relative amount twice in a row (robust-stan's
            driver: 1e-5).
        eval_elbo : int or None, default None
            Steps between ELBO evaluations (robust-stan's driver: 100).
        batch_size : int or None, default None
            robust-stan's driver: rows per step; None is every row (a built-in model's rows only).
        init_radius : float or None, default None
            robust-stan's driver: q's starting mean is uniform on (-init_radius, init_radius) (2).
        init_sd : float or None, default None
            robust-stan's driver: q's starting sd (1).
        warm_start : GaussianQ or None, default None
            robust-stan's driver: start from a previous fit's ``q``.
        oracle : {"auto", "bridgestan", "httpstan"} or None, default None
            robust-stan's driver: the engine of the gradients ("auto").
        stan_options : mapping or None, default None
            Stan's methods: further arguments of CmdStanPy's method of that name.

        Returns
        -------
        VariationalFit or StanMethodFit
            A fit with draws from q (robust-stan's driver: also ``q``, ``elbo`` and its trace), or
            from Stan's method; with rows in partitions, a fit without per-observation quantities.

        Raises
        ------
        RobustStanInputError
            If the family, the method or an option's value is invalid, or the method needs another
        engine.
        """
        options = VariationalOptions(iter, grad_samples, elbo_samples, eta, tol_rel_obj, eval_elbo, batch_size,
                                     init_radius, init_sd, warm_start, oracle, stan_options)
        if is_partitioned(data):
            return self.variational_on_partitions(data, divergence, learning_rate, weights, family, method, draws,
                                                  seed, show_progress, inits, cluster, options.for_method(method))
        refuse_cluster_for_rows_here(cluster, "variational inference")
        return self.variational_prepared(self.prepare(data, divergence, learning_rate, weights), family=family,
                                         method=method, draws=draws, seed=seed, show_progress=show_progress,
                                         inits=inits, options=options)

    def variational_prepared(self: _ModelHooks, prepared: PreparedData, family: str = "meanfield",
                             method: str = "robust-stan", draws: int = 1000, seed: int | None = None,
                             show_progress: bool = True, inits: Mapping | None = None,
                             options: VariationalOptions | None = None) -> VariationalFit | StanMethodFit:
        """:meth:`variational` on data already prepared (a coreset's weighted rows, say).

        Parameters
        ----------
        prepared : PreparedData
            From :meth:`prepare` or a variant of it.
        family, method, draws, seed, show_progress, inits
            As for :meth:`variational`.
        options : VariationalOptions or None, default None
            :meth:`variational`'s further options; None leaves each at the method's default.

        Returns
        -------
        VariationalFit or StanMethodFit
            As for :meth:`variational`.
        """
        given = (options or VariationalOptions()).for_method(method)
        if method == "robust-stan":
            start = None if inits is None else self.unconstrain_init(inits, prepared.stan_data, prepared.scaling)
            out = fit_variational(self, prepared.stan_data, family=family, draws=draws,  # type: ignore[arg-type]
                                  seed=seed, start=start, show_progress=show_progress, **given)
            return VariationalFit(self, out.raw, prepared, out.settings, q=out.q, elbo=out.elbo,
                                  elbo_se=out.elbo_se, elbo_trace=out.elbo_trace)
        chain_inits = None if inits is None else self.chain_inits(inits, 1, prepared.scaling)
        raw, settings = run_stan_method(self, method, prepared.stan_data, family=family,  # type: ignore[arg-type]
                                        draws=draws, seed=seed, show_progress=show_progress,
                                        init=None if chain_inits is None else chain_inits[0], **given)
        return StanMethodFit(self, raw, prepared, settings)
