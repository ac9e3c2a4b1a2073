"""Stan's own approximate methods (ADVI, Pathfinder, Laplace) on a robust-stan program.

They run through CmdStanPy on the generated program with the same data
switches as NUTS, so the target is the same generalized posterior; users can
set them beside the robust-stan variational driver. Only the CmdStan engine
provides them: httpstan's extension module has no such services.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from ..common.errors import RobustStanInputError, RobustStanWarning, require_count, require_seed
from ..common.seeds import seed_to_use
from ..engines import RawDraws
from ..engines.cmdstan_engine import SIG_FIGS
from ..gradients.program import GeneratedProgram

STAN_METHODS = ("advi", "pathfinder", "laplace")


@dataclass(frozen=True)
class StanMethodSettings:
    """How Stan's method was run; ``options`` are the arguments passed to CmdStanPy."""

    method: str
    draws: int
    seed: int | None  # None: the run drew its own and cannot be repeated
    show_progress: bool
    options: dict
    chains: int = 1


def _call_cmdstanpy(model, method: str, stan_data: dict, family: str, draws: int, seed, init: dict | None,
                    options: dict):
    """CmdStanPy's method; ``init`` (the program's parameter values by name) starts ADVI and
    Pathfinder, and for Laplace the optimizer that finds the mode."""
    common = {"data": stan_data, "draws": draws, "seed": seed, "sig_figs": SIG_FIGS}
    if method == "advi":
        options = {"require_converged": False, **options}
        result = model.variational(algorithm=family, inits=init, **common, **options)
        if not options["require_converged"]:
            _warn_if_advi_stopped(result)
        return result
    if method == "pathfinder":
        return model.pathfinder(inits=init, **{"show_console": False, **common, **options})
    if init is not None:
        if options.get("mode") is not None:
            raise RobustStanInputError("inits: Laplace starts from the given mode; give inits or mode, not both")
        options = {**options, "opt_args": {"inits": init, **(options.get("opt_args") or {})}}
    return model.laplace_sample(**common, **options)


def _warn_if_advi_stopped(result) -> None:
    """A RobustStanWarning when CmdStan's ADVI stopped before its convergence test passed (CmdStanPy
    raises for that only with ``require_converged=True``)."""
    for transcript in result.runset.stdout_files:
        with open(transcript) as stream:
            if "may not have converged" in stream.read():
                warnings.warn("method='advi': CmdStan's ADVI stopped at its iteration limit before the relative "
                              "ELBO change fell below tol_rel_obj; the draws come from its last iterate. Raise "
                              "iter=, or pass require_converged=True to make this an error.", RobustStanWarning,
                              stacklevel=5)
                return


def run_stan_method(program: GeneratedProgram, method: str, stan_data: dict, family: str = "meanfield",
                    draws: int = 1000, seed: int | None = None, show_progress: bool = True,
                    init: dict | None = None, **options) -> tuple[RawDraws, StanMethodSettings]:
    """Run Stan's ``method`` on the program via CmdStanPy.

    Parameters
    ----------
    program : GeneratedProgram
        A program on the CmdStan engine (a built-in model or your own program).
    method : str
        "advi", "pathfinder" or "laplace".
    stan_data : dict
        The program's data, switches included.
    family : str
        ADVI's "meanfield" or "fullrank".
    draws : int
        Approximate draws to return.
    seed : int or None
        CmdStan's seed; None draws one from the operating system's entropy and records None.
    show_progress : bool
        Progress output of the compile.
    init : dict or None
        The program's parameter values by name (constrained): where ADVI and Pathfinder
        start, and where Laplace's search for the mode starts (not with ``mode``).
    **options
        CmdStanPy's arguments of that method. ADVI runs with ``require_converged=False``
        unless given, and warns (RobustStanWarning) when CmdStan stopped at its iteration limit.

    Returns
    -------
    tuple of RawDraws and StanMethodSettings
        The draws as one chain (``backend`` is CmdStanPy's result) and the settings.
    """
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
    model = compiled.model  # type: ignore[attr-defined]  # the CmdStan engine's program (checked above)
    result = _call_cmdstanpy(model, method, stan_data, family, int(draws), seed_to_use(seed), init, options)
    variables = {}
    for name in result.metadata.stan_vars:
        values = np.asarray(result.stan_variable(name, mean=False) if method == "advi" else result.stan_variable(name))
        variables[name] = values[None]  # one "chain" of draws
    columns = result.column_names
    table = np.asarray(result.variational_sample if method == "advi" else result.draws())
    table = table.reshape(-1, len(columns))
    sampler = {c: table[:, i][None] for i, c in enumerate(columns) if c.endswith("__")}
    settings = StanMethodSettings(method, int(draws), require_seed(seed), show_progress, dict(options))
    return RawDraws(variables, sampler, backend=result), settings
