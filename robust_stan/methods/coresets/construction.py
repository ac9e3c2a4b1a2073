"""Greedy coreset construction: beta-Cores (Manousakas and Mascolo) and SparseVI (Campbell and Beronov).

With gains f_n(theta) (beta-Cores: f_n = -l_n, the beta loss; SparseVI: log p_n)
and weights w >= 0 with at most M non-zeros, the coreset posterior is
pi_w propto prior * exp(w^T f). Both methods minimise KL(pi_w || pi_1)
(the paper's equations 9-13; its gradient is eq. 13,
grad_w KL = -Cov_w[f, (1 - w)^T f]), by Algorithm 1 of the beta-Cores paper:

1. w = 0, coreset I = {}.
2. M times: draw S parameters from pi_w; centre the gains of I and of a uniform
   batch of B units over the draws, g_s(n) = f_n(theta_s) - mean_r f_n(theta_r);
   residual r_s = (N / B) sum_batch g_s(n) - sum_I w_n g_s(n); correlation
   Corr_n = mean_s(g_s(n) r_s) / sqrt(mean_s g_s(n)^2) (eq. 14); the batch unit of
   largest correlation joins I if it beats every |Corr| of a unit already in I
   (else that unit is "selected again" and nothing is added); then T steps on
   w over I with gradient -(1/S) sum_s g_s(I) ((N / B') sum_batch' g_s - w^T g_s(I))
   (Algorithm 1, line 17) and projection w <- max(w, 0).

Steps: ``optimizer="adam"`` (default, as the authors' code: Adam restarted for
every added point, step gamma_0 / (1 + t) at inner step t = 0..T-1) or ``"sgd"``
(Algorithm 1 as printed: w <- max(w - gamma_t grad, 0), same gamma_t).

The trace reports after every addition an estimate of KL(pi_w || pi_1) up to
its constant log Z_1: -log Z_w - E_w[(N / B) sum_batch f_n - sum_I w_n f_n] (eq.
11-12), with log Z_w from the target (the Laplace estimate) and the gains of
the posterior being drawn from (beta under inner="beta", log p under
"classical"), with the standard error of its batch term (large when the gains
of the rows differ widely, as they do with outliers: the estimate tracks the
objective, it does not resolve small changes); and, for the exact sampler, the
exact KL.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from ...common.errors import RobustStanInputError, require_count, require_positive

METHODS = ("beta_cores", "sparse_vi", "uniform")
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class CoresetSettings:
    """The construction's settings, named as in :func:`robust_stan.coreset`, checked when made (an
    error names the argument).

    Parameters
    ----------
    size : int
        Units to add, at least 1.
    draws : int, default 100
        Draws per gain estimate, at least 2.
    iters_per_point : int, default 100
        Weight-optimisation steps per addition, at least 0.
    select_batch, opt_batch : int
        Units scored per selection and draws per optimisation step, at least 1.
    step_size : float, default 1.0
        The optimiser's step, positive.
    optimizer : {"adam", "sgd"}, default "adam"
        The weights' optimiser.
    seed : int, default 0
        The construction's seed (:func:`robust_stan.coreset` draws one for None).
    show_progress : bool, default True
        Show a progress bar.

    Raises
    ------
    RobustStanInputError
        If a value is out of range.
    """

    size: int
    draws: int = 100
    iters_per_point: int = 100
    select_batch: int = 1000
    opt_batch: int = 200
    step_size: float = 1.0
    optimizer: str = "adam"
    seed: int = 0
    show_progress: bool = True

    def __post_init__(self) -> None:
        for name, low in (("size", 1), ("draws", 2), ("iters_per_point", 0), ("select_batch", 1), ("opt_batch", 1),
                          ("seed", 0)):
            object.__setattr__(self, name, require_count(name, getattr(self, name), low))
        object.__setattr__(self, "step_size", require_positive("step_size", self.step_size))
        if self.optimizer not in OPTIMIZERS:
            raise RobustStanInputError(f"optimizer: must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        object.__setattr__(self, "show_progress", bool(self.show_progress))


@dataclass
class CoresetOutput:
    """``unit_weights`` (one per unit, zero outside the coreset), the per-addition ``trace`` and
    ``path``: the (units, weights) of the coreset after each addition."""

    unit_weights: np.ndarray
    trace: pd.DataFrame
    seconds: float
    path: list[tuple[np.ndarray, np.ndarray]]


def centred(gains: np.ndarray) -> np.ndarray:
    """Each unit's gains minus their mean over the draws (the draws are the rows)."""
    return gains - gains.mean(axis=0)


def correlations(g: np.ndarray, residual: np.ndarray) -> np.ndarray:
    """Corr_n = mean_s(g_s(n) r_s) / sqrt(mean_s g_s(n)^2) (Algorithm 1, lines 8-9)."""
    scale = np.sqrt(np.mean(g**2, axis=0))
    return np.mean(g * residual[:, None], axis=0) / np.where(scale > 0, scale, np.inf)


