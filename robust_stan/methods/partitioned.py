"""Robust means of per-example gradients over data held in row partitions, computed where each
partition lives (the workers of an :class:`rs.Cluster`) and reduced there, so that only one
d-vector per partition and chain travels back to the driver.

The data: a built-in model's data dict whose row-indexed values are Dask arrays (split into row
chunks; the chunks are the partitions) or lists of ``.npy`` paths (one file per partition, read
where the partition's task runs), the other values as usual.

Each step, partition k computes its rows' per-example gradients at every chain's state (one
per-example call, in the chain's coordinates) and the run's estimator on them (its robust mean
m_k and kept share); the driver combines the partitions' means coordinate by coordinate:

- ``combine="median"`` (default): the median of m_1..m_K. Guarantee: if more than half of the
  partitions hold at most a fraction epsilon of corrupted rows, each of those partitions' m_k
  is within the estimator's error bound b of its clean rows' mean, and so is the median in every
  coordinate (more than half of the m_k lie in [mu_j - b, mu_j + b], hence the median does).
  It also resists whole partitions of bad rows (fewer than half of them). With
  ``estimator="mean"`` it is the median of means. Its price: even on clean data the median of
  K means moves about 1.25 sd(m_k) from the pooled mean, which shifts the chain's
  stationary point by a fraction of a posterior sd.
- ``combine="mean"``: the row-weighted mean of m_1..m_K. If every partition holds at most a
  fraction epsilon of corrupted rows, each m_k is within b of its clean mean, and so is the
  average; it is closer to the estimator applied to all rows at once, but one partition full of
  bad rows moves it by (its rows / n) times its error.

On each worker a partition's prepared Stan data and gradient object are kept between steps
(keyed by the run), so a step costs one per-example call per partition plus the estimator.
"""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..building.data import PreparedData, default_prior_scales, prepare_data, with_switches
from ..building.divergences import Divergence
from ..common.cluster import Cluster, require_cluster
from ..common.errors import RobustStanInputError, RobustStanWarning
from ..gradients.per_example import PerExampleGradients
from ..gradients.program import RobustProgram
from .estimators import estimate_each

COMBINES = ("median", "mean")
_ON_THIS_WORKER: dict[tuple[str, int], object] = {}  # (run, partition) -> what the run keeps of it there


PATH_SUFFIXES = (".npy", ".parquet")


def _is_dask_array(value) -> bool:
    return type(value).__module__.startswith("dask.array") and hasattr(value, "chunks")


def _is_dask_frame(value) -> bool:
    """A Dask DataFrame or Series (dask.dataframe, or dask-expr's collections on dask 2024-2025)."""
    return type(value).__module__.split(".")[0] in ("dask", "dask_expr") and hasattr(value, "to_dask_array")


