"""The CmdStan engine, through CmdStanPy.

Programs are written to robust-stan's cache folder under the hash of their
text and compiled by CmdStanPy with the library's include path, so a second
process finds the executable and does not recompile. NUTS runs through
``CmdStanModel.sample``; log densities and gradients at unconstrained points
come from CmdStan's ``log_prob`` method (which takes ``unconstrained_params``).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..common.resources import build_digest, native_header_path, stan_include_path, uses_native_functions
from .base import CompiledProgram, NutsSettings, RawDraws, cache_folder, named_columns, refuse_build_on_worker
from .build_files import BuildFiles, read_build_files


def cmdstan_available() -> bool:
    """True when CmdStanPy finds a CmdStan installation."""
    try:
        import cmdstanpy

        cmdstanpy.cmdstan_path()
    except Exception:  # cmdstanpy raises ValueError (or ImportError if absent)
        return False
    return True


class CmdStanProgram(CompiledProgram):
    """A program compiled by CmdStanPy."""

    engine_name = "cmdstan"

    def build_files(self) -> BuildFiles:
        """The program and its executable (written in that order, so CmdStanPy finds the
        executable newer than the program and does not build it again)."""
        exe = Path(self.model.exe_file)
        return read_build_files("cmdstan", exe.parent, [exe.with_suffix(".stan").name, exe.name])

    def __init__(self, stan_code: str, model):
        super().__init__(stan_code)
        self.model = model  # cmdstanpy.CmdStanModel
        self._shapes: dict[str, dict[str, tuple[int, ...]]] = {}

    def _run_log_prob(self, data: dict, theta: np.ndarray, jacobian: bool) -> tuple[float, np.ndarray]:
        from cmdstanpy.utils import write_stan_json

        with tempfile.TemporaryDirectory(prefix="robust_stan_") as tmp:
            data_file = Path(tmp) / "data.json"
            params_file = Path(tmp) / "params.json"
            output_file = Path(tmp) / "log_prob.csv"
            write_stan_json(str(data_file), data)
            params_file.write_text(json.dumps({"params_r": [float(t) for t in theta]}))
            command = [
                str(self.model.exe_file),
                "log_prob",
                f"unconstrained_params={params_file}",
                f"jacobian={int(bool(jacobian))}",
                "data",
                f"file={data_file}",
                "output",
                f"file={output_file}",
                "sig_figs=18",
            ]
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"CmdStan log_prob failed: {done.stdout}\n{done.stderr}")
            rows = [line for line in output_file.read_text().splitlines() if line and not line.startswith("#")]
        values = np.array([float(v) for v in rows[1].split(",")])
        return float(values[0]), values[1:]

    def log_density(self, data, theta, jacobian=True):
        return self._run_log_prob(data, theta, jacobian)[0]

    def log_density_gradient(self, data, theta, jacobian=True):
        return self._run_log_prob(data, theta, jacobian)

    def _bridgestan(self, data):
        from .bridgestan_oracle import bridgestan_available, bridgestan_model

        if not bridgestan_available():
            raise RuntimeError("constrain/unconstrain on the cmdstan engine need BridgeStan: pip install "
                               "'robust-stan[bridgestan]' and set BRIDGESTAN to a BridgeStan source tree "
                               "(or use engine='httpstan')")
        return bridgestan_model(self.stan_code, data)

    def unconstrained_dimension(self, data):
        """The length of the gradient CmdStan's log_prob method returns at one fixed-parameter draw
        (CmdStanPy's ``CmdStanModel.log_prob`` takes the constrained values)."""
        fit = self._one_fixed_parameter_draw(data)
        params = {name: fit.stan_variable(name)[0] for name in fit.metadata.stan_vars}
        table = self.model.log_prob(params=params, data=data)
        return int(sum(1 for column in table.columns if column != "lp__"))

    def variable_shapes(self, data):
        key = json.dumps({k: np.asarray(v).tolist() for k, v in data.items()}, sort_keys=True)
        if key not in self._shapes:
            self._shapes[key] = self._shapes_from_one_draw(data)
        return self._shapes[key]

    def _one_fixed_parameter_draw(self, data):
        """One fixed-parameter draw by CmdStan (no BridgeStan needed), for shapes and sizes."""
        return self.model.sample(data=data, chains=1, iter_sampling=1, fixed_param=True, seed=1,
                                 show_progress=False, show_console=False)

    def _shapes_from_one_draw(self, data) -> dict[str, tuple[int, ...]]:
        """Variable shapes from one fixed-parameter draw."""
        fit = self._one_fixed_parameter_draw(data)
        return {name: tuple(np.shape(fit.stan_variable(name))[1:]) for name in fit.metadata.stan_vars}

    def constrain(self, data, theta, include_gqs=True):
        return self._bridgestan(data).constrain(theta, include_gqs)

    def unconstrain(self, data, values):
        return self._bridgestan(data).unconstrain(values)

    def sample(self, data, settings: NutsSettings, inits=None):
        fit = self.model.sample(
            data=data,
            chains=settings.chains,
            parallel_chains=min(settings.chains, os.cpu_count() or 1),
            iter_warmup=settings.iter_warmup,
            iter_sampling=settings.iter_sampling,
            thin=settings.thin,
            seed=settings.seed,
            inits=inits,
            adapt_delta=settings.adapt_delta,
            max_treedepth=settings.max_treedepth,
            show_progress=settings.show_progress,
        )
        chains, draws = settings.chains, fit.num_draws_sampling
        variables = {}
        for name in fit.metadata.stan_vars:
            values = np.asarray(fit.stan_variable(name))
            variables[name] = values.reshape((chains, draws) + values.shape[1:])
        sampler = {k: np.asarray(v).T for k, v in fit.method_variables().items()}  # (draws, chains) -> (chains, draws)
        return RawDraws(variables, sampler, backend=fit)


    def generated_quantities(self, data, parameters, seed, backend=None):
        """CmdStan's standalone generated quantities (CmdStanPy's ``generate_quantities``) on the
        sampler's own output when ``backend`` is a CmdStanPy fit; otherwise (draws made in Python,
        e.g. by Rob-ULA) each draw through BridgeStan, chain c with an RNG seeded by seed + c."""
        import cmdstanpy

        chains, draws, _ = parameters.shape
        fit_types = tuple(getattr(cmdstanpy, name) for name in ("CmdStanMCMC", "CmdStanVB", "CmdStanLaplace",
                                                                 "CmdStanPathfinder") if hasattr(cmdstanpy, name))
        if isinstance(backend, fit_types):
            gq = self.model.generate_quantities(data=data, previous_fit=backend, seed=seed, show_console=False)
            out = {}
            for name in gq.metadata.stan_vars:
                values = np.asarray(gq.stan_variable(name))
                out[name] = values.reshape((chains, draws) + values.shape[1:])
            return out
        model = self._bridgestan(data)
        columns = None
        for c in range(chains):
            rng = model.new_rng(int(seed) + c)
            for t in range(draws):
                if not np.all(np.isfinite(parameters[c, t])):
                    continue
                theta = model.model.param_unconstrain(np.ascontiguousarray(parameters[c, t]))
                values = model.model.param_constrain(theta, include_tp=True, include_gq=True, rng=rng)
                if columns is None:
                    columns = np.full((chains, draws, values.size), np.nan)
                columns[c, t] = values
        if columns is None:
            raise RuntimeError("generated quantities: no draw has finite parameters")
        return named_columns(columns, self.variable_shapes(data))


def compile_cmdstan(stan_code: str, show_progress: bool = True) -> tuple[CmdStanProgram, bool]:
    """Compile (or reuse) the program with CmdStanPy; returns it and whether a build ran."""
    import cmdstanpy

    native = uses_native_functions(stan_code)
    folder = cache_folder() / "cmdstan" / build_digest(stan_code)
    folder.mkdir(parents=True, exist_ok=True)
    stan_file = folder / "program.stan"
    if not stan_file.exists() or stan_file.read_text() != stan_code:
        stan_file.write_text(stan_code)
    exe = stan_file.with_suffix("")
    built = not exe.exists()
    if built:
        refuse_build_on_worker("cmdstan")
    model = cmdstanpy.CmdStanModel(
        stan_file=str(stan_file),
        stanc_options={"include-paths": [stan_include_path()], **({"allow-undefined": True} if native else {})},
        user_header=str(native_header_path()) if native else None,
    )
    return CmdStanProgram(stan_code, model), built
