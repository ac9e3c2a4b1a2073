"""The mode census: modes found by L-BFGS and weighed by their Laplace approximations, checked
against a Gaussian mixture whose weights are known exactly and, on a real Stan posterior with two
modes, against importance sampling."""

import numpy as np
import pytest
from scipy.special import logsumexp

import robust_stan as rs
from robust_stan.building.data import with_switches
from robust_stan.methods.mode_census import DOMINANT_SHARE, GridModes, grid_censuses, mode_census

from .conftest import ENGINE


def _gaussian_mixture(weights, means, sds):
    """log density and gradient of sum_m w_m N(means[m], diag(sds[m]^2)) in d dimensions."""
    weights, means, sds = np.asarray(weights), np.asarray(means, dtype=float), np.asarray(sds, dtype=float)

    def log_density_gradient(x):
        z = (x - means) / sds
        log_terms = (np.log(weights) - 0.5 * np.sum(z**2, axis=1) - np.sum(np.log(sds), axis=1)
                     - 0.5 * x.size * np.log(2 * np.pi))
        total = logsumexp(log_terms)
        responsibility = np.exp(log_terms - total)
        return float(total), -(responsibility[:, None] * z / sds).sum(axis=0)

    return log_density_gradient


def test_the_shares_of_separated_gaussians_are_their_weights():
    """Two components 30 sds apart with weights 0.3 and 0.7 and different scales: the Laplace
    approximation at each mode is that component itself (the other contributes e^-450 there), so
    the shares equal the weights to rounding; starts near either mode reach it, and a repeated
    start adds no mode."""
    means = [[-15.0, 0.0, 1.0], [15.0, 2.0, 0.0]]
    density = _gaussian_mixture([0.3, 0.7], means, [[1.0, 0.5, 2.0], [0.7, 1.0, 1.0]])
    starts = [np.array([-14.0, 0.5, 0.0]), np.array([16.0, 1.0, 0.5]), np.array([-16.0, 0.0, 2.0])]
    census, reached = mode_census(density, starts)
    assert len(census.modes) == 2 and reached == [1, 0, 1]
    np.testing.assert_allclose(census.shares, [0.7, 0.3], rtol=1e-7)
    np.testing.assert_allclose(census.modes[0].mode, means[1], atol=1e-5)
    assert census.dominant is None and "0.7, 0.3" == census.describe()
    lopsided, _ = mode_census(_gaussian_mixture([0.005, 0.995], means, [[1.0] * 3] * 2), starts)
    assert lopsided.dominant is lopsided.modes[0] and lopsided.shares[0] == pytest.approx(0.995, rel=1e-7)
    assert lopsided.shares[0] >= DOMINANT_SHARE


def test_a_point_that_is_not_a_strict_maximum_is_left_out():
    """A density flat in one direction has no strict maximum: the census finds no mode and reports
    every start as reaching none (-1), and the grid's check cannot tell, so it says the fit holds."""
    def flat(x):
        return float(-0.5 * x[0] ** 2), np.array([-x[0], 0.0])

    census, reached = mode_census(flat, [np.array([1.0, 2.0]), np.array([-1.0, 0.0])])
    assert census.modes == () and reached == [-1, -1] and census.dominant is None
    modes = GridModes([flat], [np.array([1.0, 2.0])], chain_locations=lambda fit: [np.zeros(2)])
    assert modes.holds(0, "any fit") and modes.several(0) is None


def test_a_fits_chains_are_placed_in_the_mode_they_reach_and_answers_are_renewed():
    """GridModes.holds on a one-value grid, a mixture with weights 0.995 (at 15) and 0.005 (at -15)
    whose dispersed starts (near 15) find only the heavy component. A "fit" is its chains' locations:
    one near 15 lies in the dominant mode; one near -15 does not, and its chains add the light mode to
    the census (0.995 / 0.005 shares); a third fit asked about after that is answered against the
    larger census. A chain-less fit cannot be placed and is taken as holding; a light component of
    0.4 leaves no dominant mode, so nothing holds and ``several`` gives the shares."""
    density = _gaussian_mixture([0.005, 0.995], [[-15.0], [15.0]], [[1.0], [1.0]])
    modes = GridModes([density], [np.array([14.0]), np.array([16.5])], chain_locations=lambda fit: fit)
    assert modes.mode_count(0) == 1 and modes.several(0) is None
    heavy, light = [np.array([14.8]), np.array([15.3])], [np.array([-14.0])]
    assert modes.holds(0, heavy)
    assert not modes.holds(0, light)
    assert modes.mode_count(0) == 2
    np.testing.assert_allclose(modes.censuses[0].shares, [0.995, 0.005], rtol=1e-7)
    assert modes.holds(0, heavy) and modes.holds(0, []) and modes.several(0) is None
    even = GridModes([_gaussian_mixture([0.4, 0.6], [[-15.0], [15.0]], [[1.0], [1.0]])], [np.array([14.0])],
                     chain_locations=lambda fit: fit)
    assert not even.holds(0, light) and not even.holds(0, heavy)
    assert even.several(0).startswith("its posterior has several modes (shares 0.6, 0.4)")


