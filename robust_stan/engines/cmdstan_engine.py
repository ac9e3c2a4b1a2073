"""The CmdStan engine, through CmdStanPy.

Programs are written to robust-stan's cache folder under the hash of their
text and compiled by CmdStanPy with the library's include path, so a second
process finds the executable and does not recompile. NUTS runs through
``CmdStanModel.sample``; log densities and gradients at unconstrained points
come from CmdStan's ``log_prob`` method (which takes ``unconstrained_params``),
and generated quantities from CmdStan's ``generate_quantities`` method run on
the draws directly (CmdStanPy's ``generate_quantities`` takes only NUTS, ADVI
and optimisation fits and runs every chain with the same RNG stream). Every
CSV CmdStan writes for robust-stan carries ``SIG_FIGS`` significant digits.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from ..common.resources import build_digest, native_header_path, stan_include_path, uses_native_functions
from .base import CompiledProgram, NutsSettings, RawDraws, cache_folder, refuse_build_on_worker
from .build_files import BuildFiles, read_build_files

SIG_FIGS = 18  # the most CmdStan writes (its default is 6)


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
        self._shapes: dict[str, tuple[dict[str, tuple[int, ...]], list[str]]] = {}

    def _run_method(self, data: dict, folder: Path, arguments: list[str], output: Path) -> None:
        """Run the executable's CmdStan ``arguments`` (a method and its settings) on ``data``,
        writing ``output``; a RuntimeError with CmdStan's messages when it fails."""
        from cmdstanpy.utils import write_stan_json

        data_file = folder / "data.json"
        write_stan_json(str(data_file), data)
        command = [str(self.model.exe_file), *arguments, "data", f"file={data_file}",
                   "output", f"file={output}", f"sig_figs={SIG_FIGS}"]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"CmdStan {arguments[0]} failed: {done.stdout}\n{done.stderr}")

    def _run_log_prob(self, data: dict, theta: np.ndarray, jacobian: bool) -> tuple[float, np.ndarray]:
        with tempfile.TemporaryDirectory(prefix="robust_stan_") as tmp:
            params_file = Path(tmp) / "params.json"
            output_file = Path(tmp) / "log_prob.csv"
            params_file.write_text(json.dumps({"params_r": [float(t) for t in theta]}))
            self._run_method(data, Path(tmp), ["log_prob", f"unconstrained_params={params_file}",
                                               f"jacobian={int(bool(jacobian))}"], output_file)
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
        return self._draw_columns(data)[0]

    def _draw_columns(self, data) -> tuple[dict[str, tuple[int, ...]], list[str]]:
        """The variables' shapes and the flat names of their CSV columns (no sampler columns),
        from one fixed-parameter draw per data set. Zero-size variables have no column in
        CmdStan's CSV, so they are absent from both."""
        key = json.dumps({k: np.asarray(v).tolist() for k, v in data.items()}, sort_keys=True)
        if key not in self._shapes:
            fit = self._one_fixed_parameter_draw(data)
            shapes = {name: tuple(np.shape(fit.stan_variable(name))[1:]) for name in fit.metadata.stan_vars}
            header = _read_stan_csv(Path(fit.runset.csv_files[0]))[0]  # CmdStan's names (CmdStanPy's use brackets)
            self._shapes[key] = (shapes, [c for c in header.split(",") if not c.endswith("__")])
        return self._shapes[key]

    def _one_fixed_parameter_draw(self, data):
        """One fixed-parameter draw by CmdStan (no BridgeStan needed), for shapes and sizes."""
        return self.model.sample(data=data, chains=1, iter_sampling=1, fixed_param=True, seed=1,
                                 show_progress=False, show_console=False)

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
            sig_figs=SIG_FIGS,
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
        """CmdStan's standalone generated quantities on the draws in ``parameters``, whatever
        made them (NUTS, ADVI, Pathfinder, Laplace, or Python such as Rob-ULA): each chain's
        finite draws go to a CSV, and one ``generate_quantities`` run with ``num_chains`` gives
        chain c the RNG stream (``seed``, c + 1). Before CmdStan 2.35 a run holds one chain and
        always uses stream (its seed, 1), so chain c runs alone with a seed drawn from
        (``seed``, c + 1). ``backend`` is not needed."""
        import stanio
        from cmdstanpy.utils import cmdstan_version_before

        chains, draws, k = parameters.shape
        names = self._draw_columns(data)[1][:k]
        if len(names) != k:
            raise ValueError(f"parameters: the program has {len(names)} constrained parameter values, got {k}")
        finite = np.all(np.isfinite(parameters), axis=2)
        if not finite.any():
            raise RuntimeError("generated quantities: no draw has finite parameters")
        placeholder = parameters[finite][:1]  # for a chain with no finite draw; its output is dropped
        out: dict[str, np.ndarray] = {}
        with tempfile.TemporaryDirectory(prefix="robust_stan_") as tmp:
            folder = Path(tmp)
            for c in range(chains):  # num_chains reads fitted_params=draws.csv as draws_1.csv, draws_2.csv, ...
                with open(folder / f"draws_{c + 1}.csv", "w") as stream:
                    stream.write(",".join(names) + "\n")
                    np.savetxt(stream, parameters[c, finite[c]] if finite[c].any() else placeholder,
                               delimiter=",", fmt="%.17g")
            if chains == 1 or cmdstan_version_before(2, 35):
                for c in range(chains):
                    chain_seed = seed if chains == 1 else _chain_seed(seed, c)
                    fitted = folder / f"draws_{c + 1}.csv"
                    self._run_method(data, folder, ["generate_quantities", f"fitted_params={fitted}",
                                                    "random", f"seed={int(chain_seed) % 2**32}"],
                                     folder / f"gq_{c + 1}.csv")
            else:
                self._run_method(data, folder, ["generate_quantities", f"fitted_params={folder / 'draws.csv'}",
                                                f"num_chains={chains}", "random", f"seed={int(seed) % 2**32}"],
                                 folder / "gq.csv")  # written as gq_1.csv, gq_2.csv, ...
            for c in np.flatnonzero(finite.any(axis=1)).tolist():
                header, values = _read_stan_csv(folder / f"gq_{c + 1}.csv")
                if values.shape[1] == len(header.split(",")) + k:
                    values = values[:, k:]  # CmdStan 2.35's num_chains rows lead with the parameters, unnamed
                for name, variable in stanio.parse_header(header).items():
                    filled = out.setdefault(name, np.full((chains, draws, *variable.dimensions), np.nan))
                    filled[c, finite[c]] = variable.extract_reshape(values)
        return out


def _chain_seed(seed: int, chain: int) -> int:
    """A 32-bit seed drawn from (seed, chain + 1), for CmdStan runs that hold one chain."""
    return int(np.random.SeedSequence([int(seed) % 2**32, chain + 1]).generate_state(1)[0])


def _read_stan_csv(path: Path) -> tuple[str, np.ndarray]:
    """A Stan CSV's header row and its values as (rows, columns), even for one row or column."""
    with open(path) as stream:
        while (header := stream.readline()).startswith("#"):
            pass
        values = np.loadtxt(stream, delimiter=",", comments="#", ndmin=2)
    return header.strip(), values


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