def _is_path_list(value) -> bool:
    """A list of .npy paths, or of .parquet paths: one file per partition."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, (str, Path)) for v in value):
        return False
    return any(all(str(v).endswith(suffix) for v in value) for suffix in PATH_SUFFIXES)


def _is_partitioned_value(value) -> bool:
    return _is_dask_array(value) or _is_dask_frame(value) or _is_path_list(value)


def is_partitioned(data: Mapping) -> bool:
    """Whether ``data`` holds any value as row partitions (a Dask array, DataFrame or Series, or
    a list of .npy or .parquet paths)."""
    return isinstance(data, Mapping) and any(_is_partitioned_value(v) for v in data.values())


PARTITIONED_FORMS = "Dask arrays, DataFrames or Series, or lists of .npy or .parquet paths"


def refuse_cluster_for_rows_here(cluster, method: str) -> None:
    """An error naming ``cluster`` when one is given for data that are all in this process."""
    if cluster is not None:
        raise RobustStanInputError(f"cluster: {method} uses a cluster for rows held in partitions ({PARTITIONED_FORMS} "
                                   "in data); these data are all here, so it runs here")


def unified_dask_values(data: Mapping) -> dict:
    """``data`` with each Dask DataFrame or Series as a Dask array (a DataFrame a matrix of its
    columns, a Series a vector; its row counts are computed, one pass where the rows are), and
    the Dask arrays' row chunks unified: a partition boundary of any of them is one of all
    (dask.array's ``unify_chunks``: chunks are split, never merged). Dask may partition two
    column selections of one frame differently (``read_parquet`` joins small files for fewer
    columns), hence the unification. A column that is not numeric is an error."""
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    out = dict(data)
    for name, value in data.items():
        if not _is_dask_frame(value):
            continue
        dtypes = value.dtypes.to_dict() if value.ndim == 2 else {value.name: value.dtype}
        bad = {column: str(dtype) for column, dtype in dtypes.items()
               if not (is_numeric_dtype(dtype) or is_bool_dtype(dtype))}
        if bad:
            raise RobustStanInputError(f"data[{name!r}]: every column must be numeric; not {bad}")
        if hasattr(value, "optimize"):  # the partitions it computes, so that the row counts are theirs
            value = value.optimize()
        out[name] = value.astype(float).to_dask_array(lengths=True)
    arrays = [name for name, value in out.items() if _is_dask_array(value)]
    if len({out[name].chunks[0] for name in arrays}) > 1:
        from dask.array.core import unify_chunks

        letters = iter("abcdefghjklmnopqrstuvwxyz")  # "i" indexes the rows; each other axis its own letter
        pairs = [(out[name], "i" + "".join(next(letters) for _ in range(out[name].ndim - 1))) for name in arrays]
        try:
            _, unified = unify_chunks(*[item for pair in pairs for item in pair])
        except ValueError as exc:  # different numbers of rows
            raise RobustStanInputError(f"data: the Dask values {arrays} have different numbers of rows: {exc}") from exc
        out.update(zip(arrays, unified))
    return out


def _read_parquet(path: str) -> np.ndarray:
    """A Parquet file's table as an array: a vector when it has one column, else a matrix."""
    import pyarrow.parquet as pq

    table = pq.read_table(path).to_pandas().to_numpy()
    return table[:, 0] if table.shape[1] == 1 else table


def _parquet_shape(path: str) -> tuple[int, ...]:
    import pyarrow.parquet as pq

    meta = pq.read_metadata(path)
    return (meta.num_rows,) if meta.num_columns == 1 else (meta.num_rows, meta.num_columns)


def _path_shape(path: str) -> tuple[int, ...]:
    return _parquet_shape(path) if path.endswith(".parquet") else tuple(np.load(path, mmap_mode="r").shape)


@dataclass(frozen=True)
class Partitions:
    """A data dict split by rows: ``parts[k]`` maps each name to partition k's values (a NumPy
    array, a Dask future or a .npy path); ``rows[k]`` its row count; ``shared`` the values every
    partition takes whole."""

    parts: list[dict]
    rows: list[int]
    shared: dict

    @property
    def n(self) -> int:
        return int(sum(self.rows))


def split_partitions(data: Mapping) -> Partitions:
    """The row partitions of ``data``, checked: every partitioned value with the same number of
    partitions and rows per partition, and every partition of a value with the same trailing shape."""
    partitioned = {name: v for name, v in data.items() if _is_dask_array(v) or _is_path_list(v)}
    shared = {name: v for name, v in data.items() if name not in partitioned}
    pieces: dict[str, list] = {}
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for name, value in partitioned.items():
        if _is_dask_array(value):
            if value.ndim > 1 and len(value.chunks[1]) > 1:
                value = value.rechunk({i: -1 for i in range(1, value.ndim)})  # rows only are split
            pieces[name] = list(value.to_delayed().ravel())
            shapes[name] = [(rows, *value.shape[1:]) for rows in value.chunks[0]]
        else:
            pieces[name] = [str(p) for p in value]
            shapes[name] = []
            for path in value:
                try:
                    shapes[name].append(_path_shape(str(path)))
                except (OSError, ValueError) as exc:
                    raise RobustStanInputError(f"data[{name!r}]: cannot read {path}: {exc}") from exc
    counts = {name: len(p) for name, p in pieces.items()}
    if len(set(counts.values())) != 1:
        raise RobustStanInputError(f"data: the partitioned values have different numbers of partitions: {counts}")
    rows = None
    for name, value_shapes in shapes.items():
        trailing = {shape[1:] for shape in value_shapes}
        if len(trailing) > 1:
            raise RobustStanInputError(f"data[{name!r}]: its partitions have different column counts "
                                       f"(shapes {[tuple(s) for s in value_shapes]})")
        these = [shape[0] for shape in value_shapes]
        if rows is None:
            rows = these
        elif these != rows:
            raise RobustStanInputError(f"data[{name!r}]: its partitions' row counts {these} differ from the other "
                                       f"values' {rows}")
    kept = [k for k in range(len(rows)) if rows[k] > 0]  # a partition without rows has nothing to add
    if not kept:
        raise RobustStanInputError("data: every partition is empty")
    parts = [{name: pieces[name][k] for name in pieces} for k in kept]
    return Partitions(parts, [rows[k] for k in kept], shared)


def load_partition_value(value, rows: np.ndarray | None = None) -> np.ndarray:
    """A partition's value as an array (a .npy or .parquet path is read; a computed Dask chunk is
    taken as it is), or only its rows ``rows`` (then a .npy file is mapped, not read whole)."""
    if isinstance(value, str) and value.endswith(".parquet"):
        table = _read_parquet(value)
        return table if rows is None else table[rows]
    if rows is None:
        return np.load(value) if isinstance(value, str) else np.asarray(value)
    return np.array(np.load(value, mmap_mode="r")[rows]) if isinstance(value, str) else np.asarray(value)[rows]


def prepare_rows(spec, values: Mapping, divergence: Divergence, learning_rate: float) -> PreparedData:
    """Some of the rows (a partition, the first row, a coreset's) prepared as posterior data.
    Without the check that a beta loss leaves the data enough weight, which is about all the
    rows, not a part of them."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RobustStanWarning)
        stan_data, scaling = prepare_data(spec, values, divergence, learning_rate, None, "posterior", None)
    return PreparedData(values, stan_data, scaling, divergence)


def partition_stan_data(program: RobustProgram, part: dict, shared: dict, divergence: Divergence,
                        learning_rate: float) -> dict:
    """A partition's rows with the shared values, prepared as the program's posterior data."""
    values = {**shared, **{name: load_partition_value(value) for name, value in part.items()}}
    return prepare_rows(program.spec, values, divergence, learning_rate).stan_data


def kept_on_worker(run: str, index: int, build: Callable[[], object]):
    """What run ``run`` keeps of partition ``index`` in this process (built on first use)."""
    kept = _ON_THIS_WORKER.get((run, index))
    if kept is None:
        kept = _ON_THIS_WORKER[(run, index)] = build()
    return kept


def partition_robust_means(part: dict, run: str, index: int, program: RobustProgram, shared: dict,
                           divergence: Divergence, learning_rate: float, thetas: np.ndarray, factor: np.ndarray,
                           estimate: Callable, epsilon: float) -> tuple[np.ndarray, np.ndarray]:
    """One partition's step (run where the partition is): its rows' per-example gradients at
    every chain's state, in the coordinates of ``factor``, and the estimator's mean and kept share
    per chain. The partition's gradient object is built on first use and kept for the run."""
    per_example = kept_on_worker(run, index, lambda: PerExampleGradients(
        program, partition_stan_data(program, part, shared, divergence, learning_rate)))
    with np.errstate(over="ignore", invalid="ignore"):
        G = per_example.gradients_many_in(thetas, factor)
    return estimate_each(G, estimate, epsilon)


def _forget_run(run: str) -> None:
    for key in [key for key in _ON_THIS_WORKER if key[0] == run]:
        del _ON_THIS_WORKER[key]


class PlacedPartitions:
    """Row partitions placed where their tasks run: each computed on a worker of ``cluster`` and
    kept there (only futures are here), or loaded here without a cluster. ``call(k, function,
    ...)`` runs ``function(part_k, run, k, ...)`` where partition k is; ``submit`` runs any
    function on a cluster (or here), ``gather`` collects results."""

    def __init__(self, program: RobustProgram, partitions: Partitions, cluster: Cluster | None):
        self.cluster = require_cluster(cluster)
        self.rows = np.asarray(partitions.rows, dtype=int)
        self.offsets = np.concatenate([[0], np.cumsum(self.rows)])
        self.shared = partitions.shared
        self.run = uuid.uuid4().hex
        if cluster is None:  # a Dask chunk is computed here (.npy partitions need no Dask at all)
            self.parts = [{name: load_partition_value(v.compute() if hasattr(v, "dask") else v)
                           for name, v in part.items()} for part in partitions.parts]
        else:
            cluster.ship(program.compile())
            self.parts = [{name: cluster.client.compute(v) if hasattr(v, "dask") else v for name, v in part.items()}
                          for part in partitions.parts]

    @property
    def n(self) -> int:
        return int(self.offsets[-1])

    def submit(self, function: Callable, *arguments):
        return function(*arguments) if self.cluster is None else self.cluster.submit(function, *arguments)

    def call(self, index: int, function: Callable, *arguments):
        return self.submit(function, self.parts[index], self.run, index, *arguments)

    def gather(self, results: list) -> list:
        return list(results) if self.cluster is None else self.cluster.client.gather(list(results))

    def locate(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The partition of each global row number and its row number inside that partition."""
        index = np.searchsorted(self.offsets, rows, side="right") - 1
        return index, rows - self.offsets[index]

    def close(self) -> None:
        """Forget what the run kept of its partitions (here and on the workers)."""
        _forget_run(self.run)
        if self.cluster is not None:
            self.cluster.client.run(_forget_run, self.run)


class PartitionedGradients:
    """Robust means of a built-in model's per-example gradients over row partitions, each
    partition's share computed where it lives (on ``cluster``'s workers, or here without one)
    and combined by ``combine`` (module docstring)."""

    def __init__(self, program: RobustProgram, partitions: Partitions, divergence: Divergence,
                 learning_rate: float, dimension: int, cluster: Cluster | None = None, combine: str = "median"):
        if combine not in COMBINES:
            raise RobustStanInputError(f"combine: must be one of {list(COMBINES)}, got {combine!r}")
        self.program, self.divergence, self.learning_rate = program, divergence, learning_rate
        self.combine = combine
        self.placed = PlacedPartitions(program, partitions, cluster)
        self.n, self.dimension = partitions.n, dimension

    def robust_means(self, thetas: np.ndarray, factor: np.ndarray, estimate: Callable,
                     epsilon: float) -> tuple[np.ndarray, np.ndarray]:
        """Each chain's combined robust mean (chains, d) and the row-weighted kept share."""
        placed = self.placed
        arguments = (self.program, placed.shared, self.divergence, self.learning_rate, thetas, factor, estimate, epsilon)
        results = placed.gather([placed.call(k, partition_robust_means, *arguments) for k in range(len(placed.parts))])
        means = np.stack([m for m, _ in results])          # (partitions, chains, d)
        kept = np.stack([f for _, f in results])            # (partitions, chains)
        weights = placed.rows / placed.rows.sum()
        combined = np.median(means, axis=0) if self.combine == "median" else np.tensordot(weights, means, axes=1)
        return combined, np.tensordot(weights, kept, axes=1)

    def close(self) -> None:
        """Forget the partitions' gradient objects (here and on the workers)."""
        self.placed.close()


def column_sd(value) -> np.ndarray:
    """The population sd of each column of a partitioned matrix (a Dask array's reduction on the
    workers, or one .npy file at a time here)."""
    if _is_dask_array(value):
        return np.asarray(value.std(axis=0).compute(), dtype=float)
    count, total, squares = 0, 0.0, 0.0
    for path in value:
        block = load_partition_value(str(path)).astype(float)
        count, total, squares = count + block.shape[0], total + block.sum(axis=0), squares + (block**2).sum(axis=0)
    mean = total / count
    return np.sqrt(np.maximum(squares / count - mean**2, 0.0))


def global_prior_scales(spec, data: Mapping) -> dict:
    """The glm's data-dependent prior scales (2.5 / sd of each column of X) over all rows, once, so
    that every partition and the driver use the same prior ({} where the data give them or the
    model has none)."""
    if "prior_scale_b" in spec.data_names() and "prior_scale_b" not in data and "X" in data and is_partitioned(
            {"X": data["X"]}):
        return {"prior_scale_b": default_prior_scales(column_sd(data["X"]))}
    return {}


def first_rows(data: Mapping) -> dict:
    """``data`` with each partitioned value cut to its first row (read here: for the program's
    sizes and constraining transforms, which do not depend on the rows)."""
    out = {}
    for name, value in data.items():
        if _is_dask_array(value):
            out[name] = np.asarray(value[:1].compute())
        elif _is_path_list(value):
            out[name] = load_partition_value(str(value[0]), np.arange(1))
        else:
            out[name] = value
    return out


def prepare_partitioned(program: RobustProgram, data: Mapping, divergence: Divergence,
                        learning_rate: float) -> tuple[Partitions, PreparedData]:
    """The checked partitions of a built-in model's ``data`` (with the glm's prior scales over
    all rows among the shared values), and its first row with the shared values, prepared (for
    the program's sizes and transforms, which the rows do not change, and a fit's constraining)."""
    if program.spec.standardize:
        raise RobustStanInputError("model: with the rows held in partitions, each partition would standardise by its "
                                   "own centre and scale; build the model with standardize=False")
    data = unified_dask_values(data)
    partitions = split_partitions(data)  # checked before any pass over the rows (but a Dask frame's row counts)
    if program.spec.family.name == "categorical" and "K" not in partitions.shared:
        raise RobustStanInputError("data['K']: give the number of categories with rows held in partitions "
                                   "(each partition would infer its own)")
    partitions.shared.update(global_prior_scales(program.spec, data))
    first = {**first_rows(data), **partitions.shared}
    return partitions, prepare_rows(program.spec, first, divergence, learning_rate)


def partitioned_target(program: RobustProgram, data: Mapping, divergence: Divergence, learning_rate: float,
                       cluster: Cluster | None, combine: str = "median"):
    """The :class:`~robust_stan.methods.rob_ula.LangevinTarget` of a built-in model whose rows are
    held in partitions, its :class:`PartitionedGradients` (close it after the run) and the data of
    its first row with the values every partition shares, prepared (for the fit's constraining)."""
    from .rob_ula import LangevinTarget, default_estimator

    partitions, first = prepare_partitioned(program, data, divergence, learning_rate)
    stan_data = first.stan_data
    gradients = PartitionedGradients(program, partitions, divergence, learning_rate, program.dimension(stan_data),
                                     cluster, combine)
    target = LangevinTarget(
        per_example=gradients,
        prior=program.oracle_for(with_switches(stan_data, mode="prior")),
        posterior=None,
        weighted=None,
        output=lambda: program.oracle_for(with_switches(stan_data, pointwise=False)),
        learning_rate=float(learning_rate),
        default_estimator=default_estimator(program.spec.family),
        robust_means=gradients.robust_means,
    )
    return target, gradients, first
