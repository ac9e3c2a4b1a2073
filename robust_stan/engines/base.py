"""The small interface every Stan engine implements."""

from __future__ import annotations

import abc
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..common.cluster import ON_WORKER
from ..common.errors import RobustStanInputError, require_count


@dataclass
class RawDraws:
    """NUTS output in engine-neutral form.

    Parameters
    ----------
    variables : dict of numpy.ndarray
        Each Stan variable as an array ``(chains, draws, *shape)``.
    sampler : dict of numpy.ndarray
        Each sampler statistic (``lp__``, ``divergent__``, ...) as (chains, draws).
    backend : object, default None
        The engine's own result object.
    seconds : dict of float, default {}
        Wall times of the run's stages.
    """

    variables: dict[str, np.ndarray]
    sampler: dict[str, np.ndarray]
    backend: Any = None
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class NutsSettings:
    """Arguments of Stan's NUTS, named as in CmdStanPy, checked when made (an error names the
    argument), as CmdStanPy's ``SamplerArgs.validate`` checks them.

    Parameters
    ----------
    chains, iter_warmup, iter_sampling, thin, max_treedepth : int
        Counts: at least 1 (``iter_warmup`` at least 0).
    seed : int
        Stan's seed, at least 0 (:func:`robust_stan.methods.nuts.nuts_settings` draws one for None).
    adapt_delta : float
        The target acceptance rate, in (0, 1).
    show_progress : bool
        Show a progress bar.

    Raises
    ------
    RobustStanInputError
        If a value is out of range.
    """

    chains: int = 4
    iter_warmup: int = 1000
    iter_sampling: int = 1000
    thin: int = 1
    seed: int = 0
    adapt_delta: float = 0.8
    max_treedepth: int = 10
    show_progress: bool = True

    def __post_init__(self) -> None:
        for name in ("chains", "iter_warmup", "iter_sampling", "thin", "seed", "max_treedepth"):
            low = 0 if name in ("iter_warmup", "seed") else 1
            object.__setattr__(self, name, require_count(name, getattr(self, name), low))
        if isinstance(self.adapt_delta, bool) or not isinstance(self.adapt_delta, (int, float, np.number)) \
                or not 0 < self.adapt_delta < 1:
            raise RobustStanInputError(f"adapt_delta: must lie in (0, 1), got {self.adapt_delta!r}")
        object.__setattr__(self, "adapt_delta", float(self.adapt_delta))
        object.__setattr__(self, "show_progress", bool(self.show_progress))


