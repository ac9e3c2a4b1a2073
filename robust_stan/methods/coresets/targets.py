"""What beta-Cores asks of a model: draws from a weighted posterior, and the gains of rows at them.

A target serves one program and its data: :class:`CoresetTarget` a built-in model's
program (the data cut to the chosen rows), :class:`ProgramCoresetTarget` a robustified
program of yours (all rows kept, the outcome's weights 0 off the coreset); both share
:class:`CoresetTargetBase`. Its units are rows, or groups of rows (``unit_rows``): a
unit's gain is the sum of its rows' gains and a unit's weight applies to each of its rows.

- :meth:`CoresetTarget.draw` returns draws of the weighted posterior
  pi_w(theta) propto prior(theta) exp(-learning_rate sum_n w_n l_n(theta)),
  restricted to the units with a weight (the prior when there are none), with
  the ``inner`` loss (the beta loss, or the classical -log p). Samplers:
  ``"laplace"`` (:mod:`robust_stan.methods.laplace` on the weighted program),
  ``"nuts"`` (the engine's NUTS, one chain) and ``"exact"`` (the conjugate
  posterior of a multivariate normal mean with known covariance and an
  independent normal prior, classical inner loss only).
- :meth:`CoresetTarget.gains` returns, for many units at S draws, the beta gain
  f_n = -learning_rate l_n and the classical gain learning_rate log p_n, from
  one engine call: the program's standalone generated quantities (its
  pointwise ``robust_loss`` and ``log_lik``) on the data restricted to those
  rows, for the S draws as one chain.

Cost model (the docstring of :func:`robust_stan.coreset` repeats it): one
gains call on R rows at S draws costs S x (one write_array of the program on R
rows), about S x R pointwise log densities plus S constrain calls; one Laplace
draw costs an L-BFGS run and 2 d gradient calls of the program on the coreset
rows only (M rows, not N), plus S constrain calls.
"""

from __future__ import annotations

import re

import numpy as np

from ...building.data import Pointwise, slice_rows, with_switches
from ...building.divergences import KL, Divergence
from ...building.robustify import divergence_switches
from ...common.errors import RobustStanInputError
from ...engines import NutsSettings, RawDraws
from ...engines.base import parameter_columns
from ...gradients.oracles import constrained_draws
from ...gradients.program import GeneratedProgram
from ..laplace import LaplaceApproximation, laplace_approximation
from ..nuts import run_nuts
from .construction import UnitGains

INNER = ("beta", "classical")
SAMPLERS = ("laplace", "nuts", "exact")


