"""Renders the Stan function library from its template and the family table.

``python -m tools.stan_library --write`` (from the repository's root) regenerates
``stan/robust_stan.stanfunctions``; the test suite checks the file is current. The installed
package reads the committed file and does not need this script.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from robust_stan.building.families import FAMILIES
from robust_stan.common.resources import LIBRARY_FILE, stan_include_path, templates_path
from tools import write_or_print


def render_library() -> str:
    """The library text as the template and family table define it."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_path())),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
    )
    template = env.get_template(LIBRARY_FILE + ".j2")
    return template.render(families=list(FAMILIES.values()))


def main(argv: list[str] | None = None) -> None:
    write_or_print(render_library(), Path(stan_include_path()) / LIBRARY_FILE, __doc__, argv)


if __name__ == "__main__":
    main()
