"""robust-stan: outlier-robust generalized-Bayes inference for Stan.

    import robust_stan as rs
    model = rs.glm("normal")
    fit = model.sample(data={"X": X, "y": y}, divergence=rs.BetaD(0.3), seed=1)
    fit.summary(); fit.to_arviz(); fit.outlier_scores()
"""

__version__ = "0.1.0"

from .builtin import custom, glm, location  # noqa: E402
from .divergences import KL, BetaD, Divergence, GammaD  # noqa: E402
from .engines import COMPILE_COUNTS, resolve_engine  # noqa: E402
from .errors import RobustStanInputError, StanCompileError  # noqa: E402
from .families import FAMILIES  # noqa: E402
from .fit import Fit  # noqa: E402
from .model import Model  # noqa: E402
from .resources import stan_include_path  # noqa: E402

__all__ = [
    "KL", "BetaD", "GammaD", "Divergence", "Model", "Fit", "location", "glm", "custom",
    "stan_include_path", "resolve_engine", "COMPILE_COUNTS", "FAMILIES",
    "RobustStanInputError", "StanCompileError",
]
