"""Stan's own approximate methods (ADVI, Pathfinder, Laplace) on a robust-stan program.

They run through CmdStanPy on the generated program with the same data
switches as NUTS, so the target is the same generalized posterior; users can
set them beside the robust-stan variational driver. Only the CmdStan engine
provides them: httpstan's extension module has no such services.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .data import prepare_data
from .divergences import Divergence, as_divergence
from .engines import RawDraws
from .errors import RobustStanInputError, require_count
from .fit import Fit

STAN_METHODS = ("advi", "pathfinder", "laplace")


@dataclass(frozen=True)
class StanMethodSettings:
    """How Stan's method was run; ``options`` are the arguments passed to CmdStanPy."""

    method: str
    draws: int
    seed: int
    show_progress: bool
    options: dict
    chains: int = 1


class StanMethodFit(Fit):
    """Draws from Stan's ADVI, Pathfinder or Laplace approximation, as a robust-stan fit.

    sample_stats hold CmdStan's own per-draw columns (``lp__``, ``log_p__``,
    ``log_g__``, ...); ``raw.backend`` is CmdStanPy's result object.
    """

    @property
    def method(self) -> str:
        return self.settings.method

    def diagnostics(self) -> dict:
        return {"method": self.settings.method, "draws": self.settings.draws}

    def __repr__(self) -> str:
        return (f"<robust_stan.StanMethodFit {self.settings.method}, {self.divergence!r}, "
                f"{self.settings.draws} draws, parameters {self.parameter_names}>")


def _call_cmdstanpy(model, method: str, stan_data: dict, family: str, draws: int, seed, options: dict):
    if method == "advi":
        return model.variational(data=stan_data, algorithm=family, draws=draws, seed=seed, **options)
    if method == "pathfinder":
        return model.pathfinder(data=stan_data, draws=draws, seed=seed, show_console=False, **options)
    return model.laplace_sample(data=stan_data, draws=draws, seed=seed, **options)


def run_stan_method(model, method: str, data: Mapping, divergence: Divergence | None = None,
                    learning_rate: float = 1.0, weights=None, family: str = "meanfield", draws: int = 1000,
                    seed: int | None = None, show_progress: bool = True, **options) -> StanMethodFit:
    """Run Stan's ``method`` ("advi", "pathfinder" or "laplace") on the model's program via CmdStanPy."""
    if method not in STAN_METHODS:
        raise RobustStanInputError(f"method: choose 'robust-stan' or one of Stan's {list(STAN_METHODS)}, "
                                   f"not {method!r}")
    if model.engine != "cmdstan":
        raise RobustStanInputError(
            f"method: {method!r} is Stan's own algorithm, provided by the CmdStan engine (CmdStanPy with CmdStan "
            f"installed: python -m cmdstanpy.install_cmdstan); this model runs on the {model.engine!r} engine. "
            "Use method='robust-stan' (this library's driver, on any engine) or engine='cmdstan'.")
    if family not in ("meanfield", "fullrank"):
        raise RobustStanInputError(f"family: ADVI knows 'meanfield' and 'fullrank', not {family!r}")
    require_count("draws", draws)
    divergence = as_divergence(divergence)
    stan_data, scaling = prepare_data(model.spec, data, divergence, learning_rate, weights)
    program = model.compile(show_progress=show_progress)
    result = _call_cmdstanpy(program.model, method, stan_data, family, int(draws), seed, options)
    variables = {}
    for name in result.metadata.stan_vars:
        values = np.asarray(result.stan_variable(name, mean=False) if method == "advi" else result.stan_variable(name))
        variables[name] = values[None]  # one "chain" of draws
    columns = result.column_names
    table = np.asarray(result.variational_sample if method == "advi" else result.draws())
    table = table.reshape(-1, len(columns))
    sampler = {c: table[:, i][None] for i, c in enumerate(columns) if c.endswith("__")}
    settings = StanMethodSettings(method, int(draws), int(seed or 0), show_progress, dict(options))
    return StanMethodFit(model, RawDraws(variables, sampler, backend=result), data=data, stan_data=stan_data,
                         scaling=scaling, divergence=divergence, learning_rate=stan_data["learning_rate"],
                         settings=settings)
