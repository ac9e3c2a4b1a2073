"""Held-out log predictive density of a fit's draws: the score of rs.influence."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from scipy.special import logsumexp

from ..building.data import Scaling, log_density_on_outcome_scale, prepare_data
from ..building.divergences import Divergence
from ..gradients.program import GeneratedProgram


def held_out_pointwise_log_likelihood(program: GeneratedProgram, divergence: Divergence, scaling: Scaling,
                                      test_data: Mapping, thetas: np.ndarray) -> np.ndarray:
    """Per test row, log mean_s p(y_i | theta_s), thetas unconstrained (S, d) of a fit whose outcome
    was standardised by ``scaling``; densities on the outcome's own scale."""
    stan_data, _ = prepare_data(program.spec, test_data, divergence, scaling=scaling)
    oracle = program.oracle_for(stan_data)
    log_lik = np.array([oracle.constrain(theta, include_gqs=True)["log_lik"] for theta in thetas])
    log_lik = log_density_on_outcome_scale(program.spec, log_lik, scaling)
    return logsumexp(log_lik, axis=0) - np.log(len(thetas))


def held_out_log_likelihood(program: GeneratedProgram, divergence: Divergence, scaling: Scaling,
                            test_data: Mapping, thetas: np.ndarray) -> float:
    """Average over the test rows of log mean_s p(y_i | theta_s) (see the pointwise version)."""
    return float(np.mean(held_out_pointwise_log_likelihood(program, divergence, scaling, test_data, thetas)))