class CoresetTargetBase:
    """What beta-Cores needs of a model, whatever restricts it to weighted rows: draws of pi_w
    (Laplace or NUTS through the program's own oracle and engine) and the gains of units.

    Subclasses say how pi_w's Stan data are made (:meth:`posterior_data`) and how each row's
    robust loss and log-likelihood come out of the program (:meth:`row_losses`)."""

    def __init__(self, program, divergence: Divergence, inner: str, sampler: str, n_rows: int,
                 learning_rate: float, parameter_names: list[str], unit_rows: list[np.ndarray] | None = None,
                 nuts_warmup: int = 300):
        self.program = program
        self.divergence = divergence
        self.inner = inner
        self.inner_divergence = divergence if inner == "beta" else KL()
        self.sampler = sampler
        self.learning_rate = float(learning_rate)
        self.n_rows = int(n_rows)
        self.unit_rows = unit_rows  # None: every row is a unit
        self.n_units = len(unit_rows) if unit_rows is not None else self.n_rows
        self.nuts_warmup = nuts_warmup
        self._parameter_names = parameter_names
        self._compiled = program.compile(show_progress=False)
        self._last_mode: np.ndarray | None = None
        self._last_laplace: tuple[tuple, LaplaceApproximation] | None = None

    # -- what a subclass provides -------------------------------------------------------
    def posterior_data(self, units, weights) -> dict:
        """Stan data of the weighted posterior on the rows of ``units`` (the prior if no weight is positive)."""
        raise NotImplementedError

    def row_losses(self, rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(robust loss, log p), each (S, len(rows)): every row's at each constrained draw."""
        raise NotImplementedError

    def sample_nuts(self, data: dict, settings: NutsSettings) -> RawDraws:
        """One NUTS chain of the program.

        Parameters
        ----------
        data : dict
            Stan data.
        settings : NutsSettings
            Iterations and seed.

        Returns
        -------
        RawDraws
            The draws.
        """
        return self._compiled.sample(data, settings, None)

    # -- the rows of a set of units ------------------------------------------------
    def rows_of(self, units: np.ndarray, weights: np.ndarray | None = None):
        """The rows of ``units`` in order.

        Parameters
        ----------
        units : numpy.ndarray
            The units.
        weights : numpy.ndarray or None, default None
            Their weights, to give each row its unit's.

        Returns
        -------
        numpy.ndarray or tuple of numpy.ndarray
            The rows, or (rows, row weights) when ``weights`` is given.
        """
        units = np.asarray(units, dtype=int)
        if self.unit_rows is None:
            return units if weights is None else (units, np.asarray(weights, dtype=float))
        rows = np.concatenate([self.unit_rows[u] for u in units]) if units.size else np.zeros(0, dtype=int)
        if weights is None:
            return rows
        return rows, np.repeat(np.asarray(weights, dtype=float), [self.unit_rows[u].size for u in units])

    # -- draws --------------------------------------------------------------------
    def draw(self, units, weights, count: int, rng: np.random.Generator) -> np.ndarray:
        """Draws of the weighted posterior pi_w.

        Parameters
        ----------
        units : array_like of int
            The coreset units.
        weights : array_like
            Their weights.
        count : int
            Number of draws.
        rng : numpy.random.Generator
            Source of randomness.

        Returns
        -------
        numpy.ndarray
            (count, k) constrained parameter columns, Stan's order.
        """
        data = self.posterior_data(units, weights)
        if self.sampler == "nuts":
            settings = NutsSettings(chains=1, iter_warmup=self.nuts_warmup, iter_sampling=count,
                                    seed=int(rng.integers(1, 2**31 - 1)), show_progress=False)
            return parameter_columns(self.sample_nuts(data, settings).variables, self._parameter_names)[0]
        approx = self.laplace(units, weights, data)
        return self.constrained(approx.draws(count, rng), data)

    def laplace(self, units, weights, data: dict | None = None) -> LaplaceApproximation:
        """The Laplace approximation of pi_w (kept for the last units and weights asked).

        Parameters
        ----------
        units, weights
            As for :meth:`draw`.
        data : dict or None, default None
            Stan data of pi_w; None builds them.

        Returns
        -------
        LaplaceApproximation
            The Gaussian at the mode.
        """
        key = (tuple(np.asarray(units, dtype=int)), tuple(np.asarray(weights, dtype=float)))
        if self._last_laplace is not None and self._last_laplace[0] == key:
            return self._last_laplace[1]
        data = data if data is not None else self.posterior_data(units, weights)
        oracle = self.program.oracle_for(data)
        init = self._last_mode if self._last_mode is not None else np.zeros(oracle.dimension)
        approx = laplace_approximation(oracle.log_density_gradient, init)
        self._last_mode = approx.mode
        self._last_laplace = (key, approx)
        return approx

    def constrained(self, thetas: np.ndarray, data: dict) -> np.ndarray:
        """Unconstrained draws as constrained parameter columns.

        Parameters
        ----------
        thetas : numpy.ndarray
            (count, d).
        data : dict
            Stan data.

        Returns
        -------
        numpy.ndarray
            (count, k), Stan's order.
        """
        variables = constrained_draws(self.program.oracle_for(data), thetas[None])
        return parameter_columns(variables, self._parameter_names)[0]

    def log_normaliser(self, units, weights) -> float:
        """log Z_w of the program's density for pi_w (Laplace estimate), up to a constant free of w.

        Parameters
        ----------
        units, weights
            The units and weights that define pi_w.

        Returns
        -------
        float
            The estimate.
        """
        return self.laplace(units, weights).log_normaliser

    # -- gains ----------------------------------------------------------------------
    def gains(self, units, columns: np.ndarray) -> dict[str, np.ndarray]:
        """Every unit's gain at each draw (a unit's rows summed), from one generated-quantities call.

        Parameters
        ----------
        units : array_like of int
            The units.
        columns : numpy.ndarray
            (S, k) constrained draws.

        Returns
        -------
        dict of numpy.ndarray
            {"beta": f, "classical": f}, each (S, len(units)).
        """
        units = np.asarray(units, dtype=int)
        robust_loss, log_lik = self.row_losses(self.rows_of(units), np.asarray(columns, dtype=float))
        per_row = {"beta": -self.learning_rate * robust_loss, "classical": self.learning_rate * log_lik}
        if self.unit_rows is None:
            return per_row
        sizes = np.array([self.unit_rows[u].size for u in units])
        if np.all(sizes == 1):
            return per_row
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        return {kind: np.add.reduceat(values, starts, axis=1) for kind, values in per_row.items()}

    def unit_gains(self, support, batch, columns: np.ndarray) -> UnitGains:
        """The gains of the coreset units and of a uniform batch at the draws.

        Parameters
        ----------
        support : array_like of int
            The coreset units.
        batch : array_like of int
            The batch units.
        columns : numpy.ndarray
            (S, k) constrained draws.

        Returns
        -------
        UnitGains
            The gains and their reductions.
        """
        return UnitGains(self.gains(np.concatenate([support, batch]), columns), len(support))

    def exact_kl(self, units, weights) -> float | None:
        """KL(pi_w || pi_1) in closed form where the target knows it.

        Parameters
        ----------
        units, weights
            pi_w's units and their weights (as for :meth:`draw`).

        Returns
        -------
        float or None
            The KL, or None where there is no closed form.
        """
        return None


class CoresetTarget(CoresetTargetBase):
    """Weighted posteriors and gains of a built-in model's program, on the chosen rows only (the
    data sliced to them).

    Parameters
    ----------
    program : GeneratedProgram
        The built-in model's program.
    stan_data : dict
        Its prepared posterior-mode Stan data.
    divergence : Divergence
        The robust loss of the gains ``"beta"``.
    inner : {"beta", "classical"}
        The loss of the weighted posterior drawn from: that divergence, or KL.
    sampler : {"laplace", "nuts", "exact"}
        How the weighted posterior is drawn from ("exact": the known-covariance normal's conjugate
        classical posterior).
    unit_rows : list of numpy.ndarray or None, default None
        The rows of each unit when units are groups; None: one unit per row.
    nuts_warmup : int, default 300
        Warmup iterations of ``sampler="nuts"``.
    """

    def __init__(self, program: GeneratedProgram, stan_data: dict, divergence: Divergence, inner: str,
                 sampler: str, unit_rows: list[np.ndarray] | None = None, nuts_warmup: int = 300):
        super().__init__(program, divergence, inner, sampler, int(stan_data["N"]), float(stan_data["learning_rate"]),
                         [f"{p.name}_copies" for p in program.spec.parameters], unit_rows, nuts_warmup)
        self.spec = program.spec
        self.stan_data = with_switches(stan_data, pointwise=False, divergence=divergence)
        self.exact = ExactGaussianMean.for_program(self.spec, stan_data) if sampler == "exact" else None
        if sampler == "exact" and inner != "classical":
            raise RobustStanInputError("sampler: 'exact' draws from the conjugate classical posterior; "
                                       "use inner='classical' with it (the beta posterior has no closed form)")

    def posterior_data(self, units, weights) -> dict:
        """Stan data of the weighted posterior: the data cut to the rows of ``units``.

        Parameters
        ----------
        units : array_like of int
            The coreset units, whose rows get weights.
        weights : array_like
            Their weights.

        Returns
        -------
        dict
            Stan data (the prior alone if no weight is positive).
        """
        units, weights = np.asarray(units, dtype=int), np.asarray(weights, dtype=float)
        keep = weights > 0
        if not keep.any():
            return with_switches(slice_rows(self.spec, self.stan_data, np.array([0])), mode="prior")
        rows, row_weights = self.rows_of(units[keep], weights[keep])
        return with_switches(slice_rows(self.spec, self.stan_data, rows), weights=row_weights,
                             divergence=self.inner_divergence)

    def draw(self, units, weights, count: int, rng: np.random.Generator) -> np.ndarray:
        if self.sampler != "exact":
            return super().draw(units, weights, count, rng)
        rows, row_weights = self.rows_of(np.asarray(units, dtype=int), weights)
        assert self.exact is not None  # sampler "exact"
        mean, cov = self.exact.posterior(rows, row_weights)
        return rng.multivariate_normal(mean, cov, size=count, method="cholesky")

    def sample_nuts(self, data: dict, settings: NutsSettings) -> RawDraws:
        return run_nuts(self.program, data, settings, None)

    def row_losses(self, rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row's robust loss and log density at each draw.

        Parameters
        ----------
        rows : numpy.ndarray
            0-based rows.
        columns : numpy.ndarray
            (S, k) draws of the program's ``*_copies`` parameters.

        Returns
        -------
        robust_loss : numpy.ndarray
            (S, len(rows)).
        log_p : numpy.ndarray
            (S, len(rows)).
        """
        data = with_switches(slice_rows(self.spec, self.stan_data, rows), pointwise=True)
        computed = self._compiled.generated_quantities(data, columns[None], seed=1)
        return computed["robust_loss"][0], computed["log_lik"][0]

    def exact_kl(self, units, weights) -> float | None:
        """KL(pi_w || pi_1) in closed form (classical posteriors), for the exact sampler.

        Parameters
        ----------
        units, weights
            pi_w's units and their weights.

        Returns
        -------
        float or None
            The KL; None for the other samplers.
        """
        if self.exact is None:
            return None
        rows, row_weights = self.rows_of(np.asarray(units, dtype=int), weights)
        return self.exact.kl(rows, row_weights, np.arange(self.n_rows), np.ones(self.n_rows))


class ProgramCoresetTarget(CoresetTargetBase):
    """Weighted posteriors and gains of a robustified Stan program (``rs.robustify``, one outcome).

    Your program's rows cannot be cut out safely (its transformed data may use every row), so the
    weights do the restricting: pi_w is the program on all its data with the outcome's weight
    vector w (0 off the coreset; every weight 0 leaves the prior), and the gains come from its
    ``rs_robust_loss_<y>`` and ``rs_log_lik_<y>`` generated quantities. Each draw and each gains
    call therefore costs O(N) rows, not O(M).

    Parameters
    ----------
    program : StanProgramModel
        The robustified program.
    stan_data : dict
        Its Stan data.
    divergence : Divergence
        The divergence of the coreset's target.
    inner : {"beta", "classical"}
        The loss of pi_w.
    sampler : {"laplace", "nuts"}
        How pi_w is drawn from.
    unit_rows : list of numpy.ndarray or None, default None
        The rows of each unit when units are groups; None: one unit per row.
    nuts_warmup : int, default 300
        Warmup iterations of ``sampler="nuts"``.

    Raises
    ------
    RobustStanInputError
        For ``sampler="exact"``, which only the built-in known-covariance normal has.
    """

    def __init__(self, program, stan_data: dict, divergence: Divergence, inner: str, sampler: str,
                 unit_rows: list[np.ndarray] | None = None, nuts_warmup: int = 300):
        if sampler == "exact":
            raise RobustStanInputError("sampler: 'exact' is for rs.location('multi_normal', covariance='known'); "
                                       "use 'laplace' or 'nuts' with your own program")
        (self.outcome,) = program.outcomes
        n_rows = len(stan_data[f"rs_weights_{self.outcome}"])
        super().__init__(program, divergence, inner, sampler, n_rows, float(stan_data["rs_learning_rate"]),
                         list(program.parameter_names), unit_rows, nuts_warmup)
        self.stan_data = dict(stan_data, rs_pointwise=int(Pointwise.OFF))

    def _with(self, divergence: Divergence, weights: np.ndarray, pointwise: Pointwise) -> dict:
        return dict(self.stan_data, **divergence_switches(divergence), rs_pointwise=int(pointwise),
                    **{f"rs_weights_{self.outcome}": weights})

    def posterior_data(self, units, weights) -> dict:
        """Stan data of the weighted posterior on the rows of ``units``.

        Parameters
        ----------
        units : array_like of int
            The coreset units, whose rows get weights.
        weights : array_like
            Their weights (every other row gets 0).

        Returns
        -------
        dict
            Stan data (the prior alone if no weight is positive).
        """
        units, weights = np.asarray(units, dtype=int), np.asarray(weights, dtype=float)
        row_weights = np.zeros(self.n_rows)
        if units.size:
            rows, on_rows = self.rows_of(units, weights)
            row_weights[rows] = on_rows
        return self._with(self.inner_divergence, row_weights, pointwise=Pointwise.OFF)

    def row_losses(self, rows: np.ndarray, columns: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every row's robust loss and log density at each constrained draw.

        Parameters
        ----------
        rows : numpy.ndarray
            0-based rows.
        columns : numpy.ndarray
            (S, k) constrained draws.

        Returns
        -------
        robust_loss : numpy.ndarray
            (S, len(rows)).
        log_p : numpy.ndarray
            (S, len(rows)).
        """
        data = self._with(self.divergence, np.ones(self.n_rows), pointwise=Pointwise.ON)
        computed = self._compiled.generated_quantities(data, columns[None], seed=1)
        return (computed[f"rs_robust_loss_{self.outcome}"][0][:, rows],
                computed[f"rs_log_lik_{self.outcome}"][0][:, rows])


_NORMAL_PRIOR = re.compile(r"^\s*mu\s*~\s*normal\(\s*([-+0-9.eE]+)\s*,\s*([-+0-9.eE]+)\s*\)\s*;\s*$")


class ExactGaussianMean:
    """The conjugate posterior of ``rs.location("multi_normal", covariance="known",
    priors={"mu": "normal(m0, s0)"})``: y_n ~ N(mu, Sigma), mu_j ~ N(m0, s0^2) independently.
    With row weights w, precision P_w = I / s0^2 + (sum w) Sigma^-1 and mean
    P_w^-1 (m0 / s0^2 + Sigma^-1 sum_n w_n y_n)."""

    def __init__(self, y: np.ndarray, sigma: np.ndarray, prior_mean: float, prior_sd: float):
        self.y = np.asarray(y, dtype=float)
        self.sigma_inverse = np.linalg.inv(np.asarray(sigma, dtype=float))
        self.prior_mean, self.prior_sd = float(prior_mean), float(prior_sd)

    @classmethod
    def for_program(cls, spec, stan_data: dict) -> ExactGaussianMean:
        found = _NORMAL_PRIOR.match(spec.priors.strip())
        if spec.family.name != "multi_normal" or "Sigma" not in stan_data or found is None:
            raise RobustStanInputError(
                "sampler: 'exact' needs rs.location('multi_normal', covariance='known', "
                "priors={'mu': 'normal(m0, s0)'}) (a conjugate model); use 'laplace' or 'nuts'")
        return cls(stan_data["y"], stan_data["Sigma"], float(found.group(1)), float(found.group(2)))

    def posterior(self, rows: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and covariance of the weighted posterior of mu."""
        d = self.y.shape[1]
        precision = np.eye(d) / self.prior_sd**2 + float(np.sum(weights)) * self.sigma_inverse
        weighted_sum = weights @ self.y[rows] if len(rows) else np.zeros(d)
        covariance = np.linalg.inv(precision)
        mean = covariance @ (np.full(d, self.prior_mean / self.prior_sd**2) + self.sigma_inverse @ weighted_sum)
        return mean, 0.5 * (covariance + covariance.T)

    def kl(self, rows, weights, other_rows, other_weights) -> float:
        """KL(posterior(rows, weights) || posterior(other_rows, other_weights)), Gaussian closed form."""
        m0, c0 = self.posterior(rows, weights)
        m1, c1 = self.posterior(other_rows, other_weights)
        return gaussian_kl(m0, c0, m1, c1)


def gaussian_kl(m0, c0, m1, c1) -> float:
    """KL(N(m0, c0) || N(m1, c1))."""
    d = m0.size
    c1_inverse = np.linalg.inv(c1)
    diff = m1 - m0
    _, logdet0 = np.linalg.slogdet(c0)
    _, logdet1 = np.linalg.slogdet(c1)
    return 0.5 * float(np.trace(c1_inverse @ c0) + diff @ c1_inverse @ diff - d + logdet1 - logdet0)
