"""robust-stan: outlier-robust generalized-Bayes inference for Stan.

    import robust_stan as rs
    model = rs.glm("normal")
    fit = model.sample(data={"X": X, "y": y}, divergence=rs.BetaD(0.3), seed=1)
    fit.summary(); fit.to_arviz(); fit.outlier_scores()
"""

from ._version import __version__  # noqa: F401
from .api.builtin import custom, glm, location
from .api.calibrate import calibrate
from .api.coreset import coreset
from .api.dpvi import check_trace_model, dpvi, dpvi_baseline, noise_aware
from .api.influence import influence
from .api.model import Model
from .api.neural_network import mlp, network_output
from .api.rob_ula import rob_ula
from .api.rob_ula_tuning import RobULATuning, tune_rob_ula
from .api.select_divergence import select_divergence
from .api.stan_program import StanProgramModel, from_stan, robustify
from .building.divergences import KL, BetaD, Divergence, GammaD
from .building.families import FAMILIES
from .common.cluster import Cluster
from .common.errors import RobustStanInputError, RobustStanWarning, StanCompileError
from .common.resources import native_header_path, stan_include_path
from .engines import COMPILE_COUNTS, resolve_engine
from .results.coreset import Coreset
from .results.coverage import calibration_curve, calibration_rmse, coverage_rmse, tarp_coverage
from .results.dpvi import DPVIFit, PrivatePosterior
from .results.fits.calibrated import CalibratedFit
from .results.fits.mcmc import Fit
from .results.fits.rob_ula import PartitionedRobULAFit, RobULAFit
from .results.fits.stan_methods import StanMethodFit
from .results.fits.variational import PartitionedVariationalFit, VariationalFit
from .results.influence import plot_influence
from .results.predictions import Predictions
from .results.selection import Selection

__all__ = [
    "COMPILE_COUNTS",
    "Cluster",
    "Coreset",
    "FAMILIES",
    "native_header_path",
    "KL",
    "BetaD",
    "Divergence",
    "Fit",
    "Predictions",
    "GammaD",
    "Model",
    "RobustStanInputError",
    "StanCompileError",
    "RobustStanWarning",
    "coreset",
    "from_stan",
    "robustify",
    "StanProgramModel",
    "dpvi",
    "dpvi_baseline",
    "check_trace_model",
    "noise_aware",
    "DPVIFit",
    "PrivatePosterior",
    "tarp_coverage",
    "coverage_rmse",
    "calibration_curve",
    "calibration_rmse",
    "custom",
    "glm",
    "influence",
    "plot_influence",
    "mlp",
    "network_output",
    "location",
    "rob_ula",
    "tune_rob_ula",
    "RobULATuning",
    "RobULAFit",
    "PartitionedRobULAFit",
    "VariationalFit",
    "PartitionedVariationalFit",
    "StanMethodFit",
    "select_divergence",
    "calibrate",
    "CalibratedFit",
    "Selection",
    "resolve_engine",
    "stan_include_path",
]
