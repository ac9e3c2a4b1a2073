"""rs.Cluster on real Dask clusters: a LocalCluster started by the test, and a scheduler and two
workers started as separate processes with the ``dask`` command line on loopback. A grid of
NUTS fits (rs.select_divergence, fits="full") gives draws identical to the serial run on 1 and
2 workers (and on the command-line cluster, also partitioned Rob-ULA and beta-Cores runs); builds reach workers
through the shared cache or as shipped files (no compile on a worker); a worker killed mid-run loses no result;
bad input fails clearly."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import robust_stan as rs
from robust_stan.common.cluster import run_tasks, task_seeds

from .conftest import ENGINE
from .test_divergence_selection import _contaminated
from .test_partitioned import CORESET as PARTITIONED_CORESET, RUN as PARTITIONED_RUN, _partitioned, _rows

distributed = pytest.importorskip("distributed", reason="rs.Cluster needs dask[distributed] (the test extra)")
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import this test module

GRID = [rs.KL(), rs.BetaD(0.3), rs.BetaD(0.6)]
SAMPLE = dict(chains=2, iter_warmup=300, iter_sampling=300, seed=11)


@pytest.fixture(scope="module")
def model():
    model = rs.location("normal", engine=ENGINE)  # the program test_divergence_selection compiles
    model.compile()
    return model


@pytest.fixture(scope="module")
def serial(model):
    return rs.select_divergence(model, _contaminated(), grid=GRID, fits="full", **SAMPLE)


def _same_selection(a, b) -> None:
    np.testing.assert_array_equal(a.curve["criterion"].to_numpy(), b.curve["criterion"].to_numpy())
    assert a.divergence == b.divergence
    for divergence in GRID:
        for name in ("mu", "sigma"):
            np.testing.assert_array_equal(a.fits[divergence].posterior[name], b.fits[divergence].posterior[name])


def test_task_seeds_depend_on_the_seed_and_the_position_only():
    seeds = task_seeds(5, 4)
    assert seeds == task_seeds(5, 4) and seeds[:2] == task_seeds(5, 2)  # a task's seed ignores how many follow
    assert len(set(seeds)) == 4 and all(0 <= s < 2**31 - 1 for s in seeds)
    assert task_seeds(6, 4) != seeds
    with pytest.raises(rs.RobustStanInputError, match="seed"):
        task_seeds(-1, 3)


@pytest.mark.stan
@pytest.mark.parametrize("workers", [1, 2])
def test_a_grid_on_a_local_cluster_equals_the_serial_run(model, serial, workers):
    """Each grid value's fit (started in its largest mode) is one task; the draws and the criterion are
    identical to the serial run's, whatever the number of workers, and no worker compiles."""
    with rs.Cluster(workers=workers, show_progress=False) as cluster:
        assert cluster.workers == workers
        on_cluster = rs.select_divergence(model, _contaminated(), grid=GRID, fits="full", cluster=cluster, **SAMPLE)
        compiles = cluster.client.run(lambda: sum(rs.COMPILE_COUNTS.values()))
    _same_selection(on_cluster, serial)
    assert set(compiles.values()) == {0}  # each worker loaded the build from the shared cache


def _blas_threads(_task=None) -> list[int]:
    from threadpoolctl import threadpool_info

    np.ones(2) @ np.ones(2)  # BLAS loaded
    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def test_local_workers_use_one_blas_thread_each_and_no_malloc_trimming():
    """Two processes on two cores, each with a BLAS thread per core, fight over them (see
    robust_stan.common.parallel); the local cluster's workers get one each. They also start
    without the MALLOC_TRIM_THRESHOLD_ of Dask's nanny, which slows NUTS twofold."""
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        per_worker = cluster.client.run(_blas_threads)
        trim = cluster.client.run(os.environ.get, "MALLOC_TRIM_THRESHOLD_")
    assert all(threads and set(threads) == {1} for threads in per_worker.values()), per_worker
    assert set(trim.values()) == {None}


