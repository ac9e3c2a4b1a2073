"""Progress display for long steps that report no progress of their own (compiles)."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager

from tqdm.auto import tqdm


def _updates_in_place(stream) -> bool:
    """True for a terminal or a notebook; a file or a pipe would keep every redraw as a line."""
    notebook = sys.modules.get("tqdm.notebook")  # tqdm.auto imports it only inside a notebook
    if notebook is not None and issubclass(tqdm, notebook.tqdm_notebook):
        return True
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


@contextmanager
def elapsed_bar(description: str, show: bool = True):
    """Show ``description`` with a running clock until the block ends.

    Into a file or a pipe (not a terminal or a notebook) it writes one line when the block
    starts and one when it ends, with the time taken.

    Parameters
    ----------
    description : str
        What runs, e.g. "Compiling the Stan program".
    show : bool
        False shows nothing.
    """
    stream = sys.stderr
    if show and not _updates_in_place(stream):
        start = time.monotonic()
        print(f"{description} ...", file=stream, flush=True)
        outcome = "stopped"
        try:
            yield None
            outcome = "done"
        finally:
            print(f"{description}: {outcome} in {tqdm.format_interval(time.monotonic() - start)}", file=stream,
                  flush=True)
        return
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", disable=not show, file=stream)
    stop = threading.Event()

    def tick():
        while not stop.wait(1.0):
            bar.refresh()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield bar
    finally:
        stop.set()
        thread.join()
        bar.close()
