"""Packaging: pyproject.toml's lower bounds are what CI's oldest stack pins, and its package data ship the library."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def test_oldest_stack_pins_exactly_the_declared_lower_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = project["dependencies"] + extras["test"] + extras["lint"]  # CI's oldest stack also lints
    lower = {_name(r): re.search(r">=\s*([^,;\s]+)", r).group(1) for r in requirements}
    pins = {}
    for line in (ROOT / ".ci" / "constraints-lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    assert pins == lower
    assert project["requires-python"] == ">=3.11"


def test_package_data_ships_every_library_file():
    """A non-editable install ships every file the engines read from stan/ and templates/ (the
    library, the native losses' declarations and their C++ header, the templates): each matches a
    package-data pattern of pyproject.toml."""
    import fnmatch

    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package, folder in (("robust_stan.stan", "stan"), ("robust_stan.templates", "templates")):
        files = [f for f in (ROOT / folder).iterdir() if f.is_file()]
        assert files
        for file in files:
            assert any(fnmatch.fnmatch(file.name, pattern) for pattern in patterns[package]), file


def test_the_package_is_marked_typed():
    """PEP 561: robust_stan/py.typed exists and package data ships it, so type checkers read the
    package's annotations in an installed copy."""
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert (ROOT / "robust_stan" / "py.typed").is_file()
    assert "py.typed" in patterns["robust_stan"]


def test_every_package_folder_is_listed_for_the_wheel():
    """pyproject.toml lists the packages a wheel ships by name: every folder of robust_stan/ with an
    __init__.py is among them, so a new subpackage cannot be left out of a non-editable install."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "robust_stan").rglob("__init__.py")}
    assert folders and folders <= listed, sorted(folders - listed)
