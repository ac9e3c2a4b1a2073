"""The supported ranges: pyproject.toml's lower bounds are what CI's oldest stack pins."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def test_oldest_stack_pins_exactly_the_declared_lower_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    requirements = project["dependencies"] + project["optional-dependencies"]["test"]
    lower = {_name(r): re.search(r">=\s*([^,;\s]+)", r).group(1) for r in requirements}
    pins = {}
    for line in (ROOT / ".ci" / "constraints-lowest.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[_name(name)] = version.strip()
    assert pins == lower
    assert project["requires-python"] == ">=3.11"
