"""Stan's own approximate methods (ADVI, Pathfinder, Laplace) on a robust-stan program.

They run through CmdStanPy on the generated program with the same data
switches as NUTS, so the target is the same generalized posterior; users can
set them beside the robust-stan variational driver. Only the CmdStan engine
provides them: httpstan's extension module has no such services.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..common.errors import RobustStanInputError, require_count
from ..engines import RawDraws
from ..gradients.program import RobustProgram

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


def _call_cmdstanpy(model, method: str, stan_data: dict, family: str, draws: int, seed, options: dict):
    if method == "advi":
        return model.variational(data=stan_data, algorithm=family, draws=draws, seed=seed, **options)
    if method == "pathfinder":
        return model.pathfinder(data=stan_data, draws=draws, seed=seed, show_console=False, **options)
    return model.laplace_sample(data=stan_data, draws=draws, seed=seed, **options)


def run_stan_method(program: RobustProgram, method: str, stan_data: dict, family: str = "meanfield",
                    draws: int = 1000, seed: int | None = None, show_progress: bool = True,
                    **options) -> tuple[RawDraws, StanMethodSettings]:
    """Run Stan's ``method`` ("advi", "pathfinder" or "laplace") on the program via CmdStanPy;
    returns the draws (``backend`` is CmdStanPy's result) and the settings."""
    if method not in STAN_METHODS:
        raise RobustStanInputError(f"method: choose 'robust-stan' or one of Stan's {list(STAN_METHODS)}, "
                                   f"not {method!r}")
    if program.engine != "cmdstan":
        raise RobustStanInputError(
            f"method: {method!r} is Stan's own algorithm, provided by the CmdStan engine (CmdStanPy with CmdStan "
            f"installed: python -m cmdstanpy.install_cmdstan); this model runs on the {program.engine!r} engine. "
            "Use method='robust-stan' (this library's driver, on any engine) or engine='cmdstan'.")
    if family not in ("meanfield", "fullrank"):
        raise RobustStanInputError(f"family: ADVI knows 'meanfield' and 'fullrank', not {family!r}")
    require_count("draws", draws)
    compiled = program.compile(show_progress=show_progress)
    result = _call_cmdstanpy(compiled.model, method, stan_data, family, int(draws), seed, options)
    variables = {}
    for name in result.metadata.stan_vars:
        values = np.asarray(result.stan_variable(name, mean=False) if method == "advi" else result.stan_variable(name))
        variables[name] = values[None]  # one "chain" of draws
    columns = result.column_names
    table = np.asarray(result.variational_sample if method == "advi" else result.draws())
    table = table.reshape(-1, len(columns))
    sampler = {c: table[:, i][None] for i, c in enumerate(columns) if c.endswith("__")}
    settings = StanMethodSettings(method, int(draws), int(seed or 0), show_progress, dict(options))
    return RawDraws(variables, sampler, backend=result), settings
