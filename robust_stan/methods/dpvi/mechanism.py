"""DP-VI: mean-field variational inference by DP-SGD.

The mechanism of Alrawajfeh, Jälkö and Honkela (2025, arXiv:2410.19371).

The variational family is the paper's (section 4.1): a Gaussian on the program's
unconstrained scale with independent coordinates, q(zeta; phi) = N(mu, diag(s)),
phi = (mu, u), whose *variances* are s = softplus(u). Draws are
zeta = mu + sqrt(s) * eps. With ``q_scale="sd"`` softplus(u) is q's sd instead, as in the
authors' code (DPBayes/noise-aware-dpvi), whose published settings (initial scale, beta_u)
were chosen for that form.

The per-example objective is the negative of the paper's eq. A56-A57 (DP-SGD
descends; the paper's A57 writes |det J| for log|det J|): for row i and S draws
zeta_s shared by the batch,

    l_i(phi) = (1/S) sum_s [ loss_i(zeta_s) - (log prior(zeta_s) + log|J(zeta_s)|) / N
                             + log q(zeta_s; phi) / N ],

so the N rows' terms sum to the negative ELBO, and the prior, Jacobian and
entropy terms are clipped with every row's term. loss_i is the model's loss
(-log p(y_i | theta) for KL, the beta or gamma loss for a robust divergence).
Its phi-gradient comes from the per-example theta-gradients of the S draws
(one per-example call for all of them) and S prior-gradient calls:

    d l_i / d mu = (1/S) sum_s h_is,   h_is = grad loss_i(zeta_s) - grad(log prior + log|J|)(zeta_s) / N
    d l_i / d u  = (1/S) sum_s h_is * eps_s * sigmoid(u) / (2 sqrt(s)) - sigmoid(u) / (2 s N)

(with ``q_scale="sd"``: (1/S) sum_s h_is * eps_s * sigmoid(u) - sigmoid(u) / (sd N)).

DP-SGD with preconditioning (paper eq. 8 and A59, algorithm 3, read as a loop over
t = 0..T-1): Poisson subsampling at rate kappa; each row's gradient times beta
(1 for mu, ``precondition`` for u) clipped to norm C; Gaussian noise sigma C on the
sum; the released noisy gradient g~_{t+1} = (sum + noise) / beta; the step
phi_{t+1} = phi_t - lambda beta g~_{t+1} with the paper's lambda_heur =
sqrt(2) lambda_c / (sigma C sqrt(T d)) (eq. A55/A58, d = dim phi).

The mechanism's output, and all that is released, is phi_0..phi_T and
g~_1..g~_T with the public settings (:class:`DPVIRelease`). Nothing computed
from the data (batch sizes, clipped counts, losses) is kept. The subsamples and the
noise come from ChaCha20 keyed from the operating system's entropy, or, with a seed,
from NumPy's PCG64 (reproducible, and only as private as the seed is secret); neither
the seed nor the key is part of the release (:mod:`.randomness`, which also
says how floating-point noise is drawn and what is assumed of it).

Neighbouring data sets differ by adding or removing one row, with N public: every
row's clipped term holds the prior, Jacobian and entropy terms divided by N, so the
analysis treats N as a public constant of the mechanism
(:data:`~robust_stan.methods.dpvi.accounting.ADJACENCY`, recorded in ``release.accounting``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from ...building.data import Scaling, with_switches
from ...common.errors import RobustStanInputError
from ...gradients.per_example import PerExampleGradients
from ...gradients.program import GeneratedProgram
from .accounting import PrivacyAccounting
from .randomness import PRIVATE_NORMAL_DRAWS, private_generator, private_normal


def softplus(x):
    return np.logaddexp(0.0, x)


def inverse_softplus(y):
    y = np.asarray(y, dtype=float)
    return y + np.log(-np.expm1(-y))


def sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=float)))


Q_SCALES = ("variance", "sd")  # what softplus(u) is: q's variance (the paper's text) or sd (the authors' code)


def require_q_scale(q_scale) -> str:
    """``q_scale`` if it is one of :data:`Q_SCALES`; else an error naming it."""
    if q_scale not in Q_SCALES:
        raise RobustStanInputError(f"q_scale: must be one of {list(Q_SCALES)}, got {q_scale!r}")
    return q_scale


def q_sd(u, q_scale: str = "variance"):
    """q's sd from u: sqrt(softplus(u)), or softplus(u) with ``q_scale="sd"``."""
    return np.sqrt(softplus(u)) if require_q_scale(q_scale) == "variance" else softplus(u)


def reparameterised(phi: np.ndarray, eps: np.ndarray, q_scale: str = "variance") -> np.ndarray:
    """zeta = mu + sd(u) eps for phi = (mu, u) along the last axis: draws of q from
    standard-normal ``eps`` (broadcast against mu)."""
    n = phi.shape[-1] // 2
    return phi[..., :n] + q_sd(phi[..., n:], q_scale) * eps


