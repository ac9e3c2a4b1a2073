"""The pip-only engine: httpstan's compiler driver, extension module and NUTS.

httpstan (the server behind PyStan 3) ships stanc, the Stan headers and a
compiler driver. A program is built once into a Python extension module kept
in httpstan's cache, keyed by the program text; log densities and gradients
call robust-stan's C interface compiled into the same module
(``oracle_interface.hpp``, bound in ``native_model.py``), and NUTS runs
through httpstan's ``stan::services`` wrapper, one process per chain.
"""

from __future__ import annotations

import asyncio
import fcntl
import gzip
import hashlib
import json
import multiprocessing.util
import os
import re
import shlex
import sys
import time
import uuid
from concurrent.futures.process import BrokenProcessPool

import numpy as np
from tqdm.auto import tqdm

from ..building.codegen import expand_includes
from ..common.digest import digest
from ..common.errors import StanCompileError
from ..common.event_loop import event_loop_running, run_coroutine
from ..common.progress import elapsed_bar
from .base import CompiledProgram, NutsSettings, RawDraws, named_columns, named_values, refuse_build_on_worker
from .build_files import BuildFiles, read_build_files
from .httpstan_build import MODEL_COMPILER_FLAGS, build_in_child, extra_compiler_flags, forced_headers, translate
from .native_model import NativeProgramWithData

_ITERATION = re.compile(rb"Iteration:\s+(\d+)\s*/\s*(\d+)")


def _httpstan():
    import httpstan.cache
    import httpstan.compile
    import httpstan.models
    import httpstan.services_stub

    _give_forked_children_their_own_pool(httpstan.services_stub)
    return httpstan


_FORK_HOOK_REGISTERED = False


def _give_forked_children_their_own_pool(services_stub) -> None:
    """After a fork, replace httpstan's module-level chain pool with a new one.

    The pool's queues are pipes made when httpstan is imported; a forked child
    (a worker of the user's multiprocessing pool) would otherwise share them
    with its parent and siblings, and their chain results would collide.
    """
    global _FORK_HOOK_REGISTERED
    if _FORK_HOOK_REGISTERED:
        return
    _FORK_HOOK_REGISTERED = True
    os.register_at_fork(after_in_child=lambda: _replace_chain_pool(services_stub))


def _replace_chain_pool(services_stub) -> None:
    """Give httpstan a new chain-process pool (after a fork, or after a chain's process died)."""
    import concurrent.futures
    import multiprocessing

    services_stub.executor = concurrent.futures.ProcessPoolExecutor(
        mp_context=multiprocessing.get_context("fork"), initializer=services_stub.init_worker)


_POOL_SHUTDOWN_REGISTERED_IN: set[int] = set()


def _shut_down_httpstan_pool_at_exit(hs) -> None:
    """Stop httpstan's chain-process pool before this process waits for its children.

    httpstan keeps a module-level ProcessPoolExecutor. When NUTS runs inside a
    worker of the user's own multiprocessing pool, that worker exits through
    multiprocessing, which joins every child process without running the
    executor's own shutdown hook, and so waits forever. A multiprocessing
    finalizer runs before that join; it is registered once per process.
    """
    if os.getpid() in _POOL_SHUTDOWN_REGISTERED_IN:
        return
    _POOL_SHUTDOWN_REGISTERED_IN.add(os.getpid())
    multiprocessing.util.Finalize(None, lambda: hs.services_stub.executor.shutdown(wait=True), exitpriority=100)


def _as_httpstan_data(data: dict) -> dict:
    """httpstan reads ints and floats by dtype: keep ints as ints."""
    out = {}
    for key, value in data.items():
        arr = np.asarray(value)
        out[key] = arr if arr.ndim else arr.item()
    return out


def _load_module_of_our_own(model_name: str):
    """Import a program's extension module as an object nothing else can overwrite.

    Every httpstan module is named "stan_services". CPython (3.11) re-imports a
    module it has loaded before by copying that module's functions into
    whatever ``sys.modules["stan_services"]`` is at the time, and httpstan
    re-imports a model before each NUTS run. Left in ``sys.modules``, our
    module of one program would take on another program's functions; kept out
    of it, every import makes a fresh object.
    """
    sys.modules.pop("stan_services", None)
    try:
        return _httpstan().models.import_services_extension_module(model_name)
    finally:
        sys.modules.pop("stan_services", None)