def test_continuation_finds_a_mode_that_the_dispersed_starts_miss():
    """A sequence of mixtures whose second component moves out from 8 to 10 while its weight grows
    from 0.2 to 0.8: starts near 0 reach only the first component; one start near 8 in the first
    density, carried along by continuation from the neighbours, finds the second in every census
    (in the last ones from the modes of the one before, the dispersed start near 8 lying in the
    first component's basin there or not), and the shares are the weights."""
    weights = np.linspace(0.2, 0.8, 5)
    densities = [_gaussian_mixture([1 - w, w], [[0.0], [8.0 + 0.5 * j]], [[1.0], [1.0]]) for j, w in enumerate(weights)]
    censuses = grid_censuses(densities, [np.array([0.3]), np.array([-0.5])])
    assert len(censuses[0].modes) == 1   # from near 0, only the first component
    seeded = grid_censuses(densities, [np.array([0.3]), np.array([4.5])])
    for census, w in zip(seeded, weights):
        assert len(census.modes) == 2
        np.testing.assert_allclose(sorted(census.shares), sorted([w, 1 - w]), rtol=1e-7)


@pytest.mark.stan
def test_laplace_shares_of_a_robust_regressions_two_modes_against_importance_sampling():
    """A real generalized posterior with two modes (high-leverage outliers, beta = 0.1 and 0.3; the
    census of beta = 0.1, 0.3, 0.5 from 8 dispersed starts, which at 0.1 reach only the heavier mode
    on this data set, the clean one coming down by continuation from 0.5): each
    mode's log normaliser by importance sampling from its own Laplace approximation (4000 draws;
    the estimate's standard error from the weights' spread) against the Laplace value. At N = 200 the
    Laplace approximation's error in a log normaliser is a few tenths of a nat; the census decides
    with a margin of log(99) = 4.6 nats, and the modes here differ by far more, each way: the
    outlier-following mode holds the mass at 0.1 and the clean mode at 0.3."""
    from .test_divergence_selection import _leverage_data

    model = rs.glm("normal", engine=ENGINE)
    data = _leverage_data()
    rng = np.random.default_rng(5)
    betas = (0.1, 0.3, 0.5)
    oracles = [model.oracle_for(with_switches(model.stan_data(data, rs.BetaD(b)), pointwise=False)) for b in betas]
    starts = list(rng.uniform(-2, 2, size=(8, oracles[0].dimension)))
    censuses = grid_censuses([oracle.log_density_gradient for oracle in oracles], starts)
    for oracle, census, follows_the_outliers in zip(oracles[:2], censuses[:2], (True, False)):
        assert len(census.modes) == 2 and census.dominant is census.modes[0]
        heavier_b1 = oracle.constrain(census.modes[0].mode)["b"][0]   # on the standardised outcome's scale
        assert (abs(heavier_b1) < 0.2) if follows_the_outliers else (heavier_b1 > 0.4)
        estimates = []
        for mode in census.modes:
            draws = mode.draws(4000, rng)
            offsets = np.linalg.solve(mode.cholesky, (draws - mode.mode).T)
            log_q = (-0.5 * np.sum(offsets**2, axis=0) - np.sum(np.log(np.diag(mode.cholesky)))
                     - 0.5 * mode.mode.size * np.log(2 * np.pi))
            log_p = np.array([oracle.log_density(x) for x in draws])
            log_w = log_p - log_q
            weights = np.exp(log_w - log_w.max())
            log_z = log_w.max() + np.log(weights.mean())
            se = weights.std() / (weights.mean() * np.sqrt(weights.size))
            assert se < 0.05, se   # the weights are far from degenerate, so the comparison is sharp
            assert abs(log_z - mode.log_normaliser) <= 0.5 + 4 * se, (log_z, mode.log_normaliser, se)
            estimates.append(log_z)
        assert estimates[0] - estimates[1] > np.log(99)


@pytest.mark.stan
def test_sampling_from_the_largest_mode():
    """``model.sample(inits="mode")`` on high-leverage outliers at beta = 0.2, where the mode that
    follows them holds about 5e-5 of the mass but draws more than half of 64 starts drawn as Stan
    draws its inits (L-BFGS from them reaches it): every chain starts, and stays, in the clean mode
    (slope b1 near 1 on the outcome's scale; the outlier mode's is near 0), and the chains agree.
    A string other than "mode" is refused, naming ``inits``."""
    from .test_divergence_selection import _leverage_data

    model = rs.glm("normal", engine=ENGINE)
    # the trap: most of Stan's kind of dispersed starts lie in the outlier mode's basin
    prepared = model.prepare(_leverage_data(), rs.BetaD(0.2))
    oracle = model.oracle_for(with_switches(prepared.stan_data, pointwise=False))
    starts = list(np.random.default_rng(0).uniform(-2, 2, size=(64, oracle.dimension)))
    census, reached = mode_census(oracle.log_density_gradient, starts)
    assert len(census.modes) == 2 and census.shares[0] > 0.99 and np.mean(np.array(reached) == 1) > 0.5
    fit = model.sample(_leverage_data(), divergence=rs.BetaD(0.2), inits="mode", chains=4, iter_warmup=500,
                       iter_sampling=1000, seed=1, show_progress=False)
    assert np.all(np.abs(fit.posterior["b"][..., 0].mean(axis=1) - 1.0) < 0.3)
    assert fit.summary()["r_hat"].max() < 1.01
    with pytest.raises(rs.RobustStanInputError, match=r"^inits: give starting values .* or 'mode'; got 'modes'"):
        model.sample(_leverage_data(), divergence=rs.BetaD(0.2), inits="modes", show_progress=False)
