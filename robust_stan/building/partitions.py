"""Data held in row partitions: recognising them, checking them and reading them.

A built-in model's data dict may hold its row-indexed values in partitions:

- Dask arrays split into row chunks (the chunks are the partitions);
- Dask DataFrames or Series: turned into Dask arrays with the same partitions (a DataFrame a
  matrix of its columns, a Series a vector; bool columns become 0 / 1);
- lists of ``.npy`` or ``.parquet`` paths, one file per partition and value, read where the
  partition's task runs. A Parquet file with one column (its pandas index aside) is a vector,
  one with several a matrix; every column must be numeric or bool.

The other values are taken whole by every partition. The methods that run on partitions
(Rob-ULA, beta-Cores, robust VI, DP-VI) place them with
:mod:`robust_stan.methods.partition_placement`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common.cluster import run_tasks
from ..common.errors import RobustStanInputError
from .data import default_prior_scales

PATH_SUFFIXES = (".npy", ".parquet")
PARTITIONED_FORMS = "Dask arrays, DataFrames or Series, or lists of .npy or .parquet paths"


def is_dask_array(value) -> bool:
    return type(value).__module__.startswith("dask.array") and hasattr(value, "chunks")


def is_dask_frame(value) -> bool:
    """A Dask DataFrame or Series (dask.dataframe, or dask-expr's collections on dask 2024-2025)."""
    return type(value).__module__.split(".")[0] in ("dask", "dask_expr") and hasattr(value, "to_dask_array")


def is_path_list(value) -> bool:
    """A list of .npy paths, or of .parquet paths: one file per partition."""
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, (str, Path)) for v in value):
        return False
    return any(all(str(v).endswith(suffix) for v in value) for suffix in PATH_SUFFIXES)


def is_partitioned(data: Mapping) -> bool:
    """Whether ``data`` holds any value in row partitions (module docstring)."""
    return isinstance(data, Mapping) and any(
        is_dask_array(v) or is_dask_frame(v) or is_path_list(v) for v in data.values())


def refuse_cluster_for_rows_here(cluster, method: str) -> None:
    """An error naming ``cluster`` when one is given for data that are all in this process."""
    if cluster is not None:
        raise RobustStanInputError(f"cluster: {method} uses a cluster for rows held in partitions ({PARTITIONED_FORMS} "
                                   "in data); these data are all here, so it runs here")


def _require_numeric_columns(name: str, types: Mapping, where: str = "") -> None:
    """An error naming ``data[name]`` unless every column type in ``types`` ({column: pandas or
    Arrow type}) is numeric or bool."""
    bad = {column: str(kind) for column, kind in types.items() if not _is_numeric_type(kind)}
    if bad:
        raise RobustStanInputError(f"data[{name!r}]: every column must be numeric or bool{where}; not {bad}")


def _is_numeric_type(kind) -> bool:
    if type(kind).__module__.startswith("pyarrow"):
        import pyarrow as pa

        return pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind)
    from pandas.api.types import is_bool_dtype, is_numeric_dtype

    return is_numeric_dtype(kind) or is_bool_dtype(kind)


def _bools_as_ints(frame):
    """A pandas or Dask DataFrame or Series with its bool columns as 0 / 1 integers."""
    from pandas.api.types import is_bool_dtype

    if frame.ndim == 1:
        return frame.astype("int64") if is_bool_dtype(frame.dtype) else frame
    return frame.astype({column: "int64" for column, kind in frame.dtypes.items() if is_bool_dtype(kind)})


def _frame_as_array(name: str, frame):
    """A Dask DataFrame or Series as a Dask array with its partitions and their row counts."""
    _require_numeric_columns(name, frame.dtypes.to_dict() if frame.ndim == 2 else {frame.name: frame.dtype})
    frame = _bools_as_ints(frame)
    if hasattr(frame, "optimize"):  # the partitions it computes, so that the row counts are theirs
        frame = frame.optimize()
    return frame.to_dask_array(lengths=True)