class HttpstanProgram(CompiledProgram):
    """A program compiled into an httpstan extension module."""

    engine_name = "httpstan"

    def __init__(self, stan_code: str, model_name: str, marked_code: str):
        super().__init__(stan_code)
        self.model_name = model_name
        self.marked_code = marked_code  # the text httpstan named the build by (_with_interface_mark)
        self.module = _load_module_of_our_own(model_name)
        self.library_path = self.module.__file__
        self._shapes: dict[str, dict[str, tuple[int, ...]]] = {}

    def native_model(self, data: dict) -> NativeProgramWithData:
        """The model built once with ``data``, for many log density and gradient calls."""
        return NativeProgramWithData(self.library_path, _as_httpstan_data(data))

    def build_files(self) -> BuildFiles:
        """The build's files (the extension module and httpstan's logs; not the generated C++)."""
        folder = _httpstan().cache.model_directory(self.model_name)
        names = sorted(p.name for p in folder.iterdir() if p.is_file() and p.suffix != ".cpp")
        return read_build_files("httpstan", folder, names, self.marked_code)

    # -- densities ------------------------------------------------------------
    def log_density(self, data, theta, jacobian=True):
        return float(self.module.log_prob(_as_httpstan_data(data), list(map(float, theta)), bool(jacobian)))

    def log_density_gradient(self, data, theta, jacobian=True):
        theta = list(map(float, theta))
        grad = self.module.log_prob_grad(_as_httpstan_data(data), theta, bool(jacobian))
        value = self.module.log_prob(_as_httpstan_data(data), theta, bool(jacobian))
        return float(value), np.asarray(grad, dtype=float)

    def unconstrained_dimension(self, data):
        return self.native_model(data).dimension

    def variable_shapes(self, data):
        # httpstan converts the data item by item in Python (37 ms at N = 10,000, against about 2 ms
        # to hash them): keep the shapes by the data's digest
        key = digest(data)
        if key not in self._shapes:
            converted = _as_httpstan_data(data)
            self._shapes[key] = dict(zip(self.module.get_param_names(converted),
                                         (tuple(d) for d in self.module.get_dims(converted))))
        return self._shapes[key]

    def constrain(self, data, theta, include_gqs=True, shapes=None):
        """Named constrained values (``shapes``: :meth:`variable_shapes`, if already known).

        httpstan seeds the generated quantities' RNG with 0 on every call, so
        random generated quantities repeat their noise from call to call.
        """
        data = _as_httpstan_data(data)
        shapes = shapes if shapes is not None else self.variable_shapes(data)
        return named_values(self.module.write_array(data, list(map(float, theta)), True, bool(include_gqs)), shapes)

    def unconstrain(self, data, values):
        return np.asarray(self.module.transform_inits(_as_httpstan_data(data), _as_httpstan_data(values)), dtype=float)

    # -- NUTS -----------------------------------------------------------------
    def sample(self, data, settings: NutsSettings, inits=None):
        hs = _httpstan()
        data = _as_httpstan_data(data)
        shapes = self.variable_shapes(data)
        flat_names = list(self.module.constrained_param_names(data))
        per_chain = settings.iter_warmup + settings.iter_sampling
        bar = tqdm(
            total=settings.chains * per_chain,
            desc="NUTS (httpstan)",
            unit="it",
            disable=not settings.show_progress,
            file=sys.stderr,
        )
        done = [0] * settings.chains
        fit_names = [f"{self.model_name}/fits/{uuid.uuid4().hex[:10]}" for _ in range(settings.chains)]

        def progress(chain: int):
            def callback(message: bytes) -> None:
                found = _ITERATION.findall(message)
                if found:
                    latest = int(found[-1][0])
                    bar.update(latest - done[chain])
                    done[chain] = latest

            return callback

        async def run_all():
            calls = []
            for chain in range(settings.chains):
                init = _as_httpstan_data(inits[chain]) if inits else {}
                calls.append(
                    hs.services_stub.call(
                        "stan::services::sample::hmc_nuts_diag_e_adapt",
                        self.model_name,
                        fit_names[chain],
                        progress(chain),
                        data=data,
                        init=init,
                        random_seed=int(settings.seed),
                        chain=chain + 1,
                        init_radius=2.0,
                        num_warmup=settings.iter_warmup,
                        num_samples=settings.iter_sampling,
                        num_thin=settings.thin,
                        save_warmup=False,
                        refresh=max(1, per_chain // 40),
                        delta=settings.adapt_delta,
                        max_depth=settings.max_treedepth,
                    )
                )
            await asyncio.gather(*calls)

        _shut_down_httpstan_pool_at_exit(hs)
        start = time.perf_counter()
        try:
            if event_loop_running():
                # Inside a running loop (a Jupyter cell) the chains are started from a worker thread
                # (run_coroutine). httpstan forks its chain processes when its pool is first used, and
                # a chain forked from that thread segfaults: Stan's autodiff stack is thread-local and
                # was set up for this thread only. So the processes are forked here, by a no-op task.
                hs.services_stub.executor.submit(int).result()
            run_coroutine(run_all())
        except BrokenProcessPool as exc:
            # a chain's process died (e.g. killed, or out of memory): the pool is unusable from
            # now on, so the next call gets a new one instead of failing the same way
            _replace_chain_pool(hs.services_stub)
            raise RuntimeError(f"Stan (httpstan): a chain's process died while sampling ({exc}); the engine "
                               "has been restarted and the next call will run afresh") from exc
        except RuntimeError as exc:
            raise RuntimeError(f"Stan (httpstan) stopped while sampling: {exc}") from exc
        finally:
            bar.close()
        elapsed = time.perf_counter() - start

        per_chain_rows = []
        for fit_name in fit_names:
            rows = []
            for line in gzip.decompress(hs.cache.load_fit(fit_name)).decode().splitlines():
                if line.startswith('{"version"') and '"topic":"sample"' in line:
                    message = json.loads(line)
                    if isinstance(message["values"], dict):
                        rows.append(message["values"])
            hs.cache.delete_fit(fit_name)
            per_chain_rows.append(rows)
        n_draws = min(len(r) for r in per_chain_rows)
        stat_names = [k for k in per_chain_rows[0][0] if k.endswith("__")]
        sampler = {
            k: np.array([[row[k] for row in rows[:n_draws]] for rows in per_chain_rows]) for k in stat_names
        }
        columns = np.array(
            [[[row[f] for f in flat_names] for row in rows[:n_draws]] for rows in per_chain_rows]
        )  # (chains, draws, flat)
        return RawDraws(named_columns(columns, shapes), sampler, backend=per_chain_rows, seconds={"total": elapsed})

    def generated_quantities(self, data, parameters, seed, backend=None):
        native = self.native_model(data)
        shapes = self.variable_shapes(data)
        chains, draws, _ = parameters.shape
        columns = np.full((chains, draws, sum(int(np.prod(s)) if s else 1 for s in shapes.values())), np.nan)
        for c in range(chains):
            finite = np.all(np.isfinite(parameters[c]), axis=1)
            if finite.any():
                columns[c, finite] = native.generated_quantities(parameters[c, finite], seed, c + 1)
        return named_columns(columns, shapes)


def compile_httpstan(stan_code: str, show_progress: bool = True) -> tuple[HttpstanProgram, bool]:
    """Build (or load from httpstan's cache) the program; returns it and whether a build ran."""
    hs = _httpstan()
    code = expand_includes(stan_code)
    marked = _with_interface_mark(code)
    model_name = hs.models.calculate_model_name(marked)
    lock_path = hs.cache.cache_directory() / "robust_stan_locks" / f"{model_name.split('/')[1]}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    # Processes building the same program (e.g. parallel test workers) take turns;
    # the second finds the first one's build in the cache.
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return HttpstanProgram(code, model_name, marked), False
        except KeyError:  # not built yet
            pass
        except ImportError:  # built, but it does not load here (e.g. by an older robust-stan): build again
            pass
        refuse_build_on_worker("httpstan")
        return _build(hs, code, marked, model_name, show_progress), True


def _with_interface_mark(code: str) -> str:
    """The program text httpstan builds: ``code`` and a comment naming the C interface's version
    (with robust-stan's own compiler flags) and the extra compiler flags (``ROBUST_STAN_CXXFLAGS``), if any.

    httpstan names (and caches) a module by its program text alone; the mark
    makes a module built with another version of ``oracle_interface.hpp`` (or of
    the native losses' header, for a program that uses them), or without it, or
    with other flags, a different program.
    """
    interface = hashlib.sha256(b"".join(header.read_bytes() for header in forced_headers(code))
                               + shlex.join(MODEL_COMPILER_FLAGS).encode()).hexdigest()[:16]
    flags = extra_compiler_flags()
    with_flags = f" and the compiler flags {shlex.join(flags)}" if flags else ""
    return f"{code}\n// built by robust-stan with its C interface {interface}{with_flags}\n"


def _build(hs, code: str, marked: str, model_name: str, show_progress: bool) -> HttpstanProgram:
    """Build ``marked`` (``code`` with the interface mark) into the module named ``model_name``."""
    stan_name = f"model_{model_name.split('/')[1]}"
    try:
        _, warnings = translate(code, stan_name)  # stanc errors surface here, quickly
    except ValueError as exc:
        raise StanCompileError(f"stanc (httpstan {hs.__version__}) cannot compile the program:\n{exc}") from None
    hs.cache.delete_model_directory(model_name)
    hs.cache.dump_stanc_warnings(warnings, model_name)
    try:
        with elapsed_bar("Compiling the Stan program with httpstan (15-60 s, once; cached after)", show_progress):
            output = build_in_child(marked)
    except StanCompileError:
        hs.cache.delete_model_directory(model_name)  # leave no half-built module in the cache
        raise
    hs.cache.dump_services_extension_module_compiler_output(output, model_name)
    return HttpstanProgram(code, model_name, marked)


def httpstan_available() -> bool:
    try:
        _httpstan()
    except ImportError:
        return False
    return True


