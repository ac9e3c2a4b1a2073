"""Scripts that write the repository's generated files (run from the repository's root, e.g.
``python -m tools.stan_library --write``); they import the installed package and are not part of it."""

from __future__ import annotations

import argparse
from pathlib import Path


def write_or_print(text: str, path: Path, description: str, argv: list[str] | None = None) -> None:
    """A generator's command line: ``--write`` writes ``text`` to ``path``; without it, print ``text``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write", action="store_true", help=f"write {path}")
    if parser.parse_args(argv).write:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        print(f"wrote {path} ({len(text.splitlines())} lines)")
    else:
        print(text)
