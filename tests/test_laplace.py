"""The Laplace approximation (robust_stan.methods.laplace) against closed forms: on a Gaussian it
is exact, whatever the units of its coordinates, and a flat direction is still reported."""

import warnings

import numpy as np
import pytest

from robust_stan.common.errors import RobustStanWarning
from robust_stan.methods.laplace import covariance_of_precision, laplace_approximation


def gaussian(mean: np.ndarray, covariance: np.ndarray):
    """theta -> (log density up to a constant, gradient) of N(mean, covariance)."""
    precision = np.linalg.inv(covariance)

    def log_density_gradient(theta):
        r = theta - mean
        return -0.5 * r @ precision @ r, -precision @ r
    return log_density_gradient


def test_a_gaussian_with_coordinates_on_very_different_scales_is_its_own_laplace_approximation():
    """sds 1e-3, 1e5 and 1 with correlations 0.9 and 0.3: unscaled, the precision's eigenvalues are
    about 1e16 apart, and flooring them at 1e-10 of the largest (as before) flattened the small one.
    The mode, covariance and log normaliser of a Gaussian are its own (a quadratic: the central
    differences are exact up to rounding)."""
    sd = np.array([1e-3, 1e5, 1.0])
    correlation = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, 0.3], [0.0, 0.3, 1.0]])
    covariance = correlation * np.outer(sd, sd)
    mean = np.array([0.5, 2e5, -1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RobustStanWarning)
        approx = laplace_approximation(gaussian(mean, covariance), mean + 0.5 * sd)
    assert np.all(np.abs(approx.mode - mean) < 1e-4 * sd)
    scale = np.outer(sd, sd)
    assert np.allclose(approx.covariance / scale, correlation, atol=1e-6)
    exact_log_normaliser = 0.5 * len(sd) * np.log(2 * np.pi) + 0.5 * np.linalg.slogdet(covariance)[1]
    assert approx.log_normaliser == pytest.approx(exact_log_normaliser, abs=1e-6)


def test_a_flat_direction_is_floored_with_a_warning():
    """A coordinate the density does not depend on has no curvature: floored, and said."""
    def log_density_gradient(theta):
        return -0.5 * theta[0] ** 2, np.array([-theta[0], 0.0])
    with pytest.warns(RobustStanWarning, match="not negative definite"):
        approx = laplace_approximation(log_density_gradient, np.array([1.0, 3.0]))
    assert approx.covariance[0, 0] == pytest.approx(1.0, rel=1e-6)
    assert approx.covariance[1, 1] > 1e9


def test_a_negative_curvature_is_floored_without_unscaling_the_others():
    """minus the Hessian diag(1e4, 1e-9, -1): the saddle direction is floored with a warning, and the
    small positive curvature keeps its variance 1e9 (unscaled, it was floored with the rest)."""
    precision = np.diag([1e4, 1e-9, -1.0])
    with pytest.warns(RobustStanWarning, match="not negative definite"):
        covariance, _ = covariance_of_precision(precision)
    assert covariance[0, 0] == pytest.approx(1e-4, rel=1e-12)
    assert covariance[1, 1] == pytest.approx(1e9, rel=1e-12)
    assert covariance[2, 2] > 1e9


@pytest.mark.parametrize("size", [1e-10, 1e-3])
def test_a_curvature_made_of_rounding_is_reported(size):
    """A coordinate the density does not depend on, whose computed gradient is quantised as rounding
    quantises it (steps of 1.5e-4 in theta): the differenced curvature is a positive number, 1.5 size
    with the step 1e-4 and 0.75 size with twice it, so it is reported. (It used to pass as genuine and
    silently give a variance of 1 / (1.5 size); a curvature made of rounding need not be small against
    the others, hence size 1e-3 as well as 1e-10.)"""
    quantum = 1.5e-4

    def log_density_gradient(theta):
        return -0.5 * theta[0] ** 2, np.array([-theta[0], -size * quantum * np.round(theta[1] / quantum)])
    with pytest.warns(RobustStanWarning, match=r"coordinate\(s\) \[1\] changes by more than 10%"):
        approx = laplace_approximation(log_density_gradient, np.array([1.0, 0.0]))
    assert approx.covariance[0, 0] == pytest.approx(1.0, rel=1e-6)


def test_a_small_but_smooth_curvature_is_not_reported():
    """A genuine curvature 1e-12 of the largest (sds 1e-3 and 1e3) differences alike with both steps:
    no warning, and its variance is its own."""
    covariance = np.diag([1e-6, 1e6])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RobustStanWarning)
        approx = laplace_approximation(gaussian(np.zeros(2), covariance), np.array([1e-3, 1e3]))
    assert approx.covariance[1, 1] == pytest.approx(1e6, rel=1e-6)
