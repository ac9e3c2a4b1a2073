"""The Model: one generated Stan program, compiled once, used by every method."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .codegen import render_program
from .data import Scaling, prepare_data, to_fitted_scale, to_original_scale  # noqa: F401 (old import path)
from .divergences import Divergence, as_divergence
from .engines import CompiledProgram, NutsSettings, compile_program, resolve_engine
from .errors import RobustStanInputError, require_count, require_seed
from .spec import ModelSpec, ParameterDeclaration

# Number of trailing dimensions that belong to one element of each base type.
_ELEMENT_NDIM = {"real": 0, "row_vector": 1, "matrix": 2, "column_stochastic_matrix": 2,
                 "row_stochastic_matrix": 2, "cholesky_factor_corr": 2, "corr_matrix": 2,
                 "cov_matrix": 2, "cholesky_factor_cov": 2}


def _unconstrained_element_size(base: str, dims: tuple[int, ...]) -> int:
    """Size of one element of a parameter type on Stan's unconstrained scale."""
    if base in ("simplex", "sum_to_zero_vector"):
        return dims[0] - 1
    if base in ("cholesky_factor_corr", "corr_matrix"):
        return dims[0] * (dims[0] - 1) // 2
    if base == "cov_matrix":
        return dims[0] + dims[0] * (dims[0] - 1) // 2
    if base == "cholesky_factor_cov":
        m, n = dims
        return n * (n + 1) // 2 + (m - n) * n
    if base == "column_stochastic_matrix":
        return (dims[0] - 1) * dims[1]
    if base == "row_stochastic_matrix":
        return dims[0] * (dims[1] - 1)
    return int(np.prod(dims)) if dims else 1


