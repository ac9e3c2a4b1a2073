"""Sphinx configuration of the robust-stan documentation site.

Build (from the repository's root, with ``pip install -e ".[docs]"``)::

    python -m sphinx -W --keep-going -n -b html docs docs/_build/html

The tutorials (MyST notebooks in ``tutorials/`` and the getting-started page) are executed on every
build; a cell that raises fails the build. The pages of ``examples/results/*/README.md`` are
written into ``docs/examples/results/`` (not committed) when the build starts, so a new results
folder gets its page without an edit here. Nothing is fetched from the network: no intersphinx,
and MathJax is loaded by the reader's browser from a CDN. To read the pages offline, set
``ROBUST_STAN_DOCS_MATHJAX`` to a local copy of MathJax 3's ``es5/tex-chtml.js`` (npm package
``mathjax@3``), which holds its fonts; MathJax 4's files fetch their fonts from the CDN.
"""

from __future__ import annotations

import csv
import fnmatch
import inspect
import os
import re
from pathlib import Path

import robust_stan

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent

project = "robust-stan"
author = "the robust-stan developers"
copyright = "2026, the robust-stan developers"  # noqa: A001 (Sphinx's name)
release = robust_stan.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_nb",
    "sphinx_copybutton",
]

exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md"]
templates_path = ["_templates"]
html_static_path = ["_static"]
html_css_files = ["robust-stan.css"]

# --- warnings: every one fails the build (-W); cross-references are checked (-n) ----------------
nitpicky = True
# Types named in docstrings and signatures that have no page of their own anywhere this build can
# reach (no intersphinx offline): the Python, NumPy, pandas, ArviZ, Dask and matplotlib types.
nitpick_ignore_regex = [
    ("py:class", r"(numpy|np|pandas|pd|xarray|arviz|az|dask|distributed|matplotlib|scipy|collections)\..*"),
    ("py:class", r"(optional|array_like|array-like|mapping|callable|sequence|iterable|path-like)"),
]

# --- API reference ----------------------------------------------------------------------------------
autosummary_generate = True
autosummary_imported_members = True
autodoc_typehints = "none"  # the docstrings' Parameters sections carry the types, one by one
autodoc_member_order = "groupwise"
numpydoc_show_class_members = False  # the class template lists the members itself
numpydoc_class_members_toctree = False
numpydoc_validation_checks: set[str] = set()  # tests/test_docstrings.py checks the sections

# --- MyST and the executed notebooks ----------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist"]
myst_heading_anchors = 3  # docs/stan-functions.md links to its own headings (#normal, ...)
nb_execution_mode = "force"  # every build runs every tutorial: what the pages show is what the code does
nb_execution_raise_on_error = True  # a tutorial that raises fails the build
nb_execution_timeout = 900  # a cell that compiles a Stan program on a cold cache may take minutes
# the tutorials' programs build at -O1, as the test suite's do (docs/guide/engines.md, compiler flags): a fifth
# less compile time, the same values, and tutorial data too small for the slower sampling to show; the
# notebooks' kernels inherit it
os.environ.setdefault("ROBUST_STAN_CXXFLAGS", "-O1")
nb_execution_show_tb = True
nb_merge_streams = True

