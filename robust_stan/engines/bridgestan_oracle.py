"""BridgeStan models of generated programs (optional; needs a BridgeStan source tree).

BridgeStan compiles against its own source tree, found through the
``BRIDGESTAN`` environment variable or bridgestan's own lookup. It is used as
a gradient oracle and for constrain/unconstrain on the CmdStan engine.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..building.codegen import expand_includes
from ..common.resources import build_digest, native_header_path, uses_native_functions
from .base import cache_folder


def bridgestan_available() -> bool:
    """True when the bridgestan package is installed and finds a BridgeStan source tree
    ($BRIDGESTAN or its default folder). Never downloads one. The answer is kept per
    value of $BRIDGESTAN (oracles ask on every minibatch)."""
    return _bridgestan_found(os.environ.get("BRIDGESTAN"))


@lru_cache(maxsize=4)
def _bridgestan_found(bridgestan_variable: str | None) -> bool:
    # bridgestan reads $BRIDGESTAN itself; the argument only keys the cache
    try:
        from bridgestan.compile import get_bridgestan_path, verify_bridgestan_path
    except ImportError:
        return False
    with contextlib.redirect_stdout(io.StringIO()):  # it prints when nothing is found
        path = get_bridgestan_path(download=False)
    try:
        verify_bridgestan_path(path)
    except (ValueError, TypeError):
        return False
    return bool(path)


@lru_cache(maxsize=8)
def _compiled_library(stan_code: str) -> str:
    import bridgestan

    code = expand_includes(stan_code)
    native = uses_native_functions(code)
    folder = cache_folder() / "bridgestan" / build_digest(code)
    folder.mkdir(parents=True, exist_ok=True)
    stan_file = folder / "program.stan"
    stan_file.write_text(code)
    library = folder / "program_model.so"
    if not library.exists():
        library = Path(bridgestan.compile_model(
            str(stan_file), stanc_args=["--allow-undefined"] if native else [],
            make_args=[f"USER_HEADER={native_header_path()}"] if native else []))
    return str(library)


#: Libraries this process has loaded through BridgeStan.
_LOADED_LIBRARIES: set[str] = set()


class BridgeStanProgramWithData:
    """A compiled program with its data on BridgeStan (a bridgestan.StanModel), with named
    constrain/unconstrain."""

    def __init__(self, stan_code: str, data: dict):
        import bridgestan

        library = _compiled_library(stan_code)
        # A model with new data loads its library again (dlopen hands back the loaded copy).
        # BridgeStan warns on every reload in case the file changed; ours are named by the
        # digest of their program, so a path never changes content: warn only on the first load.
        self.model = bridgestan.StanModel(library, data=json.dumps(_jsonable(data)),
                                          warn=library not in _LOADED_LIBRARIES)
        _LOADED_LIBRARIES.add(library)

    def log_density_gradient(self, theta, jacobian=True):
        value, grad = self.model.log_density_gradient(np.asarray(theta, dtype=float), propto=True, jacobian=jacobian)
        return float(value), np.asarray(grad)

    def constrain(self, theta, include_gqs=True, rng=None):
        """Named constrained values; generated quantities need ``rng`` (from :meth:`new_rng`)."""
        if include_gqs and rng is None:
            rng = self.new_rng(0)
        flat = self.model.param_constrain(np.asarray(theta, dtype=float), include_tp=True, include_gq=include_gqs,
                                          rng=rng if include_gqs else None)
        names = self.model.param_names(include_tp=True, include_gq=include_gqs)
        return _group_columns(names, flat)

    def new_rng(self, seed: int):
        """BridgeStan's random number generator for generated quantities."""
        return self.model.new_rng(seed=int(seed))

    def unconstrain(self, values):
        return self.model.param_unconstrain_json(json.dumps(_jsonable(values)))


def bridgestan_model(stan_code: str, data: dict) -> BridgeStanProgramWithData:
    return BridgeStanProgramWithData(stan_code, data)


def _jsonable(data: dict) -> dict:
    return {k: (np.asarray(v).tolist()) for k, v in data.items()}


def _group_columns(names: list[str], flat: np.ndarray) -> dict[str, float | np.ndarray]:
    """BridgeStan names columns 'b.1.2' in column-major order; rebuild arrays."""
    groups: dict[str, list[tuple[tuple[int, ...], float]]] = {}
    for name, value in zip(names, flat):
        base, *idx = name.split(".")
        groups.setdefault(base, []).append((tuple(int(i) for i in idx), float(value)))
    out: dict[str, float | np.ndarray] = {}
    for base, items in groups.items():
        if not items[0][0]:
            out[base] = items[0][1]
            continue
        shape = tuple(max(i[d] for i, _ in items) for d in range(len(items[0][0])))
        arr = np.empty(shape)
        for index, value in items:
            arr[tuple(i - 1 for i in index)] = value
        out[base] = arr
    return out