def _start(command, env, log):
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # the short Rob-ULA run's R-hat
def test_a_scheduler_and_workers_from_the_command_line_with_shipped_builds(model, serial, glm_normal, tmp_path):
    """``dask scheduler`` and two ``dask worker`` processes on loopback, the workers with empty build
    caches of their own (XDG_CACHE_HOME, ROBUST_STAN_CACHE). Without ship_builds the model cannot
    be loaded there: a clear error, at once (workers do not compile). With ship_builds=True the
    build's files reach them once and no worker compiles; the grid, and a small Rob-ULA run and a
    beta-Cores coreset on rows held in partitions, equal the serial runs."""
    X, y = _rows()
    partitioned_data = _partitioned(X, y)
    scheduler_file = tmp_path / "scheduler.json"
    dask = str(Path(sys.executable).parent / "dask")  # the dask command line of this environment
    env = dict(os.environ, DASK_DISTRIBUTED__WORKER__DAEMON="False", MALLOC_TRIM_THRESHOLD_="1073741824",
               XDG_CACHE_HOME=str(tmp_path / "cache"),
               ROBUST_STAN_CACHE=str(tmp_path / "rs-cache"))
    log = open(tmp_path / "dask.log", "w")
    processes = [_start([dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
                                "--scheduler-file", str(scheduler_file)], dict(os.environ), log)]
    try:
        deadline = time.monotonic() + 60
        while not scheduler_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scheduler_file.exists(), (tmp_path / "dask.log").read_text()
        address = __import__("json").loads(scheduler_file.read_text())["address"]
        for _ in range(2):
            processes.append(_start([dask, "worker", address, "--nthreads", "1",
                                     "--nworkers", "1", "--no-dashboard"], env, log))
        with rs.Cluster(address=address, show_progress=False) as cluster:  # no shared cache, nothing shipped
            cluster.client.wait_for_workers(2, timeout=60)
            start = time.monotonic()
            with pytest.raises(rs.RobustStanInputError, match="not in this worker's httpstan build cache.*ship_builds"):
                rs.select_divergence(model, _contaminated(), grid=GRID, fits="full", cluster=cluster, **SAMPLE)
            assert time.monotonic() - start < 30  # refused, not compiled
        with rs.Cluster(address=address, ship_builds=True, show_progress=False) as cluster:
            files = model.compile().build_files()
            before = cluster.client.run(lambda: _has_build(files))
            assert set(before.values()) == {False}  # the workers' own caches do not hold the build
            on_cluster = rs.select_divergence(model, _contaminated(), grid=GRID, fits="full", cluster=cluster,
                                              **SAMPLE)
            rows_on_cluster = rs.rob_ula(glm_normal, partitioned_data, cluster=cluster, **PARTITIONED_RUN)
            coreset_on_cluster = rs.coreset(glm_normal, partitioned_data, cluster=cluster, **PARTITIONED_CORESET)
            compiles = cluster.client.run(lambda: sum(rs.COMPILE_COUNTS.values()))
            after = cluster.client.run(lambda: _has_build(files))
        _same_selection(on_cluster, serial)
        assert set(compiles.values()) == {0} and set(after.values()) == {True}
        rows_here = rs.rob_ula(glm_normal, partitioned_data, **PARTITIONED_RUN)
        for name in rows_here.posterior:
            np.testing.assert_array_equal(rows_on_cluster.posterior[name], rows_here.posterior[name])
        coreset_here = rs.coreset(glm_normal, partitioned_data, **PARTITIONED_CORESET)
        np.testing.assert_array_equal(coreset_on_cluster.weights, coreset_here.weights)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=30)
        log.close()


def _has_build(files) -> bool:
    """Whether this process's httpstan cache holds the build (under this process's name for it:
    httpstan's names hash the Python executable's path, which the dask command's differs in)."""
    from robust_stan.engines.build_files import cache_root

    folder = cache_root("httpstan") / files.folder_here()
    return folder.exists() and any(p.suffix == ".so" for p in folder.iterdir())


def _slow_fit(seed, model, data):
    fit = model.sample(data, chains=2, iter_warmup=800, iter_sampling=800, seed=seed, show_progress=False)
    return fit.posterior["mu"]


@pytest.mark.stan
@pytest.mark.filterwarnings("ignore::robust_stan.RobustStanWarning")  # short chains: R-hat may pass 1.01
def test_a_worker_killed_mid_run_loses_no_result(model):
    """Six fits on two workers; one worker's process is killed (SIGKILL, by its pid) while both
    are busy. Dask reruns its task elsewhere and every result equals the undisturbed serial run."""
    from functools import partial

    data = _contaminated()
    task = partial(_slow_fit, model=model, data=data)
    seeds = task_seeds(1, 6)
    expected = run_tasks(task, seeds)
    with rs.Cluster(workers=2, show_progress=False) as cluster:
        pids = list(cluster.client.run(os.getpid).values())
        killed = threading.Event()

        def kill_when_busy():
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if sum(len(v) for v in cluster.client.processing().values()) >= 2:
                    time.sleep(0.5)  # both workers are inside a fit
                    os.kill(pids[0], signal.SIGKILL)
                    killed.set()
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        results = cluster.map(task, seeds)
        killer.join()
        assert killed.is_set()
        assert pids[0] not in cluster.client.run(os.getpid).values()  # the nanny started a new process
    for got, want in zip(results, expected):
        np.testing.assert_array_equal(got, want)


def test_an_unreachable_address_fails_clearly_within_the_timeout():
    start = time.monotonic()
    with pytest.raises(rs.RobustStanInputError, match="address: no Dask scheduler answered"):
        rs.Cluster(address="tcp://127.0.0.1:9", timeout=2)
    assert time.monotonic() - start < 20


@pytest.mark.parametrize("kwargs, argument", [
    (dict(workers=0), "workers"), (dict(workers=1.5), "workers"), (dict(timeout=0), "timeout"),
    (dict(address="tcp://127.0.0.1:9", client=object()), "client, address"), (dict(client=object()), "client"),
    (dict(address=""), "address"), (dict(address="tcp://127.0.0.1:9", workers=2), "workers"),
])
def test_bad_cluster_arguments_name_the_argument(kwargs, argument):
    with pytest.raises(rs.RobustStanInputError, match=f"^{argument}"):
        rs.Cluster(**kwargs)


def test_run_tasks_refuses_what_is_not_a_cluster():
    with pytest.raises(rs.RobustStanInputError, match="^cluster"):
        run_tasks(abs, [1], cluster="tcp://127.0.0.1:9")
