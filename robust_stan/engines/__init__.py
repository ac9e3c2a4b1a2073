"""Stan engines: CmdStan (through CmdStanPy) and httpstan (pip-only).

``engine="auto"`` picks CmdStan when CmdStanPy finds an installation, else
httpstan; the ``ROBUST_STAN_ENGINE`` environment variable overrides ``auto``.
Compiled programs are cached on disk by their text (per engine) and in memory
for the life of the process.
"""

from __future__ import annotations

import os
from collections import Counter

import numpy as np

from ..common.errors import RobustStanInputError
from .base import CompiledProgram, NutsSettings, RawDraws
from .cmdstan_engine import cmdstan_available, compile_cmdstan
from .httpstan_build import extra_compiler_flags
from .httpstan_engine import compile_httpstan, httpstan_available

ENGINES = ("cmdstan", "httpstan")

#: Number of real builds (not cache hits) per engine in this process.
COMPILE_COUNTS: Counter = Counter()
_LOADED: dict[tuple[str, str, tuple[str, ...]], CompiledProgram] = {}  # engine, program, extra flags


def resolve_engine(engine: str = "auto") -> str:
    """The engine a call will use.

    Parameters
    ----------
    engine : {"auto", "cmdstan", "httpstan"}, default "auto"
        An explicit name, or "auto": $ROBUST_STAN_ENGINE, else the one installed.

    Returns
    -------
    str
        "cmdstan" or "httpstan".

    Raises
    ------
    RobustStanInputError
        If the name is unknown.
    RuntimeError
        If the engine asked for, or any engine for "auto", is not installed.
    """
    if engine == "auto":
        engine = os.environ.get("ROBUST_STAN_ENGINE", "auto")
    if engine == "auto":
        if cmdstan_available():
            return "cmdstan"
        if httpstan_available():
            return "httpstan"
        raise RuntimeError("robust-stan found no Stan engine: install CmdStan (python -m cmdstanpy.install_cmdstan) or httpstan")
    if engine not in ENGINES:
        raise RobustStanInputError(f"engine: unknown engine {engine!r}; choose 'auto', 'cmdstan' or 'httpstan'")
    if engine == "cmdstan" and not cmdstan_available():
        raise RuntimeError("engine: 'cmdstan' was asked for but CmdStanPy finds no CmdStan installation "
                           "(install it on a connected machine with: python -m cmdstanpy.install_cmdstan)")
    return engine


def compile_program(stan_code: str, engine: str = "auto", show_progress: bool = True) -> CompiledProgram:
    """Compile a program (with the robust-stan library on its include path) or reuse a cached build
    (an httpstan build made with the same ``ROBUST_STAN_CXXFLAGS``)."""
    engine = resolve_engine(engine)
    key = (engine, stan_code, tuple(extra_compiler_flags()) if engine == "httpstan" else ())
    if key not in _LOADED:
        compiler = compile_cmdstan if engine == "cmdstan" else compile_httpstan
        program, built = compiler(stan_code, show_progress=show_progress)
        if built:
            COMPILE_COUNTS[engine] += 1
        _LOADED[key] = program
    return _LOADED[key]


class ProgramSource:
    """A Stan program's text and the engine it runs on, compiled on first use into a
    :class:`CompiledProgram`; it holds no data (a base of the built-in models and of your own
    programs). Subclasses give :meth:`dimension`."""

    def __init__(self, stan_code: str, engine: str = "auto"):
        self.stan_code = stan_code
        self._engine_request = engine
        resolve_engine(engine)  # an unknown engine name fails here, not at the first fit
        self._program: CompiledProgram | None = None

    @property
    def engine(self) -> str:
        """Name of the engine this model runs on ('cmdstan' or 'httpstan')."""
        return self._program.engine_name if self._program else resolve_engine(self._engine_request)

    def compile(self, show_progress: bool = True) -> CompiledProgram:
        """Compile the program (once; later calls and later processes reuse the build).

        Parameters
        ----------
        show_progress : bool, default True
            Show the compiler's progress.

        Returns
        -------
        CompiledProgram
            The compiled program.

        Raises
        ------
        StanCompileError
            If stanc or the C++ compiler fails (with their own last lines).
        """
        if self._program is None:
            self._program = compile_program(self.stan_code, self._engine_request, show_progress=show_progress)
        return self._program

    def dimension(self, stan_data: dict) -> int:
        """Number of unconstrained parameters of the program for these Stan data."""
        raise NotImplementedError

    def __getstate__(self) -> dict:
        # a model travels (to a worker process, a file) without its compiled program: the
        # other side loads the build from the engine's cache by the program's text
        state = self.__dict__.copy()
        state["_program"] = None
        return state

    def check_theta(self, stan_data: dict, theta) -> np.ndarray:
        """An unconstrained point as a finite vector of the program's dimension, or an error naming it.

        Parameters
        ----------
        stan_data : dict
            The Stan data that fix the dimension.
        theta : array_like
            The point.

        Returns
        -------
        numpy.ndarray
            The point as a float vector.

        Raises
        ------
        RobustStanInputError
            If it is not finite or has the wrong length.
        """
        theta = np.asarray(theta, dtype=float).ravel()
        expected = self.dimension(stan_data)
        if theta.shape != (expected,):
            raise RobustStanInputError(f"theta_unconstrained: expected {expected} values, got {theta.size}")
        if not np.all(np.isfinite(theta)):
            raise RobustStanInputError("theta_unconstrained: contains non-finite values")
        return theta


__all__ = ["ProgramSource", "COMPILE_COUNTS", "CompiledProgram", "NutsSettings", "RawDraws", "compile_program",
           "resolve_engine"]