def weight_gradient(g_coreset: np.ndarray, batch_sum: np.ndarray, batch_size: int, n_units: int,
                    weights: np.ndarray) -> np.ndarray:
    """Monte Carlo gradient of KL(pi_w || pi_1) in the coreset weights (Algorithm 1, line 17),
    from centred gains of the coreset (S, m) and the sum of a uniform batch's centred gains (S,)."""
    residual = (n_units / batch_size) * batch_sum - g_coreset @ weights
    return -np.mean(g_coreset * residual[:, None], axis=0)


class UnitGains:
    """The gains the greedy coreset construction uses at S draws.

    The coreset units' own gains, and what it needs of a uniform batch of units (its centred sum,
    each batch unit's correlation with a residual, each batch unit's mean gain). Here the batch's
    gains are held whole (S, B); a target whose rows live elsewhere computes the same reductions
    where the rows are.

    Parameters
    ----------
    gains : dict of numpy.ndarray
        By kind ("beta", "classical"): (S, k + B), the k coreset units first, then the batch.
    coreset_size : int
        k, the number of coreset units.
    """

    def __init__(self, gains: dict[str, np.ndarray], coreset_size: int):
        self._gains, self._k = gains, coreset_size
        self._centred_batch: dict[str, np.ndarray] = {}  # centred once per kind, used by two reductions

    def _centred(self, kind: str) -> np.ndarray:
        if kind not in self._centred_batch:
            self._centred_batch[kind] = centred(self._gains[kind][:, self._k:])
        return self._centred_batch[kind]

    @property
    def batch_size(self) -> int:
        """B, the number of batch units (int)."""
        return next(iter(self._gains.values())).shape[1] - self._k

    def coreset(self, kind: str) -> np.ndarray:
        """The coreset units' gains, uncentred.

        Parameters
        ----------
        kind : {"beta", "classical"}
            The gains of the beta loss or of the log-likelihood.

        Returns
        -------
        numpy.ndarray
            (S, k).
        """
        return self._gains[kind][:, :self._k]

    def batch_centred_sum(self, kind: str) -> np.ndarray:
        """The sum over the batch of the gains centred over the draws.

        Parameters
        ----------
        kind : str
            "beta" or "classical", as for :meth:`coreset`.

        Returns
        -------
        numpy.ndarray
            (S,).
        """
        return self._centred(kind).sum(axis=1)

    def batch_correlations(self, kind: str, residual: np.ndarray) -> np.ndarray:
        """Each batch unit's correlation with a residual (eq. 14 of Manousakas and Mascolo 2020).

        Parameters
        ----------
        kind : str
            Which gains, "beta" or "classical".
        residual : numpy.ndarray
            (S,), the residual over the draws.

        Returns
        -------
        numpy.ndarray
            (B,).
        """
        return correlations(self._centred(kind), residual)

    def batch_means(self, kind: str) -> np.ndarray:
        """Each batch unit's gain averaged over the draws.

        Parameters
        ----------
        kind : str
            Which gains (as for :meth:`coreset`).

        Returns
        -------
        numpy.ndarray
            (B,).
        """
        return self._gains[kind][:, self._k:].mean(axis=0)


def kl_estimate(target, support, weights, gains_coreset, batch_means, n_units: int) -> tuple[float, float]:
    """-log Z_w - E_w[(N/B) sum_batch f - sum_I w f]: KL(pi_w || pi_1) up to log Z_1 (uncentred
    coreset gains (S, k) and the batch units' mean gains (B,)), and the standard error of its batch
    term, N sqrt((1 - B/N) var_batch(mean_s f) / B), which is most of its noise."""
    b = batch_means.size
    expected_full = (n_units / b) * batch_means.sum()
    expected_coreset = float(gains_coreset.mean(axis=0) @ weights) if weights.size else 0.0
    se = n_units * np.sqrt(max(1.0 - b / n_units, 0.0) * np.var(batch_means, ddof=1) / b) if b > 1 else np.nan
    return -target.log_normaliser(support, weights) - (expected_full - expected_coreset), float(se)


class _Steps:
    """Projected Adam or SGD on the coreset weights, restarted for each added point."""

    def __init__(self, optimizer: str, step_size: float, size: int):
        self.optimizer, self.step_size = optimizer, step_size
        self.m, self.v, self.t = np.zeros(size), np.zeros(size), 0

    def __call__(self, weights: np.ndarray, gradient: np.ndarray) -> np.ndarray:
        step = self.step_size / (1.0 + self.t)
        self.t += 1
        if self.optimizer == "sgd":
            return np.maximum(weights - step * gradient, 0.0)
        self.m = 0.9 * self.m + 0.1 * gradient
        self.v = 0.999 * self.v + 0.001 * gradient**2
        m_hat, v_hat = self.m / (1 - 0.9**self.t), self.v / (1 - 0.999**self.t)
        return np.maximum(weights - step * m_hat / (np.sqrt(v_hat) + 1e-8), 0.0)