class CompiledProgram(abc.ABC):
    """A compiled Stan program on one engine: log densities, gradients, NUTS.

    Parameters
    ----------
    stan_code : str
        The program's text.
    """

    engine_name: str = ""

    def __init__(self, stan_code: str):
        self.stan_code = stan_code

    @abc.abstractmethod
    def log_density(self, data: dict, theta: np.ndarray, jacobian: bool = True) -> float:
        """Log density (target) at an unconstrained point, constants included.

        Parameters
        ----------
        data : dict
            Stan data.
        theta : numpy.ndarray
            The unconstrained point.
        jacobian : bool, default True
            Include the log Jacobian of the constraining transform.

        Returns
        -------
        float
            The target, constants included.
        """

    @abc.abstractmethod
    def log_density_gradient(self, data: dict, theta: np.ndarray, jacobian: bool = True) -> tuple[float, np.ndarray]:
        """Log density and its gradient with respect to the unconstrained parameters.

        Parameters
        ----------
        data, theta, jacobian
            The Stan data, unconstrained point and Jacobian switch of :meth:`log_density`.

        Returns
        -------
        log_density : float
            The log density.
        gradient : numpy.ndarray
            Its gradient.
        """

    @abc.abstractmethod
    def unconstrained_dimension(self, data: dict) -> int:
        """Number of unconstrained parameters of the program with these data.

        Parameters
        ----------
        data : dict
            Stan data.

        Returns
        -------
        int
            The dimension.
        """

    @abc.abstractmethod
    def variable_shapes(self, data: dict) -> dict[str, tuple[int, ...]]:
        """Constrained shape of every parameter and generated quantity, in program order.

        Parameters
        ----------
        data : dict
            Stan data (sizes may depend on them).

        Returns
        -------
        dict of tuple of int
            Shapes by variable name.
        """

    @abc.abstractmethod
    def constrain(self, data: dict, theta: np.ndarray, include_gqs: bool = True) -> dict[str, np.ndarray]:
        """Constrained values of every parameter (and generated quantity) at an unconstrained point.

        Parameters
        ----------
        data, theta
            As for :meth:`log_density`.
        include_gqs : bool, default True
            Also the transformed parameters and generated quantities.

        Returns
        -------
        dict of numpy.ndarray
            Values by variable name.
        """

    @abc.abstractmethod
    def unconstrain(self, data: dict, values: dict[str, Any]) -> np.ndarray:
        """Unconstrained vector of a dict of constrained parameter values.

        Parameters
        ----------
        data : dict
            Stan data.
        values : dict
            Every parameter's constrained value by name.

        Returns
        -------
        numpy.ndarray
            The unconstrained point.
        """

    @abc.abstractmethod
    def sample(self, data: dict, settings: NutsSettings, inits: list[dict] | None) -> RawDraws:
        """Run NUTS (diagonal metric, adapted).

        Parameters
        ----------
        data : dict
            Stan data.
        settings : NutsSettings
            Chains, iterations, seed and the sampler's settings.
        inits : list of dict or None
            One dict of constrained starting values per chain; None leaves the starts to Stan.

        Returns
        -------
        RawDraws
            The draws.
        """

    @abc.abstractmethod
    def generated_quantities(self, data: dict, parameters: np.ndarray, seed: int,
                             backend: Any = None) -> dict[str, np.ndarray]:
        """Every Stan variable recomputed from parameter draws (Stan's standalone generated quantities).

        Chain c's random numbers come from Stan's RNG for (``seed``, c + 1), in draw order. Draws with
        a non-finite parameter give NaN.

        Parameters
        ----------
        data : dict
            Stan data.
        parameters : numpy.ndarray
            (chains, draws, k): each draw's constrained parameters flat in Stan's order
            (``parameter_columns``).
        seed : int
            Seed of the generated quantities' random numbers.
        backend : object, default None
            The sampler's own result (``RawDraws.backend``), which an engine may use instead.

        Returns
        -------
        dict of numpy.ndarray
            Each variable as ``(chains, draws, *shape)``.
        """

    def build_files(self):
        """The build's files, for workers without this machine's cache (``rs.Cluster(ship_builds=True)``)."""
        raise NotImplementedError(f"ship_builds: the {self.engine_name} engine cannot send its builds to workers")


def parameter_columns(variables: dict[str, np.ndarray], names: list[str]) -> np.ndarray:
    """(chains, draws, k): the variables ``names`` of each draw, flat in Stan's order (variables in
    turn, each column-major), as Stan's write_array writes them."""
    blocks = []
    for name in names:
        values = np.asarray(variables[name], dtype=float)
        trailing = list(range(values.ndim - 1, 1, -1))  # column-major: the first index runs fastest
        blocks.append(values.transpose([0, 1] + trailing).reshape(values.shape[:2] + (-1,)))
    return np.concatenate(blocks, axis=2)


def named_columns(columns: np.ndarray, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Flat Stan values (chains, draws, all) as {name: (chains, draws, *shape)}, in ``shapes``'
    order (the inverse of ``parameter_columns``)."""
    out, pos = {}, 0
    for name, shape in shapes.items():
        size = int(np.prod(shape)) if shape else 1
        block = columns[:, :, pos:pos + size]
        out[name] = block.reshape(block.shape[:2] + tuple(shape), order="F") if shape else block[:, :, 0]
        pos += size
    return out


def named_values(flat, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The flat values of one draw as {name: array of its shape} (:func:`named_columns` for one
    draw); names past the end of ``flat`` (generated quantities left out) are left out."""
    flat = np.asarray(flat, dtype=float)
    present, size = {}, 0
    for name, shape in shapes.items():
        if size >= flat.size:
            break
        present[name] = shape
        size += int(np.prod(shape)) if shape else 1
    return {name: values[0, 0] for name, values in named_columns(flat[None, None, :size], present).items()}


def refuse_build_on_worker(engine: str) -> None:
    """An error naming the way out when a cluster worker would have to compile a program: a
    15-60 s build on every worker is never what a cluster run wants."""
    if os.environ.get(ON_WORKER) == "1":
        raise RobustStanInputError(
            f"model: the compiled program is not in this worker's {engine} build cache, and workers do not compile. "
            "Give the workers this machine's cache (a shared file system, and the same Python executable path for "
            "httpstan, which names builds by it) or pass ship_builds=True to rs.Cluster to send them the build")


def cache_folder() -> Path:
    """Where compiled CmdStan and BridgeStan programs are kept, one folder per engine below it
    (``ROBUST_STAN_CACHE`` overrides ~/.cache/robust-stan)."""
    return Path(os.environ.get("ROBUST_STAN_CACHE") or Path.home() / ".cache" / "robust-stan")
