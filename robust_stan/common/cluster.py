"""Where independent tasks run: in this process, or on a Dask cluster (``dask.distributed``).

A :class:`Cluster` wraps a ``dask.distributed.Client``: one you made, one connected to a
scheduler's address, or one on a new ``LocalCluster`` with a worker process per core. Its
:meth:`Cluster.map` runs a function over a list of tasks and returns the results in the
tasks' order. Work that needs seeds gets them from :func:`task_seeds`, one per task, derived
from the user's seed and the task's position only, so the results do not depend on how many
workers there are or which worker ran which task. A worker that dies loses nothing: the
scheduler reruns its tasks elsewhere (Dask's own fault tolerance), and a rerun task gives
the same result because its seed is part of the task.

Compiled Stan programs reach the workers through the engines' build caches, found by the
program's text (httpstan's cache, CmdStan's executables next to the cached program): a
worker that sees the same file system loads the build instead of compiling again. For
workers that do not (another machine), ``Cluster(ship_builds=True)`` sends the build's files
to every worker once, before the first task of a program.
"""

from __future__ import annotations

import multiprocessing
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from functools import partial

import numpy as np
from tqdm.auto import tqdm

from .errors import RobustStanInputError, RobustStanWarning

# NUTS on httpstan runs each chain in a child process; Dask's default worker processes are
# daemonic and may not have children, so the workers robust-stan starts are not. Dask's nanny
# also starts workers with MALLOC_TRIM_THRESHOLD_=65536, which makes glibc return memory to the
# system at almost every free: NUTS on httpstan then runs far slower (benchmarks/cluster_scaling.py
# measures it), so robust-stan's workers start without it.
_WORKER_CONFIG = {"distributed.worker.daemon": False,
                  "distributed.nanny.pre-spawn-environ": {"OMP_NUM_THREADS": 1, "MKL_NUM_THREADS": 1,
                                                          "OPENBLAS_NUM_THREADS": 1}}
#: below this, glibc's trimming slows Stan's sampling measurably (the advice in Cluster's docstring)
_SLOW_TRIM_THRESHOLD = 1 << 20


def _distributed():
    try:
        import distributed
    except ImportError as exc:  # pragma: no cover - the test extra installs it
        raise RobustStanInputError(
            "cluster: running on a cluster needs Dask's distributed scheduler; pip install 'robust-stan[dask]' "
            "(or pip install 'dask[distributed]')") from exc
    return distributed


