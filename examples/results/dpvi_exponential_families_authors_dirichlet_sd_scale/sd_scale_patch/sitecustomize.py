"""An experiment's patch, not part of robust-stan: q's scale as the *sd* softplus(u), as in the
authors' code (DPBayes/noise-aware-dpvi), instead of the variance softplus(u) of the paper's
section 4.1 and of robust-stan. Loaded by every Python process (the driver and each Dask
worker) that runs with this folder on PYTHONPATH; see ../README.md.

With sd = softplus(u): zeta = mu + sd eps, d zeta / du = sigmoid(u) eps, and the entropy term
log q(zeta; phi) / N = (-log sd - eps^2 / 2 + const) / N has u-gradient -sigmoid(u) / (sd N).
phi_0's u is softplus^-1(sqrt(initial variance)), so phi_0 is the same q as before.
"""

import numpy as np

import robust_stan.methods.dpvi as dpvi
import robust_stan.methods.noise_aware as noise_aware


def reparameterised(phi, eps):
    n = phi.shape[-1] // 2
    return phi[..., :n] + dpvi.softplus(phi[..., n:]) * eps


def gradients(self, phi, eps, rows):
    n = self.dimension
    u = phi[n:]
    sd = dpvi.softplus(u)
    zetas = self.draws(phi, eps)
    loss_gradients = self.per_example.gradients_many(zetas, rows)  # (S, rows, n)
    prior_gradients = np.stack([self.prior.gradient(z, jacobian=True) for z in zetas])  # (S, n)
    h = loss_gradients - prior_gradients[:, None, :] / self.n_rows
    grad_mu = h.mean(axis=0)
    grad_u = np.einsum("srn,sn->rn", h, eps) / eps.shape[0] * dpvi.sigmoid(u) - dpvi.sigmoid(u) / (sd * self.n_rows)
    return np.concatenate([grad_mu, grad_u], axis=1)


def initial_phi(n, variance=1.0, mean=None):
    mu = np.zeros(n) if mean is None else np.asarray(mean, dtype=float)
    return np.concatenate([mu, np.full(n, float(dpvi.inverse_softplus(np.sqrt(variance))))])


dpvi.reparameterised = noise_aware.reparameterised = reparameterised
dpvi.PerExampleObjective.gradients = gradients
dpvi.initial_phi = initial_phi
dpvi.SD_SCALE_PATCH = True  # for the run to check that the patch is in place