# --- HTML -------------------------------------------------------------------------------------------
html_theme = "pydata_sphinx_theme"
html_title = f"robust-stan {release}"
html_theme_options = {
    "navigation_with_keys": False,
    "header_links_before_dropdown": 6,
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {"index": [], "getting-started": []}
html_show_sourcelink = False
if os.environ.get("ROBUST_STAN_DOCS_MATHJAX"):
    mathjax_path = Path(os.environ["ROBUST_STAN_DOCS_MATHJAX"]).resolve().as_uri()


# --- the results pages ------------------------------------------------------------------------------
RESULTS = ROOT / "examples" / "results"
TABLE_ROWS = 40  # a CSV of at most this many rows is shown as a table on a folder's page without README


def _commands_by_folder() -> dict[str, str]:
    """Each folder's row of examples/results/README.md's table (the command that made it), by folder name."""
    rows = {}
    for line in (RESULTS / "README.md").read_text().splitlines():
        cells = line.split(" | ")
        if not line.startswith("| ") or "`" not in cells[0] or len(cells) < 2:
            continue
        for name in re.findall(r"`([^`]+)`", cells[0].lstrip("| ")):
            braces = re.fullmatch(r"(.*)\{(.*)\}(.*)", name)
            names = [braces[1] + part + braces[3] for part in braces[2].split(",")] if braces else [name]
            for folder in names:
                rows.setdefault(folder, cells[1].rstrip(" |"))
    return rows


def _shown(cell: str) -> str:
    """A CSV cell for display: numbers to 4 significant digits, text as written."""
    try:
        number = float(cell)
    except ValueError:
        return cell.replace("|", "\\|")
    return cell if cell.lstrip("-").isdigit() else f"{number:.4g}"


def _csv_table(path: Path) -> list[str]:
    rows = list(csv.reader(path.read_text().splitlines()))
    if not rows or len(rows) > TABLE_ROWS + 1:
        return []
    width = max(len(row) for row in rows)
    rows = [row + [""] * (width - len(row)) for row in rows]
    lines = ["| " + " | ".join(_shown(cell) for cell in rows[0]) + " |", "|" + " --- |" * width]
    lines += ["| " + " | ".join(_shown(cell) for cell in row) + " |" for row in rows[1:]]
    return [f"`{path.name}` (numbers rounded to 4 significant digits here; the file has them in full):", "",
            *lines, ""]


def write_results_pages() -> None:
    """One page per folder of ``examples/results/``: its README included whole, then its figures.

    A folder without a README gets its command (from ``examples/results/README.md``), its small CSV
    tables and its figures.
    """
    target = DOCS / "examples" / "results"
    target.mkdir(parents=True, exist_ok=True)
    folders = sorted(path for path in RESULTS.iterdir() if path.is_dir())
    wanted = {f"{folder.name}.md" for folder in folders}
    for stale in target.glob("*.md"):
        if stale.name not in wanted:
            stale.unlink()
    commands = _commands_by_folder()
    for folder in folders:
        relative = os.path.relpath(folder, target)
        readme = folder / "README.md"
        if readme.exists():
            lines = [] if readme.read_text().startswith("# ") else [f"# examples/results/{folder.name}", ""]
            lines += [f"```{{include}} {relative}/README.md", ":relative-images:", "```", ""]
        else:
            lines = [f"# examples/results/{folder.name}", ""]
            made_by = commands.get(folder.name) or next(
                (row for name, row in commands.items() if fnmatch.fnmatchcase(folder.name, name)), None)
            if made_by:
                lines += ["How it was made (from [the table of commands](../commands.md)):", "", made_by, ""]
            else:
                lines += ["How it was made: see [the table of commands](../commands.md) and the user guide.", ""]
            for table in sorted(folder.glob("*.csv")):
                lines += _csv_table(table)
        figures = sorted(folder.glob("*.png"))
        if figures:
            lines += ["## Figures", ""]
            for figure in figures:
                lines += [f"`{figure.name}`:", "", f"![{figure.stem}]({relative}/{figure.name})", ""]
        lines += [f"The folder `examples/results/{folder.name}/` holds this run's files: "
                  + ", ".join(f"`{path.name}`" for path in sorted(folder.iterdir())) + ".", ""]
        text = "\n".join(lines)
        page = target / f"{folder.name}.md"
        if not page.exists() or page.read_text() != text:  # unchanged pages keep their time stamps
            page.write_text(text)


write_results_pages()


# --- the public names' own paths --------------------------------------------------------------------
# The API reference documents each public name as robust_stan.<name>, the way users write it; a
# docstring may name it by its defining module (robust_stan.results.fits.mcmc.Fit). This maps one to
# the other, so both resolve.
def _public_aliases() -> dict[str, str]:
    aliases = {}
    for name in robust_stan.__all__:
        value = getattr(robust_stan, name)
        if inspect.isclass(value) or inspect.isfunction(value):
            aliases[f"{value.__module__}.{value.__qualname__}"] = f"robust_stan.{name}"
    return aliases


PUBLIC_ALIASES = _public_aliases()


def resolve_public_alias(app, env, node, contnode):
    """Resolve ``robust_stan.<module>.<Name>`` (or a member of it) to the page of ``robust_stan.<Name>``."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"]
    for long, short in PUBLIC_ALIASES.items():
        if target == long or target.startswith(long + "."):
            node["reftarget"] = short + target[len(long):]
            domain = env.get_domain("py")
            return domain.resolve_xref(env, node.get("refdoc"), app.builder, node["reftype"], node["reftarget"],
                                       node, contnode)
    return None


def check_api_covers_all(app) -> None:
    """Fail the build when a name of ``robust_stan.__all__`` has no entry in the API reference."""
    listed = set()
    for page in (DOCS / "api").glob("*.rst"):
        text = page.read_text()
        listed |= set(re.findall(r"^\s{3}(\w+)\s*$", text, re.MULTILINE))
        listed |= set(re.findall(r"^\.\. py:data:: (\w+)\s*$", text, re.MULTILINE))
    missing = sorted(set(robust_stan.__all__) - listed)
    if missing:
        raise RuntimeError(f"docs/api/*.rst lists no entry for {', '.join(missing)} of robust_stan.__all__")


def setup(app):
    """Connect the alias resolver and the API coverage check."""
    app.connect("missing-reference", resolve_public_alias)
    app.connect("builder-inited", check_api_covers_all)
