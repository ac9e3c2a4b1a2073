"""A program's model object, built once with its data, called through robust-stan's C interface.

Programs built by the httpstan engine carry ``oracle_interface.hpp`` in their
extension module. Through it (ctypes) a model is constructed once with its
data and the log density and gradient are read from and written to NumPy
buffers, instead of httpstan's functions, which rebuild the model and convert
the data and every parameter to and from Python objects on each call.
"""

from __future__ import annotations

import ctypes
import weakref
from functools import cache
from pathlib import Path

import numpy as np

_BUFFER = ctypes.c_void_p  # a NumPy array's address (``array.ctypes.data``): no pointer object per call
_MESSAGE = ctypes.POINTER(ctypes.c_char_p)

INTERFACE_HEADER = Path(__file__).with_name("oracle_interface.hpp")

#: A line that, anywhere in a program's text, makes the httpstan build define STAN_MODEL_FVAR_VAR
#: (the model's fvar<var> log_prob, for :meth:`NativeProgramWithData.mixed_second_derivatives`).
SECOND_ORDER_MARK = "// robust-stan: built with second-order autodiff (STAN_MODEL_FVAR_VAR)"


@cache
def _library(path: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(path)
    try:
        lib.robust_stan_model_new.restype = ctypes.c_void_p
    except AttributeError:
        raise RuntimeError(f"{path} was built without robust-stan's C interface; delete it from httpstan's cache "
                           "and compile the program again") from None
    lib.robust_stan_model_new.argtypes = [ctypes.c_size_t, ctypes.c_char_p, _BUFFER, ctypes.c_size_t, _BUFFER, _BUFFER,
                                          ctypes.c_size_t, ctypes.c_char_p, _BUFFER, ctypes.c_size_t, _BUFFER, _BUFFER,
                                          _MESSAGE]
    lib.robust_stan_model_free.restype = None
    lib.robust_stan_model_free.argtypes = [ctypes.c_void_p]
    lib.robust_stan_free_message.restype = None
    lib.robust_stan_free_message.argtypes = [ctypes.c_char_p]
    lib.robust_stan_num_params.restype = ctypes.c_size_t
    lib.robust_stan_num_params.argtypes = [ctypes.c_void_p]
    lib.robust_stan_log_density_gradient.restype = ctypes.c_int
    lib.robust_stan_log_density_gradient.argtypes = [ctypes.c_void_p, ctypes.c_int, _BUFFER, _BUFFER, _BUFFER,
                                                     _MESSAGE]
    lib.robust_stan_num_constrained.restype = ctypes.c_size_t
    lib.robust_stan_num_constrained.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    lib.robust_stan_write_array.restype = ctypes.c_int
    lib.robust_stan_write_array.argtypes = [ctypes.c_void_p, _BUFFER, ctypes.c_int, ctypes.c_int, ctypes.c_uint,
                                            _BUFFER, _MESSAGE]
    lib.robust_stan_generated_quantities.restype = ctypes.c_int
    lib.robust_stan_generated_quantities.argtypes = [ctypes.c_void_p, ctypes.c_size_t, _BUFFER, ctypes.c_uint,
                                                     ctypes.c_uint, _BUFFER, _MESSAGE]
    lib.robust_stan_mixed_second_derivatives.restype = ctypes.c_int
    lib.robust_stan_mixed_second_derivatives.argtypes = [ctypes.c_void_p, ctypes.c_int, _BUFFER, ctypes.c_size_t,
                                                         _BUFFER, _MESSAGE]
    return lib


def _take_message(lib: ctypes.CDLL, error: ctypes.c_char_p) -> str:
    text = (error.value or b"").decode(errors="replace")
    lib.robust_stan_free_message(error)
    return text


def split_data(data: dict) -> tuple:
    """Stan data in stan::io::array_var_context's layout, as NumPy arrays: (real names,
    real values, real shapes, int names, int values, int shapes). Values are flattened in
    column-major order; floating-point arrays are reals and integer arrays ints (the same
    split as httpstan's ``_split_data``, without a Python object per number)."""
    split: dict[str, tuple[list, list, list]] = {"real": ([], [], []), "int": ([], [], [])}
    for name, value in data.items():
        array = np.asarray(value)
        if np.issubdtype(array.dtype, np.floating):
            kind = "real"
        elif np.issubdtype(array.dtype, np.integer):
            kind = "int"
        else:
            raise ValueError(f"data: variable {name!r} must be int or float, got dtype {array.dtype}")
        names, values, shapes = split[kind]
        names.append(name)
        values.append(np.ravel(array, order="F"))
        shapes.append(array.shape)
    (names_r, values_r, shapes_r), (names_i, values_i, shapes_i) = split["real"], split["int"]
    return (names_r, np.concatenate(values_r or [np.empty(0)]).astype(float), shapes_r,
            names_i, np.concatenate(values_i or [np.empty(0)]).astype(np.intc), shapes_i)


def _names(names) -> bytes:
    return "\n".join(names).encode()


def _dims(shapes) -> tuple[np.ndarray, np.ndarray]:
    counts = np.array([len(shape) for shape in shapes], dtype=np.uintp)
    flat = np.array([size for shape in shapes for size in shape], dtype=np.uintp)
    return counts, flat


class NativeProgramWithData:
    """A compiled program (httpstan's build, loaded natively) with its data (a dict of NumPy arrays
    and numbers), for repeated calls."""

    def __init__(self, library_path: str, data: dict):
        self._lib = lib = _library(str(library_path))
        names_r, values_r, shapes_r, names_i, values_i, shapes_i = split_data(data)
        counts_r, flat_r = _dims(shapes_r)
        counts_i, flat_i = _dims(shapes_i)
        error = ctypes.c_char_p()
        handle = lib.robust_stan_model_new(
            len(names_r), _names(names_r), values_r.ctypes.data, values_r.size, counts_r.ctypes.data,
            flat_r.ctypes.data, len(names_i), _names(names_i), values_i.ctypes.data, values_i.size,
            counts_i.ctypes.data, flat_i.ctypes.data, ctypes.byref(error))
        if not handle:
            raise ValueError(f"Stan rejected the data: {_take_message(lib, error)}")
        self._handle = ctypes.c_void_p(handle)
        self.dimension = int(lib.robust_stan_num_params(self._handle))
        weakref.finalize(self, lib.robust_stan_model_free, self._handle)

    def _point(self, theta) -> np.ndarray:
        theta = np.ascontiguousarray(theta, dtype=float)
        if theta.shape != (self.dimension,):
            raise ValueError(f"theta: expected {self.dimension} unconstrained values, got shape {theta.shape}")
        return theta

    def log_density_gradient(self, theta: np.ndarray, jacobian: bool = True,
                             gradient: bool = True) -> tuple[float, np.ndarray | None]:
        """Log density (constants of ``~`` statements dropped) and, unless ``gradient`` is False, its gradient.

        Raises ValueError where Stan raises a domain error (e.g. a scale that
        is not positive), RuntimeError for any other error.
        """
        theta = self._point(theta)
        grad = np.empty(self.dimension) if gradient else None
        value = ctypes.c_double()
        error = ctypes.c_char_p()
        status = self._lib.robust_stan_log_density_gradient(
            self._handle, int(bool(jacobian)), theta.ctypes.data, ctypes.byref(value),
            grad.ctypes.data if grad is not None else None, ctypes.byref(error))
        if status:
            message = _take_message(self._lib, error)
            raise (ValueError if status == 1 else RuntimeError)(message)
        return value.value, grad

    def write_array(self, theta: np.ndarray, include_tp: bool = True, include_gqs: bool = True,
                    seed: int = 0) -> np.ndarray:
        """Stan's constrained values at theta: the parameters, then (if asked) the transformed
        parameters and the generated quantities, flat in Stan's order. The generated
        quantities' random numbers come from an RNG started with ``seed``."""
        theta = self._point(theta)
        out = np.empty(self._lib.robust_stan_num_constrained(self._handle, int(include_tp), int(include_gqs)))
        error = ctypes.c_char_p()
        if self._lib.robust_stan_write_array(self._handle, theta.ctypes.data, int(include_tp), int(include_gqs),
                                             int(seed) % 2**32, out.ctypes.data, ctypes.byref(error)):
            raise RuntimeError(_take_message(self._lib, error))
        return out

    def generated_quantities(self, constrained: np.ndarray, seed: int, chain: int) -> np.ndarray:
        """Stan's standalone generated quantities for one chain: ``constrained`` (draws, k) holds the
        constrained parameters of each draw in Stan's order; returns (draws, all constrained values),
        the generated quantities' random numbers drawn in draw order from Stan's RNG for
        (``seed``, ``chain``), as CmdStan's generate_quantities does. One call for the chain."""
        constrained = np.ascontiguousarray(constrained, dtype=float)
        expected = self._lib.robust_stan_num_constrained(self._handle, 0, 0)
        if constrained.ndim != 2 or constrained.shape[1] != expected:
            raise ValueError(f"constrained: expected (draws, {expected}) parameter values, got {constrained.shape}")
        out = np.empty((constrained.shape[0], self._lib.robust_stan_num_constrained(self._handle, 1, 1)))
        error = ctypes.c_char_p()
        if self._lib.robust_stan_generated_quantities(self._handle, constrained.shape[0], constrained.ctypes.data,
                                                      int(seed) % 2**32, int(chain), out.ctypes.data,
                                                      ctypes.byref(error)):
            raise RuntimeError(_take_message(self._lib, error))
        return out

    def mixed_second_derivatives(self, theta: np.ndarray, n_first: int, jacobian: bool = True) -> np.ndarray:
        """(dimension - n_first, n_first): d^2 log density / (d theta_j d theta_k) for j past the first
        ``n_first`` coordinates and k among them, by forward over reverse mode (n_first sweeps).
        Needs a program built with second-order autodiff (:data:`SECOND_ORDER_MARK`); raises
        RuntimeError otherwise, ValueError where Stan raises a domain error."""
        theta = self._point(theta)
        if not 0 <= n_first <= self.dimension:
            raise ValueError(f"n_first: must lie in 0..{self.dimension}, got {n_first}")
        out = np.empty((self.dimension - n_first, n_first))
        error = ctypes.c_char_p()
        status = self._lib.robust_stan_mixed_second_derivatives(self._handle, int(bool(jacobian)), theta.ctypes.data,
                                                                int(n_first), out.ctypes.data, ctypes.byref(error))
        if status:
            message = _take_message(self._lib, error)
            raise (ValueError if status == 1 else RuntimeError)(message)
        return out