class Model:
    """A robust-stan model: its Stan program, and methods that compile it once and reuse it.

    Build one with :func:`robust_stan.location`, :func:`robust_stan.glm` or
    :func:`robust_stan.custom`. ``stan_code`` is the readable program. The
    divergence, learning rate, weights and mode are data, so every call below
    reuses one compiled program.
    """

    def __init__(self, spec: ModelSpec, engine: str = "auto", kind: str = "custom"):
        self.spec = spec
        self.kind = kind
        self.stan_code = render_program(spec)
        self._engine_request = engine
        resolve_engine(engine)  # an unknown engine name fails here, not at the first fit
        self._program: CompiledProgram | None = None
        if kind == "custom":
            from .stanc import check_program

            check_program(self.stan_code, spec)

    def __repr__(self) -> str:
        return f"<robust_stan.Model {self.spec.title!r}, parameters {self.spec.parameter_names}>"

    # -- compilation ------------------------------------------------------------
    @property
    def engine(self) -> str:
        """Name of the engine this model runs on ('cmdstan' or 'httpstan')."""
        return self._program.engine_name if self._program else resolve_engine(self._engine_request)

    def compile(self, show_progress: bool = True) -> CompiledProgram:
        """Compile the program (once; later calls and later processes reuse the build)."""
        if self._program is None:
            self._program = compile_program(self.stan_code, self._engine_request, show_progress=show_progress)
        return self._program

    # -- data -------------------------------------------------------------------
    def stan_data(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                  weights=None, mode: str = "posterior", batch=None) -> dict:
        """The Stan data dict for this program: checked data plus the robust-stan switches.

        ``mode`` is "posterior", "per_example" (with optional ``batch`` of 0-based
        rows) or "prior". Continuous outcomes of built-in models come back
        standardised (see :func:`robust_stan.glm`).
        """
        return prepare_data(self.spec, data, divergence, learning_rate, weights, mode, batch)[0]

    # -- densities ----------------------------------------------------------------
    def log_density(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                    learning_rate: float = 1.0, weights=None, mode: str = "posterior", batch=None,
                    jacobian: bool = True) -> float:
        """Log density of the generalized posterior at an unconstrained point.

        Constants of the prior's ``~`` statements are dropped (as in Stan's
        own log_prob); the loss terms are exact.
        """
        stan_data = self.stan_data(data, divergence, learning_rate, weights, mode, batch)
        theta = self._check_theta(stan_data, theta_unconstrained)
        return self.compile().log_density(stan_data, theta, jacobian)

    def log_density_gradient(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                             learning_rate: float = 1.0, weights=None, mode: str = "posterior", batch=None,
                             jacobian: bool = True) -> tuple[float, np.ndarray]:
        """Log density and its gradient with respect to the unconstrained parameters."""
        stan_data = self.stan_data(data, divergence, learning_rate, weights, mode, batch)
        theta = self._check_theta(stan_data, theta_unconstrained)
        return self.compile().log_density_gradient(stan_data, theta, jacobian)

    def _parameter_layout(self, stan_data: dict) -> list[tuple[ParameterDeclaration, int, int]]:
        """(declaration, copies, unconstrained size of one copy) per parameter."""
        dims = self.compile().variable_shapes(stan_data)
        layout = []
        for p in self.spec.parameters:
            shape = dims[f"{p.name}_copies"]
            ndim = 0 if p.base == "real" else _ELEMENT_NDIM.get(p.base, 1)
            element = shape[len(shape) - ndim:] if ndim else ()
            per_copy_elements = int(np.prod(shape[1:len(shape) - ndim])) if len(shape) - ndim > 1 else 1
            layout.append((p, shape[0], per_copy_elements * _unconstrained_element_size(p.base, tuple(element))))
        return layout

    def unconstrained_dimension(self, data: Mapping, mode: str = "posterior", batch=None) -> int:
        """Number of unconstrained parameters of the program for these data and mode."""
        stan_data = self.stan_data(data, mode=mode, batch=batch)
        return sum(copies * size for _, copies, size in self._parameter_layout(stan_data))

    def _check_theta(self, stan_data: dict, theta) -> np.ndarray:
        theta = np.asarray(theta, dtype=float).ravel()
        expected = sum(copies * size for _, copies, size in self._parameter_layout(stan_data))
        if theta.shape != (expected,):
            raise RobustStanInputError(f"theta_unconstrained: expected {expected} values, got {theta.size}")
        if not np.all(np.isfinite(theta)):
            raise RobustStanInputError("theta_unconstrained: contains non-finite values")
        return theta

    def per_example_gradients(self, data: Mapping, theta_unconstrained, divergence: Divergence | None = None,
                              batch=None, oracle: str = "auto", strategy: str = "auto") -> np.ndarray:
        """Gradients of each observation's loss l_i at a shared unconstrained point.

        Returns an array (rows in ``batch``, d), row i = grad l_i(theta), from one
        gradient call of the program's per-example mode (DESIGN.md section 3).
        The prior, weights and learning rate are not included. For repeated
        calls on the same data use :meth:`per_example` (prepares the data once).
        ``strategy``: "copies" (any model), "linear_predictor" (built-in glms of
        the normal, bernoulli, binomial, poisson and exponential families;
        measured 2.2 to 2.5 full gradients, against 12 to 24 for copies) or "auto",
        the faster one available.
        """
        return self.per_example(data, divergence, oracle, strategy).gradients(theta_unconstrained, batch)

    def per_example(self, data: Mapping, divergence: Divergence | None = None, oracle: str = "auto",
                    strategy: str = "auto"):
        """A reusable :class:`~robust_stan.per_example.PerExampleGradients` for these data."""
        from .per_example import PerExampleGradients

        return PerExampleGradients(self, data, divergence, oracle, strategy)

    def oracle(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
               weights=None, mode: str = "posterior", oracle: str = "auto"):
        """A :class:`~robust_stan.oracles.GradientOracle` for the program with these data fixed."""
        return self.oracle_for(self.stan_data(data, divergence, learning_rate, weights, mode), oracle)

    def oracle_for(self, stan_data: dict, oracle: str = "auto"):
        """A gradient oracle for already prepared Stan data (see :meth:`stan_data`)."""
        from .oracles import make_oracle

        dimension = sum(copies * size for _, copies, size in self._parameter_layout(stan_data))
        return make_oracle(self.stan_code, stan_data, dimension, oracle)

    def unconstrain_init(self, init: Mapping, stan_data: dict, scaling: Scaling) -> np.ndarray:
        """A dict of every parameter's value (original scale) as an unconstrained vector."""
        missing = sorted(set(self.spec.parameter_names) - set(init))
        if missing:
            raise RobustStanInputError(f"init: give a value for every parameter; missing {missing}")
        values = self._chain_inits(init, 1, scaling)[0]
        return self.oracle_for(stan_data).unconstrain(values)

    # -- NUTS ---------------------------------------------------------------------
    def sample(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
               weights=None, chains: int = 4, iter_warmup: int = 1000, iter_sampling: int = 1000,
               thin: int = 1, seed: int | None = None, inits: dict | list[dict] | None = None,
               adapt_delta: float = 0.8, max_treedepth: int = 10, show_progress: bool = True):
        """Sample the generalized posterior with Stan's NUTS; returns a :class:`~robust_stan.fit.Fit`.

        Arguments are CmdStanPy's. ``inits`` gives constrained starting values
        by parameter name (one dict for all chains, or one per chain); with
        outliers the robust posterior can be multimodal, so starting from the
        ordinary (KL) fit's means is a good habit.
        """
        from .fit import Fit

        divergence = as_divergence(divergence)
        stan_data, scaling = prepare_data(self.spec, data, divergence, learning_rate, weights)
        settings = _nuts_settings(chains, iter_warmup, iter_sampling, thin, seed, adapt_delta, max_treedepth,
                                  show_progress)
        chain_inits = self._chain_inits(inits, settings.chains, scaling)
        program = self.compile(show_progress=show_progress)
        raw = program.sample(stan_data, settings, chain_inits)
        fit = Fit(self, raw, data=data, stan_data=stan_data, scaling=scaling, divergence=divergence,
                  learning_rate=stan_data["learning_rate"], settings=settings)
        fit.warn_if_not_converged()
        return fit

    # -- variational inference ----------------------------------------------------
    def variational(self, data: Mapping, divergence: Divergence | None = None, learning_rate: float = 1.0,
                    weights=None, family: str = "meanfield", method: str = "robust-stan", draws: int = 1000,
                    seed: int | None = None, show_progress: bool = True, **options):
        """Variational approximation of the generalized posterior; returns a fit with draws from q.

        ``method="robust-stan"`` (default) runs this library's driver
        (:mod:`robust_stan.variational`) on either engine: a Gaussian q on the
        unconstrained scale, ``family`` "meanfield" or "fullrank", fitted by Adam on
        reparameterisation gradients. Its options, with CmdStanPy's names where they
        exist: ``grad_samples=5`` draws per step, ``elbo_samples=100``, ``eta=0.05``
        (Adam's step size, decayed as eta / sqrt(1 + t / eval_elbo)), ``iter=10000``,
        ``tol_rel_obj=1e-5`` (stop when the ELBO, evaluated every ``eval_elbo=100``
        steps at fixed draws on the average of the last eval_elbo iterates, changes by
        less than this relative amount twice in a row; CmdStan's 0.01 stops far too
        early for the variances), ``batch_size`` (rows per step; None = all),
        ``init`` (a dict of parameter values; by default q's mean starts uniform on
        (-init_radius, init_radius), ``init_radius=2`` as in Stan), ``init_sd=1``
        (q's starting sd; small values suit neural networks), ``warm_start`` (a
        previous fit's ``q`` to start from) and ``oracle``.

        ``method="advi"``, ``"pathfinder"`` and ``"laplace"`` run Stan's own
        algorithms on the same program through CmdStanPy (CmdStan engine only);
        ``options`` then go to CmdStanPy's method of that name.
        """
        from .variational import variational

        if method == "robust-stan":
            return variational(self, data, divergence, learning_rate, weights, family=family, draws=draws,
                               seed=seed, show_progress=show_progress, **options)
        from .stan_methods import run_stan_method

        return run_stan_method(self, method, data, divergence, learning_rate, weights, family=family, draws=draws,
                               seed=seed, show_progress=show_progress, **options)

    def _chain_inits(self, inits, chains: int, scaling: Scaling) -> list[dict] | None:
        if inits is None:
            return None
        per_chain = [inits] * chains if isinstance(inits, Mapping) else list(inits)
        if len(per_chain) != chains or not all(isinstance(i, Mapping) for i in per_chain):
            raise RobustStanInputError(f"inits: give one dict, or a list of {chains} dicts (one per chain)")
        out = []
        for init in per_chain:
            unknown = sorted(set(init) - set(self.spec.parameter_names))
            if unknown:
                raise RobustStanInputError(f"inits: unknown parameter(s) {unknown}; the model has {self.spec.parameter_names}")
            for name, value in init.items():
                try:
                    finite = np.all(np.isfinite(np.asarray(value, dtype=float)))
                except (TypeError, ValueError):
                    finite = False
                if not finite:
                    raise RobustStanInputError(f"inits: {name} must be finite numbers, got {value!r}")
            out.append({f"{k}_copies": np.asarray([to_fitted_scale(self.spec.rescale.get(k), v, scaling)])
                        for k, v in init.items()})
        return out


def _nuts_settings(chains, iter_warmup, iter_sampling, thin, seed, adapt_delta, max_treedepth, show_progress):
    for name, value, low in (("chains", chains, 1), ("iter_warmup", iter_warmup, 0),
                             ("iter_sampling", iter_sampling, 1), ("thin", thin, 1), ("max_treedepth", max_treedepth, 1)):
        require_count(name, value, low)
    if not 0 < float(adapt_delta) < 1:
        raise RobustStanInputError(f"adapt_delta: must lie in (0, 1), got {adapt_delta}")
    seed = require_seed(seed)
    if seed is None:
        seed = int(np.random.default_rng().integers(0, 2**31 - 1))
    return NutsSettings(int(chains), int(iter_warmup), int(iter_sampling), int(thin), int(seed),
                        float(adapt_delta), int(max_treedepth), bool(show_progress))