@dataclass(frozen=True)
class DPVIRelease:
    """Exactly what DP-VI releases: the mechanism's output and the public settings.

    ``iterates`` (T + 1, d) are phi_0..phi_T, ``noisy_gradients`` (T, d) are
    g~_1..g~_T (g~_{t+1} is taken at phi_t, on the scale of phi); d = 2 n with phi
    = (mu, u) for the n unconstrained parameters. ``model`` is the (data-free)
    program, ``public_data`` its Stan data with zero rows and ``q_scale`` what
    softplus(u) is: what turns a phi into draws of the model's parameters.
    Everything downstream is computed from this object alone."""

    iterates: np.ndarray
    noisy_gradients: np.ndarray
    accounting: PrivacyAccounting
    clip: float
    step_size: float | np.ndarray
    lambda_c: float | np.ndarray
    precondition: np.ndarray
    draws_per_step: int
    model: GeneratedProgram = field(repr=False)
    public_data: dict = field(repr=False)
    q_scale: str = "variance"  # what softplus(u) is in every phi (Q_SCALES)

    @property
    def steps(self) -> int:
        return self.noisy_gradients.shape[0]

    @property
    def dimension(self) -> int:
        """n, the number of unconstrained model parameters (phi has 2 n)."""
        return self.iterates.shape[1] // 2

    def unconstrain(self, values: dict) -> np.ndarray:
        """Values of the model's parameters (by name) on the unconstrained scale q lives on."""
        return self.model.unconstrain_init(values, self.public_data, Scaling())

    @property
    def noise_sd(self) -> np.ndarray:
        """The sd of each coordinate's noise in g~: sigma C / beta (paper eq. A59)."""
        return self.accounting.noise_multiplier * self.clip / self.precondition


def clip_rows(gradients: np.ndarray, clip: float) -> np.ndarray:
    """Each row scaled to Euclidean norm at most ``clip`` (rows already inside are unchanged)."""
    norms = np.linalg.norm(gradients, axis=1, keepdims=True)
    return gradients * np.minimum(1.0, clip / np.maximum(norms, 1e-300))


