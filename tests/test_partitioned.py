"""Rob-ULA and beta-Cores over rows held in partitions (Dask arrays, lists of .npy files).

Rob-ULA: each partition's per-example gradients and robust mean computed where it lives: on a
2-worker LocalCluster and on 1 worker the draws equal the serial run's; .npy partitions equal
Dask ones; with the plain mean joined by the row-weighted mean the chain is the in-memory run's
to rounding; bad input. beta-Cores: the batches' gains computed where their partitions live,
only reductions travel: the coreset on a cluster equals the serial partitioned one, which makes
the in-memory run's choices with its weights to rounding; a killed worker changes nothing.
Robust VI: each step's data term summed where the rows live: the in-memory fit to rounding,
full-batch and on minibatches, and the same on a cluster."""

import os
import signal
import sys
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest

import robust_stan as rs
from robust_stan.results.arviz_output import group_names

da = pytest.importorskip("dask.array", reason="partitioned data needs dask (the test extra)")
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])

RUN = dict(contamination=0.1, inits="random", metric="unit", step_size=5e-5, log_density=False, iter_sampling=150,
           iter_warmup=50, chains=2, seed=3, show_progress=False)


def _rows(n=2000, p=3, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    y = 0.5 + X @ np.array([1.0, -0.5, 0.25]) + rng.normal(size=n)
    y[rng.choice(n, n // 10, replace=False)] += 8.0  # a tenth of the rows, spread over the partitions
    return X, y


def _partitioned(X, y, rows=500):
    return {"X": da.from_array(X, chunks=(rows, X.shape[1])), "y": da.from_array(y, chunks=rows)}


def _same_draws(a, b) -> None:
    for name in a.posterior:
        np.testing.assert_array_equal(a.posterior[name], b.posterior[name])


@pytest.fixture(scope="module")
def serial(glm_normal):
    X, y = _rows()
    return rs.rob_ula(glm_normal, _partitioned(X, y), **RUN)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # 150 draws: R-hat and ESS are poor
@pytest.mark.parametrize("workers", [1, 2])
def test_partitioned_rob_ula_on_a_cluster_equals_the_serial_run(glm_normal, serial, workers):
    X, y = _rows()
    with rs.Cluster(workers=workers, show_progress=False) as cluster:
        on_cluster = rs.rob_ula(glm_normal, _partitioned(X, y), cluster=cluster, **RUN)
    _same_draws(on_cluster, serial)
    assert isinstance(on_cluster, rs.RobULAFit) and np.all(on_cluster.raw.sampler["kept_fraction"] > 0.5)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_npy_partitions_equal_dask_partitions(glm_normal, serial, tmp_path):
    X, y = _rows()
    paths = {"X": [], "y": []}
    for k in range(4):
        for name, values in (("X", X), ("y", y)):
            path = tmp_path / f"{name}{k}.npy"
            np.save(path, values[500 * k:500 * (k + 1)])
            paths[name].append(str(path))
    _same_draws(rs.rob_ula(glm_normal, paths, **RUN), serial)


def _frame(X, y) -> pd.DataFrame:
    return pd.DataFrame({**{f"x{j}": X[:, j] for j in range(X.shape[1])}, "y": y})


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_dask_frames_and_parquet_files_equal_dask_array_partitions(glm_normal, serial, tmp_path):
    """The same 4 partitions of 500 rows as a Dask DataFrame (X its columns, y a Series), as
    Parquet files read by Dask, and as one Parquet file per partition and value."""
    dd = pytest.importorskip("dask.dataframe", reason="Dask DataFrames need dask[dataframe] (the test extra)")
    pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (the test extra)")
    X, y = _rows()
    frame = dd.from_pandas(_frame(X, y), chunksize=500)
    assert frame.npartitions == 4
    columns = ["x0", "x1", "x2"]
    _same_draws(rs.rob_ula(glm_normal, {"X": frame[columns], "y": frame["y"]}, **RUN), serial)
    paths = {"X": [], "y": []}
    for k in range(4):
        rows = slice(500 * k, 500 * (k + 1))
        _frame(X[rows], y[rows]).to_parquet(tmp_path / f"part{k}.parquet")
        _frame(X[rows], y[rows])[columns].to_parquet(tmp_path / f"X{k}.parquet")
        _frame(X[rows], y[rows])[["y"]].to_parquet(tmp_path / f"y{k}.parquet")
        for name in paths:
            paths[name].append(str(tmp_path / f"{name}{k}.parquet"))
    read = dd.read_parquet([str(tmp_path / f"part{k}.parquet") for k in range(4)])
    _same_draws(rs.rob_ula(glm_normal, {"X": read[columns], "y": read["y"]}, **RUN), serial)
    _same_draws(rs.rob_ula(glm_normal, paths, **RUN), serial)


def test_rows_of_a_parquet_file_are_read_from_their_row_groups_only(tmp_path, monkeypatch):
    """A coreset's fetch of a few rows reads only the row groups that hold them, and gets the rows a
    whole-file read gives, in the order asked, repeats, a stored index and bool columns included."""
    import pyarrow.parquet as pq

    from robust_stan.building.partitions import load_partition_value

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"a": rng.normal(size=1000), "b": rng.random(1000) < 0.5},
                         index=pd.Index(np.arange(1000) * 3, name="row"))
    path = str(tmp_path / "part.parquet")
    frame.to_parquet(path, row_group_size=128)
    whole = load_partition_value(path)
    np.testing.assert_array_equal(whole, np.column_stack([frame["a"], frame["b"].astype(int)]))
    read_groups = []
    original = pq.ParquetFile.read_row_groups

    def recording(self, groups, *args, **kwargs):
        read_groups.append(list(groups))
        return original(self, groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", recording)
    rows = np.array([999, 5, 130, 127, 5])
    np.testing.assert_array_equal(load_partition_value(path, rows), whole[rows])
    assert read_groups == [[0, 1, 7]]   # rows 5, 127 in group 0; 130 in group 1; 999 in group 7
    assert load_partition_value(path, np.arange(0)).shape == (0, 2)
    mask = np.zeros(1000, dtype=bool)
    mask[[3, 600]] = True
    np.testing.assert_array_equal(load_partition_value(path, mask), whole[mask])
    np.testing.assert_array_equal(load_partition_value(path, [-1, 0]), whole[[-1, 0]])


def test_column_sds_of_partition_files_pool_to_the_whole_columns_sd(tmp_path):
    """The glm's default prior scales come from each column's sd over all rows; from files, each
    file's moments are pooled: equal to the sd of all rows stacked, computed in extended precision
    (an empty file and a vector included). The columns' mean is 1e6 and one sd is 0.01: summing raw
    squares (1e12 each, rounded to about 1e-4) would lose the variance of 1e-4 entirely; float64
    values of 1e6 carry 1e-10, so deviations of 0.01 keep about 1e-8 relative error."""
    from robust_stan.building.partitions import column_sd

    rng = np.random.default_rng(1)
    blocks = [1e6 + rng.normal(size=(n, 3)) * [1.0, 2.0, 1e-2] for n in (500, 0, 1, 799)]
    paths = []
    for k, block in enumerate(blocks):
        np.save(tmp_path / f"X{k}.npy", block)
        paths.append(str(tmp_path / f"X{k}.npy"))
    np.testing.assert_allclose(column_sd(paths), np.vstack(blocks).astype(np.longdouble).std(axis=0), rtol=1e-6)
    vectors = [str(tmp_path / f"X{k}.npy") for k in (0, 3)]
    for k, path in zip((0, 3), vectors):
        np.save(path, blocks[k][:, 2])
    stacked = np.concatenate([blocks[0][:, 2], blocks[3][:, 2]]).astype(np.longdouble)
    np.testing.assert_allclose(column_sd(vectors), [stacked.std()], rtol=1e-6)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_dask_values_chunked_differently_are_split_at_every_boundary(glm_normal):
    X, y = _rows(200)
    unequal = {"X": da.from_array(X, chunks=(100, 3)), "y": da.from_array(y, chunks=((50, 150),))}
    split = {"X": da.from_array(X, chunks=((50, 50, 100), 3)), "y": da.from_array(y, chunks=((50, 50, 100),))}
    _same_draws(rs.rob_ula(glm_normal, unequal, **RUN), rs.rob_ula(glm_normal, split, **RUN))


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_parquet_files_read_on_a_cluster_equal_the_serial_run(glm_normal, serial, tmp_path):
    """The files are read by the workers (the frame's partitions are tasks of the graph)."""
    dd = pytest.importorskip("dask.dataframe", reason="Dask DataFrames need dask[dataframe] (the test extra)")
    pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (the test extra)")
    X, y = _rows()
    for k in range(4):
        _frame(X[500 * k:500 * (k + 1)], y[500 * k:500 * (k + 1)]).to_parquet(tmp_path / f"part{k}.parquet")
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        frame = dd.read_parquet([str(tmp_path / f"part{k}.parquet") for k in range(4)])
        fit = rs.rob_ula(glm_normal, {"X": frame[["x0", "x1", "x2"]], "y": frame["y"]}, cluster=cluster, **RUN)
    _same_draws(fit, serial)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_edge_cases_of_partition_files_and_dask_values(glm_normal, tmp_path):
    """A one-column X as Parquet files (a vector) with an empty first file, a stored pandas index
    and a bool column among numbers; and a Dask array whose chunk sizes are unknown: each gives
    the draws of the same rows as plain Dask arrays."""
    pytest.importorskip("pyarrow", reason="Parquet files need pyarrow (the test extra)")
    X, y = _rows(400)
    flag = X[:, 0] > 0
    reference = rs.rob_ula(glm_normal, {"X": da.from_array(flag[:, None].astype(float), chunks=(200, 1)),
                                        "y": da.from_array(y, chunks=200)}, **RUN)
    paths = {"X": [], "y": []}
    for k, rows in enumerate([slice(0, 0), slice(0, 200), slice(200, 400)]):
        frame = pd.DataFrame({"flag": flag[rows], "y": y[rows]}, index=np.arange(400)[rows] * 2)  # an index to store
        for name, columns in (("X", ["flag"]), ("y", ["y"])):
            frame[columns].to_parquet(tmp_path / f"{name}{k}.parquet")
            paths[name].append(str(tmp_path / f"{name}{k}.parquet"))
    _same_draws(rs.rob_ula(glm_normal, paths, **RUN), reference)

    mixed = pd.DataFrame({"flag": flag, "x1": X[:, 1]})
    two = {"X": da.from_array(np.c_[flag, X[:, 1]], chunks=(200, 2)), "y": da.from_array(y, chunks=200)}
    mixed_paths = {"X": [], "y": paths["y"][1:]}
    for k, rows in enumerate([slice(0, 200), slice(200, 400)]):
        mixed.iloc[rows].to_parquet(tmp_path / f"mixed{k}.parquet")
        mixed_paths["X"].append(str(tmp_path / f"mixed{k}.parquet"))
    _same_draws(rs.rob_ula(glm_normal, mixed_paths, **RUN), rs.rob_ula(glm_normal, two, **RUN))

    unknown = da.from_array(np.c_[X, np.ones(400)], chunks=(200, 4))
    unknown = unknown[unknown[:, 3] > 0][:, :3]  # a boolean mask leaves the chunk sizes unknown
    assert np.isnan(unknown.chunks[0][0])
    _same_draws(rs.rob_ula(glm_normal, {"X": unknown, "y": da.from_array(y, chunks=200)}, **RUN),
                rs.rob_ula(glm_normal, {"X": da.from_array(X, chunks=(200, 3)), "y": da.from_array(y, chunks=200)},
                           **RUN))

    pd.DataFrame({"label": ["a"] * 200}).to_parquet(tmp_path / "label.parquet")
    with pytest.raises(rs.RobustStanInputError, match=r"^data\['X'\]: every column must be numeric or bool \(.*"
                                                      r"label.parquet\); not \{'label'"):
        rs.rob_ula(glm_normal, {"X": [str(tmp_path / "label.parquet")] * 2, "y": paths["y"][1:]}, **RUN)


@pytest.mark.stan
def test_bad_dask_frames_are_refused(glm_normal):
    dd = pytest.importorskip("dask.dataframe", reason="Dask DataFrames need dask[dataframe] (the test extra)")
    X, y = _rows(200)
    table = _frame(X, y).assign(label=["a"] * 200)
    frame = dd.from_pandas(table, chunksize=100)
    with pytest.raises(rs.RobustStanInputError, match=r"^data\['X'\]: every column must be numeric or bool; not \{'label'"):
        rs.rob_ula(glm_normal, {"X": frame[["x0", "label"]], "y": frame["y"]}, **RUN)
    other = dd.from_pandas(table.iloc[:150], chunksize=50)
    with pytest.raises(rs.RobustStanInputError, match=r"^data: the Dask values have different numbers of rows"):
        rs.rob_ula(glm_normal, {"X": frame[["x0", "x1"]], "y": other["y"]}, **RUN)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_plain_mean_joined_by_the_weighted_mean_is_the_in_memory_chain(glm_normal):
    """With estimator="mean" (ULA) and combine="mean", the partitions' row-weighted mean of
    their means is the mean over all rows, so the chain is the in-memory one's up to rounding
    (unequal partitions: 700, 700, 600)."""
    X, y = _rows()
    options = dict(RUN, estimator="mean")
    partitioned = rs.rob_ula(glm_normal, _partitioned(X, y, rows=700), combine="mean", **options)
    in_memory = rs.rob_ula(glm_normal, {"X": X, "y": y}, **options)
    for name in in_memory.posterior:
        np.testing.assert_allclose(partitioned.posterior[name], in_memory.posterior[name], rtol=0, atol=1e-9)


WARMED = dict(contamination=0.15, log_density=False, iter_sampling=200, iter_warmup=100, chains=2, seed=4,
              show_progress=False)


def _same_warmup(partitioned, in_memory, tolerance: float) -> None:
    metric = in_memory.inverse_metric  # its near-zero cross terms are held to the matrix's scale
    np.testing.assert_allclose(partitioned.inverse_metric, metric, rtol=tolerance,
                               atol=tolerance * np.abs(metric).max())
    np.testing.assert_allclose(partitioned.raw.sampler["step_size"], in_memory.raw.sampler["step_size"], rtol=tolerance)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_one_partition_with_the_default_warmup_is_the_in_memory_run(glm_normal):
    """The default warmup over partitions (inits="mode": each partition's robust mode, joined;
    metric="dense" from the kept rows' Hessians summed over partitions; the step from its
    curvature) on a single partition is the in-memory warmup, which finds the same mode, keeps
    the same rows and differentiates the same drift: the same metric, step and chains, to the
    rounding of the finite differences' two sums."""
    X, y = _rows(600)
    partitioned = rs.rob_ula(glm_normal, _partitioned(X, y, rows=600), **WARMED)
    in_memory = rs.rob_ula(glm_normal, {"X": X, "y": y}, **WARMED)
    _same_warmup(partitioned, in_memory, 1e-6)
    for name in in_memory.posterior:
        np.testing.assert_allclose(partitioned.posterior[name], in_memory.posterior[name], rtol=0, atol=1e-6)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_the_default_warmup_on_a_cluster_equals_the_serial_run(glm_normal):
    """The partitions' modes and kept rows' Hessians computed on 2 workers: the serial run's
    start, metric, step and draws, to rounding (the workers run one BLAS thread, this process
    several, so sums in the optimiser and the Hessian may round differently: about 1e-14 here;
    the test allows 1e-10)."""
    X, y = _rows()
    serial = rs.rob_ula(glm_normal, _partitioned(X, y), **WARMED)
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        on_cluster = rs.rob_ula(glm_normal, _partitioned(X, y), cluster=cluster, **WARMED)
    _same_warmup(on_cluster, serial, 1e-10)
    for name in serial.posterior:
        np.testing.assert_allclose(on_cluster.posterior[name], serial.posterior[name], rtol=0, atol=1e-10)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_the_dense_metric_over_partitions_is_the_in_memory_one_for_the_plain_mean(glm_normal):
    """With the plain mean (every row kept) joined by the row-weighted mean, the Hessian of the
    mean loss summed over unequal partitions (700, 700, 600) and the estimator's slope are the
    in-memory ones, so the adapted metric and the default step are the same. (The chains are
    not compared: the slope is near the identity, whose eigenvectors rounding can rotate, and
    another factor L of the same metric gives other, equally valid draws.)"""
    X, y = _rows()
    options = dict(WARMED, estimator="mean", inits="random")
    partitioned = rs.rob_ula(glm_normal, _partitioned(X, y, rows=700), combine="mean", **options)
    in_memory = rs.rob_ula(glm_normal, {"X": X, "y": y}, **options)
    _same_warmup(partitioned, in_memory, 1e-6)


@pytest.mark.stan
@pytest.mark.statistical_study
def test_partitioned_rob_ula_with_the_default_warmup_converges_on_a_plain_regression(glm_normal):
    """Rob-ULA's defaults (but the log density; contamination 0.1) on a clean regression in 4 partitions: the
    chains mix (no convergence warning: R-hat at most 1.01, bulk and tail ESS at least 100)
    and every coefficient's posterior mean is within 4 posterior sds of the truth."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(2000, 3))
    y = 0.5 + X @ np.array([1.0, -0.5, 0.25]) + rng.normal(size=2000)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rs.RobustStanWarning)
        fit = rs.rob_ula(glm_normal, _partitioned(X, y, rows=500), contamination=0.1, log_density=False, seed=2,
                         show_progress=False)
    summary = fit.summary()
    assert summary["r_hat"].max() <= 1.01 and summary["ess_bulk"].min() >= 100
    b = summary.loc[["b[1]", "b[2]", "b[3]"]]
    assert np.all(np.abs(b["mean"].to_numpy() - [1.0, -0.5, 0.25]) < 4 * b["sd"].to_numpy())


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_a_partitioned_fit_has_draws_but_refuses_per_observation_quantities(serial):
    assert set(serial.summary().index) == {"alpha", "b[1]", "b[2]", "b[3]", "sigma"}
    with pytest.raises(rs.RobustStanInputError, match="held in partitions"):
        serial.draws("log_lik")
    with pytest.raises(rs.RobustStanInputError, match="held in partitions"):
        serial.outlier_scores(0.3)


@pytest.mark.stan
def test_an_unknown_combine_is_refused(glm_normal):
    X, y = _rows(200)
    with pytest.raises(rs.RobustStanInputError, match="^combine"):
        rs.rob_ula(glm_normal, _partitioned(X, y, rows=100), **{**RUN, "combine": "trimmed"})


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # 150 draws: R-hat and ESS are poor
def test_the_log_density_over_partitions_is_the_whole_datas(glm_normal):
    """lp__ of a partitioned run (the prior here plus each partition's data term, on 2 workers and
    serially) equals the in-memory model's log density at the same draws, computed independently
    by the engine on all 2000 rows at once: to rounding of the partitions' sum (1e-9 relative)."""
    X, y = _rows()
    options = dict(RUN, log_density=True)
    serial = rs.rob_ula(glm_normal, _partitioned(X, y, rows=700), **options)
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        on_cluster = rs.rob_ula(glm_normal, _partitioned(X, y, rows=700), cluster=cluster, **options)
    _same_draws(on_cluster, serial)
    theta = serial.unconstrained_draws.reshape(-1, serial.unconstrained_draws.shape[-1])
    whole = np.array([glm_normal.log_density({"X": X, "y": y}, t) for t in theta])
    for fit in (serial, on_cluster):
        lp = fit.raw.sampler["lp__"].reshape(-1)
        np.testing.assert_allclose(lp, whole, rtol=1e-9)
        np.testing.assert_allclose(fit.to_arviz().sample_stats["lp"].values.reshape(-1), lp)


@pytest.mark.stan
def test_bad_partitioned_data_is_refused(glm_normal, glm_normal_standardized, tmp_path):
    X, y = _rows(200)
    with pytest.raises(rs.RobustStanInputError, match="^model: .*standardize=False"):
        rs.rob_ula(glm_normal_standardized, _partitioned(X, y, rows=100), **RUN)
    np.save(tmp_path / "X0.npy", X[:100])
    np.save(tmp_path / "X1.npy", X[100:, :2])  # a column short
    np.save(tmp_path / "y0.npy", y[:100])
    np.save(tmp_path / "y1.npy", y[100:])
    with pytest.raises(rs.RobustStanInputError, match=r"^data\['X'\]: its partitions have different column counts"):
        rs.rob_ula(glm_normal, {"X": [str(tmp_path / "X0.npy"), str(tmp_path / "X1.npy")],
                                "y": [str(tmp_path / "y0.npy"), str(tmp_path / "y1.npy")]}, **RUN)
    np.save(tmp_path / "X1.npy", X[100:])
    np.save(tmp_path / "y0.npy", y[:50])
    np.save(tmp_path / "y1.npy", y[50:])
    with pytest.raises(rs.RobustStanInputError, match=r"^data\['y'\]: its partitions' row counts"):
        rs.rob_ula(glm_normal, {"X": [str(tmp_path / "X0.npy"), str(tmp_path / "X1.npy")],
                                "y": [str(tmp_path / "y0.npy"), str(tmp_path / "y1.npy")]}, **RUN)
    with pytest.raises(rs.RobustStanInputError, match=r"^data: the Dask values have different numbers of rows"):
        rs.rob_ula(glm_normal, {"X": da.from_array(X, chunks=(100, 3)), "y": da.from_array(y[:150], chunks=50)},
                   **RUN)
    with pytest.raises(rs.RobustStanInputError, match="^cluster"):
        rs.rob_ula(glm_normal, {"X": X, "y": y}, cluster=object(), **RUN)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")
def test_a_worker_killed_during_a_partitioned_run_loses_nothing(glm_normal, serial):
    """One of two workers is killed (SIGKILL, by its pid) while the chains step: Dask recomputes its
    partitions from their graph and reruns its tasks, the partition's gradients are rebuilt on
    the worker that takes it over, and the draws equal the undisturbed serial run's."""
    on_cluster = _run_with_a_worker_killed(lambda cluster, data: rs.rob_ula(glm_normal, data, cluster=cluster, **RUN))
    _same_draws(on_cluster, serial)


CORESET = dict(size=6, divergence=rs.BetaD(0.3), draws=30, iters_per_point=10, select_batch=200, opt_batch=100,
               seed=4, show_progress=False, start=np.arange(0, 2000, 200))  # 10 rows to start: see below


@pytest.fixture(scope="module")
def serial_coreset(glm_normal):
    X, y = _rows()
    return rs.coreset(glm_normal, _partitioned(X, y), **CORESET)


@pytest.mark.stan
def test_partitioned_coreset_makes_the_in_memory_choices(glm_normal, serial_coreset, tmp_path):
    """The same random numbers in the same order: the same rows join, with the same weights up to
    the order of the batch sums' additions (relative 1e-6 over 60 Adam steps); .npy partitions
    give the Dask partitions' coreset (to the rounding of the glm prior scales' column sds);
    the result's coreset posterior is made from the fetched rows alone."""
    X, y = _rows()
    in_memory = rs.coreset(glm_normal, {"X": X, "y": y}, **CORESET)
    np.testing.assert_array_equal(serial_coreset.indices, in_memory.indices)
    np.testing.assert_allclose(serial_coreset.weights, in_memory.weights, rtol=1e-6, atol=0)
    np.testing.assert_array_equal(serial_coreset.trace["chosen"], in_memory.trace["chosen"])
    assert serial_coreset.weights.shape == (2000,) and set(serial_coreset.indices) <= set(serial_coreset.local_rows)
    assert serial_coreset.local_rows.size < 30  # the rows fetched here: the coreset's (and row 0)
    paths = {"X": [], "y": []}
    for k in range(4):
        for name, values in (("X", X), ("y", y)):
            np.save(tmp_path / f"{name}{k}.npy", values[500 * k:500 * (k + 1)])
            paths[name].append(str(tmp_path / f"{name}{k}.npy"))
    from_files = rs.coreset(glm_normal, paths, **CORESET)  # the prior scales' sds: another order of additions
    np.testing.assert_array_equal(from_files.indices, serial_coreset.indices)
    np.testing.assert_allclose(from_files.weights, serial_coreset.weights, rtol=1e-8, atol=0)
    prepared = serial_coreset.prepared_for("beta")
    here = serial_coreset.indices
    np.testing.assert_array_equal(prepared.stan_data["y"], y[here])
    np.testing.assert_array_equal(prepared.stan_data["X"], X[here])
    np.testing.assert_array_equal(prepared.stan_data["weights"], serial_coreset.weights[here])


@pytest.mark.stan
def test_partitioned_uniform_coreset_and_earlier_steps(glm_normal, serial_coreset):
    """A uniform coreset draws the in-memory run's rows and fetches them; a partitioned coreset's
    earlier steps make their posterior data from the fetched rows too."""
    X, y = _rows()
    options = dict(size=30, method="uniform", seed=8, show_progress=False)
    uniform = rs.coreset(glm_normal, _partitioned(X, y), **options)
    np.testing.assert_array_equal(uniform.weights, rs.coreset(glm_normal, {"X": X, "y": y}, **options).weights)
    np.testing.assert_array_equal(uniform.prepared_for("classical").stan_data["y"], y[uniform.indices])
    earlier = serial_coreset.at_step(2)
    assert earlier.indices.size < serial_coreset.indices.size
    np.testing.assert_array_equal(earlier.prepared_for("beta").stan_data["X"], X[earlier.indices])


@pytest.mark.stan
@pytest.mark.parametrize("workers", [2])
def test_partitioned_coreset_on_a_cluster_equals_the_serial_run(glm_normal, serial_coreset, workers):
    X, y = _rows()
    with rs.Cluster(workers=workers, show_progress=False) as cluster:
        on_cluster = rs.coreset(glm_normal, _partitioned(X, y), cluster=cluster, **CORESET)
        left = sum(cluster.client.run(_cached_partitions).values())
    np.testing.assert_array_equal(on_cluster.weights, serial_coreset.weights)
    pd.testing.assert_frame_equal(on_cluster.trace.drop(columns="seconds"), serial_coreset.trace.drop(columns="seconds"))
    assert left == 0  # the workers forgot the run's partitions


@pytest.mark.stan
def test_a_worker_killed_during_a_partitioned_coreset_loses_nothing(glm_normal, serial_coreset):
    """A worker killed (SIGKILL) while the coreset grows: its partitions and the batch gains it
    held are recomputed from their graph elsewhere, and the coreset equals the serial one."""
    on_cluster = _run_with_a_worker_killed(
        lambda cluster, data: rs.coreset(glm_normal, data, cluster=cluster, **CORESET))
    np.testing.assert_array_equal(on_cluster.weights, serial_coreset.weights)


@pytest.mark.stan
def test_bad_partitioned_coreset_input_is_refused(glm_normal, glm_normal_standardized):
    X, y = _rows(200)
    data = _partitioned(X, y, rows=100)
    small = dict(CORESET, start=None, size=2)
    for option, message in ((dict(groups=np.arange(200) % 5), "^groups: not with rows held in partitions"),
                            (dict(refresh=lambda w: None), "^refresh: not with rows held in partitions"),
                            (dict(sampler="exact", inner="classical"), "^sampler: 'exact' needs every row"),
                            (dict(start=[5, 500]), "^start: must be row numbers in 0..199")):
        with pytest.raises(rs.RobustStanInputError, match=message):
            rs.coreset(glm_normal, data, **{**small, **option})
    with pytest.raises(rs.RobustStanInputError, match="^model: .*standardize=False"):
        rs.coreset(glm_normal_standardized, data, **small)
    with pytest.raises(rs.RobustStanInputError, match="^cluster: rs.coreset uses a cluster for rows held"):
        rs.coreset(glm_normal, {"X": X, "y": y}, cluster=object(), **small)


@pytest.mark.stan
def test_an_improper_coreset_posterior_is_a_clear_error(glm_normal):
    """Started from one row, the normal regression's weighted posterior has its scale run to 0
    (four coefficients fit the first rows exactly): the engine rejects its draws, and the error
    says so and names start (the rows the greedy methods begin from)."""
    X, y = _rows()
    with pytest.raises(rs.RobustStanInputError, match="^start: the weighted posterior on the coreset's"):
        rs.coreset(glm_normal, {"X": X, "y": y}, **dict(CORESET, start=None))


VARIATIONAL = dict(divergence=rs.BetaD(0.3), seed=2, iter=600, show_progress=False)


@pytest.mark.stan
@pytest.mark.parametrize("batch_size", [None, 200])
def test_partitioned_variational_is_the_in_memory_fit(glm_normal, batch_size):
    """log pi = prior + the partitions' data terms (each partition's program minus its prior):
    the same q as in memory to rounding, full-batch and with minibatches (the same rows drawn)."""
    X, y = _rows()
    in_memory = glm_normal.variational({"X": X, "y": y}, batch_size=batch_size, **VARIATIONAL)
    partitioned = glm_normal.variational(_partitioned(X, y, rows=700), batch_size=batch_size, **VARIATIONAL)
    np.testing.assert_allclose(partitioned.q.mean, in_memory.q.mean, rtol=0, atol=1e-10)
    np.testing.assert_allclose(partitioned.q.cholesky, in_memory.q.cholesky, rtol=0, atol=1e-10)
    assert partitioned.elbo == pytest.approx(in_memory.elbo, rel=1e-10)
    assert partitioned.settings.iterations_run == in_memory.settings.iterations_run
    for name in in_memory.posterior:
        np.testing.assert_allclose(partitioned.posterior[name], in_memory.posterior[name], rtol=0, atol=1e-9)
    groups = set(group_names(partitioned.to_arviz()))
    assert {"posterior", "sample_stats", "variational_elbo"} <= groups and "log_likelihood" not in groups
    with pytest.raises(rs.RobustStanInputError, match="held in partitions"):
        partitioned.draws("log_lik")


@pytest.mark.stan
def test_partitioned_variational_on_a_cluster_equals_the_serial_run(glm_normal):
    X, y = _rows()
    options = dict(VARIATIONAL, batch_size=200)
    serial = glm_normal.variational(_partitioned(X, y), **options)
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        on_cluster = glm_normal.variational(_partitioned(X, y), cluster=cluster, **options)
    np.testing.assert_array_equal(on_cluster.q.mean, serial.q.mean)
    np.testing.assert_array_equal(on_cluster.q.cholesky, serial.q.cholesky)


@pytest.mark.stan
def test_bad_partitioned_variational_input_is_refused(glm_normal):
    X, y = _rows(200)
    data = _partitioned(X, y, rows=100)
    with pytest.raises(rs.RobustStanInputError, match="^method: rows held in partitions"):
        glm_normal.variational(data, method="advi")
    with pytest.raises(rs.RobustStanInputError, match="^weights: not with rows held in partitions"):
        glm_normal.variational(data, weights=np.ones(200))
    with pytest.raises(rs.RobustStanInputError, match="^batch_size: at most the 200 rows"):
        glm_normal.variational(data, batch_size=500, **VARIATIONAL)
    with pytest.raises(rs.RobustStanInputError, match="^cluster: variational inference uses a cluster"):
        glm_normal.variational({"X": X, "y": y}, cluster=object())
    with pytest.raises(rs.RobustStanInputError, match="^divergence: the original gamma form is not a sum"):
        glm_normal.variational(data, divergence=rs.GammaD(0.3, form="original"))


@pytest.mark.stan
def test_empty_partitions_are_left_out(glm_normal):
    """A chunk without rows adds nothing: full-batch VI on partitions of 0, 1000, 0 and 1000 rows
    is the fit on 2 partitions of 1000. (The prior scales are given: Dask's column sds over the
    chunks may round differently with the empty ones, which can move the stopping iteration.)"""
    X, y = _rows()
    uneven = {"X": da.from_array(X, chunks=((0, 1000, 0, 1000), (3,))), "y": da.from_array(y, chunks=((0, 1000, 0, 1000),)),
              "prior_scale_b": np.ones(3)}
    a = glm_normal.variational(uneven, **VARIATIONAL)
    b = glm_normal.variational({**_partitioned(X, y, rows=1000), "prior_scale_b": np.ones(3)}, **VARIATIONAL)
    np.testing.assert_array_equal(a.q.mean, b.q.mean)


def _run_with_a_worker_killed(run):
    """``run(cluster, data)`` on a 2-worker LocalCluster, one worker killed while it runs; its result."""
    X, y = _rows()
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        killed = _kill_a_worker_once_busy(cluster)
        result = run(cluster, _partitioned(X, y))
        finished = time.monotonic()
        killed.thread.join()
    assert killed.is_set() and killed.at < finished  # killed while the run went on
    return result


def _kill_a_worker_once_busy(cluster):
    """Start a thread that kills one worker (SIGKILL, by its pid) as soon as any worker holds a
    partition of a run; returns an Event set then (``.at``: when, ``.thread``: the thread)."""
    pid = next(iter(cluster.client.run(os.getpid).values()))
    killed = threading.Event()

    def kill_when_busy():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if sum(cluster.client.run(_cached_partitions).values()) > 0:
                time.sleep(0.3)
                os.kill(pid, signal.SIGKILL)
                killed.at = time.monotonic()
                killed.set()
                return
            time.sleep(0.05)

    killed.thread = threading.Thread(target=kill_when_busy)
    killed.thread.start()
    return killed


def _cached_partitions() -> int:
    from robust_stan.methods import partition_placement

    return len(partition_placement._ON_THIS_WORKER)


@pytest.mark.stan
def test_a_beta_loss_on_partitions_is_not_judged_on_its_first_row(glm_normal):
    """The first row is prepared only for the program's sizes; the check that a beta loss leaves
    the data enough weight is about all the rows, so one row must not trigger it."""
    X, y = _rows()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rs.rob_ula(glm_normal, _partitioned(X, y), divergence=rs.BetaD(0.5),
                   **{**RUN, "iter_sampling": 20, "iter_warmup": 10})
    assert not [w for w in caught if "almost no influence" in str(w.message)]