def unified_dask_values(data: Mapping) -> dict:
    """``data`` with each Dask DataFrame or Series as a Dask array (one pass over its rows, where
    they are, for the partitions' row counts), the row counts of Dask arrays that lack them
    computed, and the Dask arrays' row chunks unified: a partition boundary of any of them is one
    of all (dask.array's ``unify_chunks``: chunks are split, never merged). Dask may partition
    two column selections of one frame differently (``read_parquet`` joins small files when
    fewer columns are read), hence the unification; so the partitions are Dask's, which may be
    fewer than the files read."""
    out = dict(data)
    for name, value in data.items():
        if is_dask_frame(value):
            out[name] = _frame_as_array(name, value)
        elif is_dask_array(value) and any(np.isnan(rows) for rows in value.chunks[0]):
            out[name] = value.compute_chunk_sizes()
    arrays = [name for name, value in out.items() if is_dask_array(value)]
    if len({out[name].chunks[0] for name in arrays}) > 1:
        from dask.array.core import unify_chunks

        letters = iter("abcdefghjklmnopqrstuvwxyz")  # "i" indexes the rows; each other axis its own letter
        pairs = [(out[name], "i" + "".join(next(letters) for _ in range(out[name].ndim - 1))) for name in arrays]
        rows = {name: out[name].shape[0] for name in arrays}
        if len(set(rows.values())) > 1:
            raise RobustStanInputError(f"data: the Dask values have different numbers of rows: {rows}")
        _, unified = unify_chunks(*[item for pair in pairs for item in pair])
        out.update(zip(arrays, unified))
    return out


def _parquet_layout(path: str) -> tuple[tuple[int, ...], dict]:
    """A Parquet file's shape as a partition value (a vector when it has one column, its pandas
    index aside) and its columns' Arrow types."""
    import pyarrow.parquet as pq

    schema = pq.read_schema(path)
    index = {c for c in (schema.pandas_metadata or {}).get("index_columns", []) if isinstance(c, str)}
    types = {field.name: field.type for field in schema if field.name not in index}
    rows = pq.read_metadata(path).num_rows
    return ((rows,) if len(types) == 1 else (rows, len(types))), types


def _read_parquet(path: str, rows: np.ndarray | None = None) -> np.ndarray:
    """A Parquet file's columns as an array (bool columns as 0 / 1), shaped as _parquet_layout says;
    with ``rows``, only those rows, read from the row groups that hold them."""
    import pyarrow.parquet as pq

    if rows is None:
        table = _bools_as_ints(pq.read_table(path).to_pandas()).to_numpy()
    else:
        rows = np.asarray(rows)
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows.astype(np.int64)
        with pq.ParquetFile(path) as file:
            starts = np.cumsum([0] + [file.metadata.row_group(g).num_rows for g in range(file.num_row_groups)])
            rows = np.where(rows < 0, rows + starts[-1], rows)
            if rows.size and (rows.min() < 0 or rows.max() >= starts[-1]):
                raise IndexError(f"rows out of range for {path} ({starts[-1]} rows)")
            group_of = np.searchsorted(starts, rows, side="right") - 1
            groups = np.unique(group_of)
            read = file.read_row_groups(groups.tolist(), use_pandas_metadata=True)
        # each row's place among the rows of the groups read
        read_starts = np.cumsum(np.r_[0, starts[groups + 1] - starts[groups]])[:-1]
        local = rows - starts[group_of] + read_starts[np.searchsorted(groups, group_of)]
        table = _bools_as_ints(read.to_pandas()).to_numpy()[local]
    return table[:, 0] if table.shape[1] == 1 else table


def _path_shape(name: str, path: str) -> tuple[int, ...]:
    """The shape of one file of ``data[name]``, its columns checked (Parquet)."""
    if not path.endswith(".parquet"):
        return tuple(np.load(path, mmap_mode="r").shape)
    shape, types = _parquet_layout(path)
    _require_numeric_columns(name, types, f" ({path})")
    return shape


def load_partition_value(value, rows: np.ndarray | None = None) -> np.ndarray:
    """A partition's value as an array (a .npy or .parquet path is read; a computed Dask chunk is
    taken as it is), or only its rows ``rows`` (then a .npy file is mapped, not read whole, and of
    a .parquet file only the row groups that hold them are read)."""
    if isinstance(value, str) and value.endswith(".parquet"):
        return _read_parquet(value, rows)
    if rows is None:
        return np.load(value) if isinstance(value, str) else np.asarray(value)
    return np.array(np.load(value, mmap_mode="r")[rows]) if isinstance(value, str) else np.asarray(value)[rows]


@dataclass(frozen=True)
class Partitions:
    """A data dict split by rows: ``parts[k]`` maps each name to partition k's values (a Dask
    chunk, a NumPy array or a file's path); ``rows[k]`` its row count (every partition has rows);
    ``shared`` the values every partition takes whole."""

    parts: list[dict]
    rows: list[int]
    shared: dict

    @property
    def n(self) -> int:
        return int(sum(self.rows))


