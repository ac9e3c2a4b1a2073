"""Where the Stan library and the templates live, installed or in a checkout."""

from __future__ import annotations

from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parents[1]  # robust_stan/


def _find(folder: str) -> Path:
    # `pip install .` puts the folders inside the package; a source checkout
    # (and an editable install) keeps them beside it.
    for candidate in (_PACKAGE_DIR / folder, _PACKAGE_DIR.parent / folder):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"robust-stan is installed without its {folder}/ folder (looked in {_PACKAGE_DIR})")


def stan_include_path() -> str:
    """Folder holding ``robust_stan.stanfunctions``, for ``#include`` in your own programs.

    With CmdStanPy: ``CmdStanModel(stan_file=..., stanc_options={"include-paths": [rs.stan_include_path()]})``.
    """
    return str(_find("stan"))


def templates_path() -> Path:
    """Folder holding the Jinja2 templates of the generated programs."""
    return _find("templates")


LIBRARY_FILE = "robust_stan.stanfunctions"


def library_code() -> str:
    """Text of the Stan function library."""
    return (Path(stan_include_path()) / LIBRARY_FILE).read_text()
