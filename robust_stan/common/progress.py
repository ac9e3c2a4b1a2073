"""Progress display for long steps that report no progress of their own (compiles)."""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager

from tqdm.auto import tqdm


@contextmanager
def elapsed_bar(description: str, show: bool = True):
    """Show ``description`` with a running clock until the block ends."""
    bar = tqdm(total=None, desc=description, bar_format="{desc}: {elapsed}", disable=not show, file=sys.stderr)
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
