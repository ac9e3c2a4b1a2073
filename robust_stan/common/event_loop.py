"""Running httpstan's coroutines from synchronous code, in a plain script and in Jupyter alike."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def event_loop_running() -> bool:
    """Whether this thread is inside a running asyncio event loop (as a Jupyter cell is).

    Returns
    -------
    bool
        True inside a running loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to completion and return its result.

    Where no event loop is running (a script, a test) this is ``asyncio.run``. Where one is (a
    Jupyter kernel, or any asyncio application calling robust-stan), ``asyncio.run`` refuses, so the
    coroutine runs on a fresh loop in a worker thread while this thread waits for it.

    Parameters
    ----------
    coroutine : coroutine
        A coroutine not yet started.

    Returns
    -------
    object
        The coroutine's result.
    """
    if not event_loop_running():
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="robust-stan-loop") as pool:
        return pool.submit(asyncio.run, coroutine).result()