def split_partitions(data: Mapping) -> Partitions:
    """The row partitions of ``data`` (after :func:`unified_dask_values`), checked: every
    partitioned value with the same number of partitions and rows per partition, and every
    partition of a value with the same trailing shape. Partitions without rows are left out."""
    partitioned = {name: v for name, v in data.items() if is_dask_array(v) or is_path_list(v)}
    shared = {name: v for name, v in data.items() if name not in partitioned}
    pieces: dict[str, list] = {}
    shapes: dict[str, list[tuple[int, ...]]] = {}
    for name, value in partitioned.items():
        if is_dask_array(value):
            if value.ndim > 1 and len(value.chunks[1]) > 1:
                value = value.rechunk(dict.fromkeys(range(1, value.ndim), -1))  # rows only are split
            pieces[name] = list(value.to_delayed().ravel())
            shapes[name] = [(rows, *value.shape[1:]) for rows in value.chunks[0]]
        else:
            pieces[name] = [str(p) for p in value]
            shapes[name] = []
            for path in pieces[name]:
                try:
                    shapes[name].append(_path_shape(name, path))
                except RobustStanInputError:
                    raise
                except (OSError, ValueError) as exc:
                    raise RobustStanInputError(f"data[{name!r}]: cannot read {path}: {exc}") from exc
    counts = {name: len(p) for name, p in pieces.items()}
    if len(set(counts.values())) != 1:
        raise RobustStanInputError(f"data: the partitioned values have different numbers of partitions: {counts}")
    rows: list[int] | None = None
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
    assert rows is not None, "split_partitions found a partitioned value"
    kept = [k for k in range(len(rows)) if rows[k] > 0]  # a partition without rows has nothing to add
    if not kept:
        raise RobustStanInputError("data: every partition is empty")
    parts = [{name: pieces[name][k] for name in pieces} for k in kept]
    return Partitions(parts, [rows[k] for k in kept], shared)


def column_sd(value, cluster=None) -> np.ndarray:
    """The population sd of each column of a partitioned matrix, a vector's as one column: a Dask
    array's reduction on the workers, or each file's count, mean and sum of squared deviations
    where the file is read (on ``cluster``'s workers, else here, one file at a time), pooled by
    Chan, Golub and LeVeque's formula."""
    if is_dask_array(value):
        return np.atleast_1d(np.asarray(value.std(axis=0).compute(), dtype=float))
    count, mean, squares = 0, 0.0, 0.0
    for n, file_mean, file_squares in run_tasks(_file_moments, [str(path) for path in value], cluster,
                                                "column moments"):
        if n == 0:
            continue
        delta, total = file_mean - mean, count + n
        mean, squares = mean + delta * n / total, squares + file_squares + delta**2 * count * n / total
        count = total
    if count == 0:
        raise RobustStanInputError("data['X']: every partition file is empty")
    return np.atleast_1d(np.sqrt(squares / count))


def _file_moments(path: str) -> tuple[int, np.ndarray, np.ndarray]:
    """A partition file's row count, column means and sums of squared deviations from them."""
    block = load_partition_value(path).astype(float)
    if block.shape[0] == 0:
        return 0, np.zeros(block.shape[1:]), np.zeros(block.shape[1:])
    mean = block.mean(axis=0)
    return block.shape[0], mean, ((block - mean) ** 2).sum(axis=0)


def global_prior_scales(spec, data: Mapping, cluster=None) -> dict:
    """The glm's data-dependent prior scales (2.5 / sd of each column of X) over all rows, once, so
    that every partition and the driver use the same prior ({} where the data give them or the
    model has none); file columns are summarised on ``cluster``'s workers when there is one."""
    if "prior_scale_b" in spec.data_names() and "prior_scale_b" not in data and "X" in data and is_partitioned(
            {"X": data["X"]}):
        return {"prior_scale_b": default_prior_scales(column_sd(data["X"], cluster))}
    return {}


def first_row(data: Mapping, partitions: Partitions) -> dict:
    """``data`` with each partitioned value cut to the first row of its first partition with rows
    (read here: for the program's sizes and constraining transforms, which the rows do not
    change), the shared values as they are."""
    out = dict(partitions.shared)
    for name, piece in partitions.parts[0].items():
        if is_path_list(data[name]):
            out[name] = load_partition_value(piece, np.arange(1))
        else:  # the first row of the Dask value, wherever its first non-empty chunk is
            out[name] = np.asarray(data[name][:1].compute())
    return out