def task_seeds(seed: int | None, count: int) -> list[int]:
    """Independent seeds for Stan and NumPy, one per task, from a seed and the task's position alone.

    Parameters
    ----------
    seed : int or None
        The user's seed; None draws fresh entropy (not reproducible).
    count : int
        The number of tasks.

    Returns
    -------
    list of int
        ``count`` seeds in [0, 2^31 - 1), from NumPy's ``SeedSequence.spawn``.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise RobustStanInputError(f"seed: must be a non-negative integer or None, got {seed!r}")
    children = np.random.SeedSequence(seed).spawn(count)
    return [int(child.generate_state(1)[0] % (2**31 - 1)) for child in children]


#: set (to "1") in the processes where a Cluster runs tasks: a worker loads builds, it does not
#: make them (robust_stan.engines.base.refuse_build_on_worker reads it)
ON_WORKER = "ROBUST_STAN_ON_WORKER"


def _run_on_worker(function: Callable, *arguments):
    """``function(*arguments)`` in a worker, where robust-stan loads builds but does not make them."""
    os.environ[ON_WORKER] = "1"
    return function(*arguments)


def _worker_settings() -> tuple[bool, int | None]:
    """Whether this worker process is daemonic, and its MALLOC_TRIM_THRESHOLD_ (None: unset)."""
    threshold = os.environ.get("MALLOC_TRIM_THRESHOLD_")
    return multiprocessing.current_process().daemon, int(threshold) if threshold and threshold.isdigit() else None


class Cluster:
    """Where robust-stan runs independent tasks: a Dask cluster.

    Workers must be allowed child processes (NUTS on httpstan runs each chain in one): start them
    with ``DASK_DISTRIBUTED__WORKER__DAEMON=False`` in their environment, as the user guide's
    page "Running on a Dask cluster" shows; robust-stan checks this when it connects. Give them
    ``MALLOC_TRIM_THRESHOLD_=1073741824`` as well: Dask's nanny otherwise sets 65536, which slows
    NUTS down (robust-stan warns when it finds that). Use as a context manager, or call
    :meth:`close`; a cluster robust-stan started is shut down then, a client you gave is not.

    Parameters
    ----------
    client : dask.distributed.Client or None, default None
        An existing client to use.
    address : str or None, default None
        A running scheduler's address (``"tcp://host:8786"``), whose workers run ``dask worker
        ADDRESS``. With neither ``client`` nor ``address``, a new ``LocalCluster`` starts.
    workers : int or None, default None
        Worker processes of a new ``LocalCluster`` (one thread each, BLAS limited to one thread
        per worker); None is one per core.
    timeout : float, default 30.0
        Seconds to reach ``address``, or a clear error.
    ship_builds : bool, default False
        Send each compiled program's files to the workers (for workers that do not share this
        machine's file system).
    show_progress : bool, default True
        Show progress bars of the tasks.
    """

    def __init__(self, client=None, address: str | None = None, workers: int | None = None,
                 timeout: float = 30.0, ship_builds: bool = False, show_progress: bool = True):
        distributed = _distributed()
        if client is not None and address is not None:
            raise RobustStanInputError("client, address: give one of them, not both")
        if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
            raise RobustStanInputError(f"timeout: must be a positive number of seconds, got {timeout!r}")
        if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
            raise RobustStanInputError(f"workers: must be a positive integer, got {workers!r}")
        if workers is not None and (client is not None or address is not None):
            raise RobustStanInputError("workers: only for a new local cluster; a running cluster has its own")
        self.ship_builds = bool(ship_builds)
        self.show_progress = bool(show_progress)
        self._shipped: set[str] = set()
        self._local = self._config = None
        self._own_client = client is None
        if client is not None:
            if not isinstance(client, distributed.Client):
                raise RobustStanInputError(f"client: expected a dask.distributed.Client, got {type(client).__name__}")
            self.client = client
        elif address is not None:
            if not isinstance(address, str) or not address:
                raise RobustStanInputError(f"address: expected a scheduler address such as 'tcp://host:8786', "
                                           f"got {address!r}")
            try:
                self.client = distributed.Client(address, timeout=timeout)
            except (OSError, TimeoutError) as exc:
                raise RobustStanInputError(f"address: no Dask scheduler answered at {address!r} within {timeout:g} s "
                                           f"({type(exc).__name__}: {exc})") from exc
        else:
            import dask

            # the nannies read this whenever they (re)start a worker, so it stays set until close()
            self._config = dask.config.set(_WORKER_CONFIG)
            self._local = distributed.LocalCluster(n_workers=workers or os.cpu_count() or 1,
                                                   threads_per_worker=1, processes=True, dashboard_address=None)
            self.client = distributed.Client(self._local)
        self._check_workers()

    def _check_workers(self) -> None:
        settings = self.client.run(_worker_settings)
        daemonic = [worker for worker, (flag, _) in settings.items() if flag]
        if daemonic:
            raise RobustStanInputError(
                f"address: the workers {daemonic} are daemonic processes, which cannot start the child processes "
                "that run NUTS chains; start them with DASK_DISTRIBUTED__WORKER__DAEMON=False in their environment")
        trimming = [worker for worker, (_, threshold) in settings.items()
                    if threshold is not None and threshold < _SLOW_TRIM_THRESHOLD]
        if trimming:
            warnings.warn(f"rs.Cluster: the workers {trimming} run with a small MALLOC_TRIM_THRESHOLD_ (Dask's "
                          "nanny sets 65536), which makes NUTS about twice as slow; start them with "
                          "MALLOC_TRIM_THRESHOLD_=1073741824 in their environment", RobustStanWarning, stacklevel=3)

    @property
    def workers(self) -> int:
        """How many workers the scheduler has now."""
        return len(self.client.scheduler_info()["workers"])

    def map(self, function: Callable, tasks: Sequence, description: str = "tasks", programs: Iterable = ()) -> list:
        """``[function(task) for task in tasks]``, run on the workers; results in the tasks' order.

        Results stream back as tasks finish (a progress bar counts them). ``function`` and the tasks
        must pickle (models do: a model travels without its compiled program, which each worker
        loads from the build cache; a worker never compiles, and a program missing from its cache is
        an error naming ``ship_builds``). An error in a task is raised here, with the task's
        position (bad input as it is).

        Parameters
        ----------
        function : callable
            Called with one task.
        tasks : sequence
            The tasks.
        description : str, default "tasks"
            Label of the progress bar.
        programs : iterable, default ()
            The compiled programs the tasks use, whose build files are sent first when
            ``ship_builds`` is set.

        Returns
        -------
        list
            The results, in the tasks' order.
        """
        tasks = list(tasks)
        for program in programs:
            self.ship(program)
        futures = self.client.map(partial(_run_on_worker, function), tasks, pure=False)
        position = {future.key: k for k, future in enumerate(futures)}
        results: list = [None] * len(tasks)
        distributed = _distributed()
        with tqdm(total=len(tasks), desc=description, unit="task", disable=not self.show_progress) as bar:
            for future in distributed.as_completed(futures):
                k = position[future.key]
                try:
                    results[k] = future.result()
                except Exception as exc:
                    for other in futures:
                        other.cancel()
                    if isinstance(exc, RobustStanInputError):  # bad input, found on a worker: as it is
                        raise
                    raise RuntimeError(f"cluster: task {k} of {len(tasks)} failed: {type(exc).__name__}: {exc}") \
                        from exc
                bar.update(1)
        return results

    def submit(self, function: Callable, *arguments):
        """Run ``function(*arguments)`` on a worker, with :meth:`map`'s rules.

        Parameters
        ----------
        function : callable
            The function.
        *arguments
            Its arguments; futures among them, also inside lists and dicts, arrive as their values.

        Returns
        -------
        distributed.Future
            The future of the result.
        """
        return self.client.submit(_run_on_worker, function, *arguments, pure=False)

    def ship(self, program) -> None:
        """Send a compiled program's build files to every worker, once per program, if ``ship_builds``.

        A worker that already holds the build keeps it.

        Parameters
        ----------
        program : CompiledProgram
            An engine's compiled program (``model.compile()``).
        """
        if not self.ship_builds:
            return
        files = program.build_files()
        if files.key in self._shipped:
            return
        self.client.run(files.install)
        self._shipped.add(files.key)

    def close(self) -> None:
        """Close the client (and the local cluster) robust-stan started."""
        if self._own_client:
            self.client.close()
        if self._local is not None:
            self._local.close()
            self._local = None
        if self._config is not None:
            self._config.__exit__(None, None, None)
            self._config = None

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<robust_stan.Cluster {self.client.scheduler.address} with {self.workers} workers>"


def require_cluster(cluster) -> Cluster | None:
    """``cluster`` itself when it is an :class:`rs.Cluster` or None; else an error naming it."""
    if cluster is not None and not isinstance(cluster, Cluster):
        raise RobustStanInputError(f"cluster: expected an rs.Cluster or None, got {type(cluster).__name__}")
    return cluster


def run_tasks(function: Callable, tasks: Sequence, cluster: Cluster | None = None, description: str = "tasks",
              programs: Iterable = ()) -> list:
    """``function`` over ``tasks``: here, in order, without a cluster; on ``cluster`` otherwise."""
    cluster = require_cluster(cluster)
    if cluster is None:
        return [function(task) for task in tasks]
    return cluster.map(function, tasks, description, programs)
