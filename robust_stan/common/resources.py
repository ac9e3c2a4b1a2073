"""Where the Stan library and the templates live, installed or in a checkout."""

from __future__ import annotations

import hashlib
import re
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

    With CmdStanPy: ``CmdStanModel(stan_file=..., stanc_options={"include-paths":
    [rs.stan_include_path()]})``.

    Returns
    -------
    str
        The folder's path.
    """
    return str(_find("stan"))


def templates_path() -> Path:
    """Folder holding the Jinja2 templates of the generated programs."""
    return _find("templates")


LIBRARY_FILE = "robust_stan.stanfunctions"


def library_code() -> str:
    """Text of the Stan function library."""
    return (Path(stan_include_path()) / LIBRARY_FILE).read_text()


#: Declarations of the native losses (defined in C++ by NATIVE_HEADER), included by the built-in
#: models' programs; a program that includes it is translated with stanc's --allow-undefined and
#: compiled with the header.
NATIVE_FILE = "robust_stan_native.stanfunctions"
NATIVE_HEADER = "robust_stan_native.hpp"
#: A line of NATIVE_FILE, which marks a program that holds its declarations (includes expanded).
NATIVE_MARK = "// robust-stan native losses: declared here, defined in C++ by robust_stan_native.hpp"


def native_code() -> str:
    """Text of the native losses' declarations."""
    return (Path(stan_include_path()) / NATIVE_FILE).read_text()


def native_header_path() -> Path:
    """The C++ header defining the native losses (CmdStanPy: ``user_header=``).

    Returns
    -------
    pathlib.Path
        The header's path.
    """
    return Path(stan_include_path()) / NATIVE_HEADER


def uses_native_functions(stan_code: str) -> bool:
    """True when the program includes (or holds) the native losses' declarations."""
    return NATIVE_MARK in stan_code or re.search(rf"^\s*#include\s+{re.escape(NATIVE_FILE)}\s*$", stan_code,
                                                   flags=re.MULTILINE) is not None


def build_digest(stan_code: str) -> str:
    """A build's cache key: the hash of the program's text and, when it uses the native losses, of
    their header (a new header is a new build)."""
    header = native_header_path().read_bytes() if uses_native_functions(stan_code) else b""
    return hashlib.sha256(stan_code.encode() + header).hexdigest()[:16]