class PerExampleObjective:
    """The per-example negative ELBO of eq. A56-A57 (module docstring) and its phi-gradients.

    ``per_example`` is a :class:`~robust_stan.gradients.per_example.PerExampleGradients` of the
    model's loss, ``prior`` an oracle of log prior + log|J| (the program's prior mode); ``q_scale``
    what softplus(u) is (:data:`Q_SCALES`)."""

    def __init__(self, per_example, prior, n_rows: int, q_scale: str = "variance"):
        self.per_example, self.prior, self.n_rows = per_example, prior, n_rows
        self.q_scale = require_q_scale(q_scale)
        self.dimension = per_example.dimension

    @classmethod
    def of_program(cls, program, stan_data: dict, n_rows: int, q_scale: str = "variance") -> PerExampleObjective:
        """The objective of a program with its prepared ``stan_data`` (its per-example gradients and its
        prior mode), for ``n_rows`` rows in all."""
        prior = program.oracle_for(with_switches(stan_data, mode="prior"))
        return cls(PerExampleGradients(program, stan_data), prior, n_rows, q_scale)

    def draws(self, phi: np.ndarray, eps: np.ndarray) -> np.ndarray:
        return reparameterised(phi, eps, self.q_scale)

    def clipped_sum(self, phi: np.ndarray, eps: np.ndarray, rows: np.ndarray, beta: np.ndarray,
                    clip: float) -> np.ndarray:
        """The sum over ``rows`` of each row's preconditioned phi-gradient clipped to norm ``clip``."""
        if rows.size == 0:
            return np.zeros(phi.size)
        return clip_rows(self.gradients(phi, eps, rows) * beta, clip).sum(axis=0)

    def gradients(self, phi: np.ndarray, eps: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """(rows, 2 n): each row's gradient in phi = (mu, u) at the shared standard-normal ``eps`` (S, n)."""
        n = self.dimension
        u = phi[n:]
        if self.q_scale == "variance":
            variance = softplus(u)
            d_sd = sigmoid(u) / (2.0 * np.sqrt(variance))
            entropy_term = sigmoid(u) / (2.0 * variance * self.n_rows)  # d log sd / du, over N
        else:
            d_sd = sigmoid(u)
            entropy_term = sigmoid(u) / (softplus(u) * self.n_rows)
        zetas = self.draws(phi, eps)
        loss_gradients = self.per_example.gradients_many(zetas, rows)  # (S, rows, n)
        prior_gradients = np.stack([self.prior.gradient(z, jacobian=True) for z in zetas])  # (S, n)
        h = loss_gradients - prior_gradients[:, None, :] / self.n_rows
        grad_mu = h.mean(axis=0)
        grad_u = np.einsum("srn,sn->rn", h, eps) / eps.shape[0] * d_sd - entropy_term
        return np.concatenate([grad_mu, grad_u], axis=1)


@dataclass(frozen=True)
class DPVISettings:
    """DP-SGD's settings: clip C, steps T, sampling rate kappa, noise multiplier sigma,
    step lambda_heur, preconditioning beta (d,), the draws per step, phi_0's variances and
    mean (None: 0), and what softplus(u) is (:data:`Q_SCALES`)."""

    clip: float
    steps: int
    sampling_rate: float
    noise_multiplier: float
    step_size: float | np.ndarray
    precondition: np.ndarray
    draws_per_step: int
    seed: int | None  # None: ChaCha20 with a fresh key (private); an integer: PCG64 (reproducible)
    show_progress: bool = True
    initial_variance: float = 1.0
    initial_mean: np.ndarray | None = None
    q_scale: str = "variance"


def heuristic_step_size(lambda_c, noise_multiplier: float, clip: float, steps: int, d: int):
    """lambda_heur = sqrt(2) lambda_c / (sigma C sqrt(T d)) (paper eq. A55/A58): a number, or
    one per entry of phi when ``lambda_c`` is."""
    step = np.sqrt(2.0) * np.asarray(lambda_c, dtype=float) / (noise_multiplier * clip * np.sqrt(steps * d))
    return float(step) if step.ndim == 0 else step


def initial_phi(n: int, variance: float = 1.0, mean: np.ndarray | None = None,
                q_scale: str = "variance") -> np.ndarray:
    """phi_0, chosen without the data: mu = ``mean`` (default 0) and the given variances
    (u = softplus^-1(variance), or softplus^-1(sqrt(variance)) with ``q_scale="sd"``)."""
    mu = np.zeros(n) if mean is None else np.asarray(mean, dtype=float)
    scale = variance if require_q_scale(q_scale) == "variance" else np.sqrt(variance)
    return np.concatenate([mu, np.full(n, float(inverse_softplus(scale)))])


def poisson_batch(rng: np.random.Generator, n_rows: int, sampling_rate: float) -> np.ndarray:
    """Poisson subsampling: each row joins independently with probability kappa."""
    return np.flatnonzero(rng.random(n_rows) < sampling_rate)


def noisy_gradient(clipped_sum: np.ndarray, noise_sd: float, beta: np.ndarray, rng: np.random.Generator,
                   normal_draws: int = 1) -> np.ndarray:
    """The released g~ = (sum of clipped, preconditioned gradients + N(0, noise_sd^2 I)) / beta (eq. A59),
    each coordinate's noise the sum of ``normal_draws`` normals scaled to sd ``noise_sd``
    (:func:`~.randomness.private_normal`)."""
    return (clipped_sum + noise_sd * private_normal(rng, clipped_sum.size, normal_draws)) / beta


def in_memory_batches(objective: PerExampleObjective, settings: DPVISettings) -> Callable:
    """A step's clipped sum over its Poisson subsample, the rows here: (rng, t, phi) -> (2 n,)."""
    def clipped_sum(rng: np.random.Generator, t: int, phi: np.ndarray) -> np.ndarray:
        rows = poisson_batch(rng, objective.n_rows, settings.sampling_rate)
        eps = rng.standard_normal((settings.draws_per_step, objective.dimension))
        return objective.clipped_sum(phi, eps, rows, settings.precondition, settings.clip)
    return clipped_sum


def run_dp_sgd(objective: PerExampleObjective, settings: DPVISettings,
               batches: Callable | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Algorithm 3 (preconditioned DP-SGD): the iterates (T + 1, d) and noisy gradients (T, d).
    ``batches`` makes each step's clipped sum (default: :func:`in_memory_batches`)."""
    if objective.q_scale != settings.q_scale:
        raise RobustStanInputError(f"q_scale: the objective's ({objective.q_scale!r}) and the settings' "
                                   f"({settings.q_scale!r}) differ")
    rng = private_generator(settings.seed)
    # a seeded run keeps one normal per coordinate, so that earlier seeded releases are drawn again exactly
    normal_draws = PRIVATE_NORMAL_DRAWS if settings.seed is None else 1
    n = objective.dimension
    beta = settings.precondition
    batches = batches or in_memory_batches(objective, settings)
    iterates = np.empty((settings.steps + 1, 2 * n))
    noisy = np.empty((settings.steps, 2 * n))
    phi = iterates[0] = initial_phi(n, settings.initial_variance, settings.initial_mean, settings.q_scale)
    for t in tqdm(range(settings.steps), desc="DP-VI", unit="step", disable=not settings.show_progress):
        clipped_sum = batches(rng, t, phi)
        noisy[t] = noisy_gradient(clipped_sum, settings.noise_multiplier * settings.clip, beta, rng, normal_draws)
        phi = iterates[t + 1] = phi - settings.step_size * beta * noisy[t]
    return iterates, noisy
