"""robust-stan: outlier-robust generalized-Bayes inference for Stan.

    import robust_stan as rs
    model = rs.glm("normal")
    fit = model.sample(data={"X": X, "y": y}, divergence=rs.BetaD(0.3), seed=1)
    fit.summary(); fit.to_arviz(); fit.outlier_scores()
"""

from ._version import __version__  # noqa: F401

from .builtin import custom, glm, location
from .divergences import KL, BetaD, Divergence, GammaD
from .engines import COMPILE_COUNTS, resolve_engine
from .errors import RobustStanInputError, RobustStanWarning, StanCompileError
from .families import FAMILIES
from .fit import Fit
from .influence import influence, plot_influence
from .model import Model
from .neural_network import mlp, network_output
from .resources import stan_include_path
from .rob_ula import RobULAFit, rob_ula
from .rob_ula_tuning import RobULATuning, tune_rob_ula

__all__ = [
    "COMPILE_COUNTS",
    "FAMILIES",
    "KL",
    "BetaD",
    "Divergence",
    "Fit",
    "GammaD",
    "Model",
    "RobustStanInputError",
    "StanCompileError",
    "RobustStanWarning",
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
    "resolve_engine",
    "stan_include_path",
]