def greedy_coreset(target, settings: CoresetSettings, gain_kind: str, start_units=None,
                   refresh: Callable | None = None) -> CoresetOutput:
    """beta-Cores (``gain_kind="beta"``) or SparseVI (``"classical"``) on a :class:`CoresetTarget`.

    ``start_units`` begin the coreset, weight N / (their number) each. ``refresh(units, weights)``,
    when given, returns the target to use from then on (same units, new data: a feature
    extractor retrained on the coreset, say); it is called once at the start when
    ``start_units`` are given and after every addition's weight steps."""
    rng = np.random.default_rng(settings.seed)
    n = target.n_units
    select_batch, opt_batch = min(settings.select_batch, n), min(settings.opt_batch, n)
    support = np.unique(np.asarray(start_units if start_units is not None else [], dtype=int))
    weights = np.full(support.size, n / max(support.size, 1))
    rows, path, start = [], [], time.perf_counter()
    if refresh is not None and support.size:
        target = refresh(support, weights)

    def evaluate(batch_size):
        draws = target.draw(support, weights, settings.draws, rng)
        batch = rng.choice(n, batch_size, replace=False)
        try:
            return batch, target.unit_gains(support, batch, draws)
        except RuntimeError as exc:  # the engine refused a draw
            raise RobustStanInputError(
                f"start: the weighted posterior on the coreset's {support.size} unit(s) gave draws the program "
                f"rejects ({str(exc).splitlines()[0]:.200}). On this few rows it can be improper (a regression's "
                f"scale goes to 0 when it fits every row); start from more rows (start=...)") from exc

    batch, gains = evaluate(select_batch)
    with tqdm(total=settings.size, desc=f"coreset ({'beta-Cores' if gain_kind == 'beta' else 'SparseVI'})",
              unit="point", disable=not settings.show_progress) as bar:
        for _ in range(settings.size):
            g_coreset = centred(gains.coreset(gain_kind))
            k = support.size
            residual = (n / batch.size) * gains.batch_centred_sum(gain_kind) - g_coreset @ weights
            corr_coreset, corr_batch = correlations(g_coreset, residual), gains.batch_correlations(gain_kind, residual)
            fresh = ~np.isin(batch, support)
            chosen = None
            if fresh.any():
                best = int(np.argmax(np.where(fresh, corr_batch, -np.inf)))
                if k == 0 or corr_batch[best] > np.max(np.abs(corr_coreset)):
                    chosen = int(batch[best])
            if chosen is None:  # a unit already in the coreset correlates best: it is "selected again"
                chosen = int(support[int(np.argmax(np.abs(corr_coreset)))])
            else:
                support = np.append(support, chosen)
                weights = np.append(weights, 0.0)
            steps = _Steps(settings.optimizer, settings.step_size, support.size)
            for _ in range(settings.iters_per_point):
                batch, gains = evaluate(opt_batch)
                gradient = weight_gradient(centred(gains.coreset(gain_kind)), gains.batch_centred_sum(gain_kind),
                                           gains.batch_size, n, weights)
                weights = steps(weights, gradient)
            if refresh is not None:
                target = refresh(support, weights)
            batch, gains = evaluate(select_batch)
            kl, kl_se = kl_estimate(target, support, weights, gains.coreset(target.inner),  # the inner gains
                                    gains.batch_means(target.inner), n)
            exact = target.exact_kl(support, weights)
            rows.append({"size": int(np.count_nonzero(weights)), "chosen": chosen,
                         "seconds": time.perf_counter() - start, "kl_estimate": kl,
                         "kl_estimate_se": kl_se, "kl_exact": np.nan if exact is None else exact})
            path.append((support.copy(), weights.copy()))
            bar.update(1)
    unit_weights = np.zeros(n)
    unit_weights[support] = weights
    return CoresetOutput(unit_weights, pd.DataFrame(rows), time.perf_counter() - start, path)


def uniform_coreset(target, size: int, seed: int) -> CoresetOutput:
    """``size`` units drawn uniformly with replacement, weight N * count / size each (the trace's
    exact KL when the target has one)."""
    n_units = target.n_units
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    counts = np.bincount(rng.integers(0, n_units, size), minlength=n_units)
    weights = n_units * counts / size
    support = np.flatnonzero(weights)
    exact = target.exact_kl(support, weights[support])
    trace = pd.DataFrame({"size": [support.size], "chosen": [-1], "seconds": [time.perf_counter() - start],
                          "kl_estimate": [np.nan], "kl_estimate_se": [np.nan], "kl_exact": [np.nan if exact is None else exact]})
    return CoresetOutput(weights, trace, time.perf_counter() - start, [(support, weights[support])])
