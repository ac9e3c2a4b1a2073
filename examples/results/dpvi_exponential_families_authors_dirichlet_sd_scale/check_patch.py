"""Finite-difference check of the sd-scale patch's phi-gradient (sd_scale_patch/sitecustomize.py)
on a stand-in model with a closed-form loss: loss_i(zeta) = 0.5 |zeta - y_i|^2 (a Gaussian
location model), prior N(0, 10^2) per coordinate, no Jacobian. The objective
l_i(phi) = mean_s [loss_i(zeta_s) - log prior(zeta_s) / N + log q(zeta_s; phi) / N] is
written here directly, with zeta_s = mu + softplus(u) eps_s and eps_s held fixed.

    PYTHONPATH=sd_scale_patch python check_patch.py
"""

import numpy as np

import robust_stan.methods.dpvi as dpvi

assert getattr(dpvi, "SD_SCALE_PATCH", False), "run with PYTHONPATH=sd_scale_patch"
rng = np.random.default_rng(0)
n_par, n_rows, S = 3, 5, 4
y = rng.normal(size=(n_rows, n_par))


class Rows:
    dimension = n_par

    def gradients_many(self, zetas, rows):
        return zetas[:, None, :] - y[rows][None, :, :]


class Prior:
    def gradient(self, z, jacobian=True):
        return -z / 100.0


def objective(phi, eps, i):
    mu, sd = phi[:n_par], dpvi.softplus(phi[n_par:])
    zetas = mu + sd * eps
    loss = 0.5 * ((zetas - y[i]) ** 2).sum(axis=1)
    log_prior = -0.5 * (zetas ** 2).sum(axis=1) / 100.0
    log_q = (-np.log(sd) - 0.5 * eps ** 2).sum(axis=1)
    return np.mean(loss - log_prior / n_rows + log_q / n_rows)


target = dpvi.PerExampleObjective(Rows(), Prior(), n_rows)
phi = rng.normal(size=2 * n_par)
eps = rng.normal(size=(S, n_par))
analytic = target.gradients(phi, eps, np.arange(n_rows))
h = 1e-6
numeric = np.array([[(objective(phi + h * e, eps, i) - objective(phi - h * e, eps, i)) / (2 * h)
                     for e in np.eye(2 * n_par)] for i in range(n_rows)])
error = np.abs(analytic - numeric).max()
print(f"largest difference, analytic against central differences: {error:.2e}")
assert error < 1e-7, error
