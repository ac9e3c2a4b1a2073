"""The part of the robust-stan Stan library that a program uses.

A program that includes ``robust_stan.stanfunctions`` calls a few of its
functions, and those call a few more; the rest (the other families, the other
argument shapes) would only lengthen the C++ compile. Engines that paste the
library into the program (httpstan, BridgeStan) paste this subset: every
function the program names, and every function those name, in the library's
order, each with its documentation comment. A function is kept when any of its
overloads is named; a ``*_lpdf`` or ``*_lpmf`` is also named by its ``~`` form
and its ``_lupdf``/``_lupmf`` form. Keeping too much costs compile time only;
the transitive closure keeps nothing out that a kept function calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_UNNORMALISED_SUFFIXES = {"_lupdf": "_lpdf", "_lupmf": "_lpmf"}  # a call's suffix -> the definition's


@dataclass(frozen=True)
class LibraryFunction:
    """One top-level definition of the library: its name and its text (documentation comment included)."""

    name: str
    text: str


def _split_top_level(library: str) -> tuple[str, list[LibraryFunction]]:
    """The library's opening comment and its function definitions, in order.

    Braces are counted outside comments and string literals; the text between
    two definitions (comments, blank lines) goes with the definition after it.
    """
    items: list[LibraryFunction] = []
    depth, start, i, n = 0, 0, 0, len(library)
    while i < n:
        if library.startswith("//", i):
            i = library.find("\n", i)
            i = n if i < 0 else i
        elif library.startswith("/*", i):
            end = library.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif library[i] == '"':
            end = library.find('"', i + 1)
            i = n if end < 0 else end + 1
        else:
            if library[i] == "{":
                depth += 1
            elif library[i] == "}":
                depth -= 1
                if depth == 0:
                    text = library[start:i + 1]
                    items.append(LibraryFunction(_defined_name(text), text))
                    start = i + 1
            i += 1
    if depth != 0 or library[start:].strip():
        raise ValueError("robust-stan's Stan library does not split into function definitions")
    first = items[0].text
    header_end = first.find("\n\n")  # the file's opening comment, up to its first blank line
    header = first[:header_end + 1] if header_end > 0 else ""
    items[0] = LibraryFunction(items[0].name, first[len(header):])
    return header, items


def _defined_name(text: str) -> str:
    """The name of the function whose definition ``text`` holds (comments before it ignored)."""
    code = re.sub(r"//[^\n]*|/\*.*?\*/", " ", text, flags=re.DOTALL)
    signature = code[:code.index("{")]
    return re.findall(r"([A-Za-z_]\w*)\s*\(", signature)[0]


def _names_in(text: str) -> set[str]:
    """The function names ``text`` may call: each identifier, and its ``_lpdf``/``_lpmf`` forms."""
    names: set[str] = set()
    for identifier in _IDENTIFIER.findall(text):
        names.update((identifier, identifier + "_lpdf", identifier + "_lpmf"))
        for suffix, defined in _UNNORMALISED_SUFFIXES.items():
            if identifier.endswith(suffix):
                names.add(identifier[: -len(suffix)] + defined)
    return names


@lru_cache(maxsize=4)
def _parsed(library: str) -> tuple[str, tuple[LibraryFunction, ...], dict[str, frozenset[str]]]:
    header, items = _split_top_level(library)
    defined = {item.name for item in items}
    calls: dict[str, set[str]] = {}
    for item in items:
        calls.setdefault(item.name, set()).update(_names_in(item.text) & defined)
    return header, tuple(items), {name: frozenset(called) for name, called in calls.items()}


def library_subset(library: str, program: str) -> str:
    """The functions of ``library`` that ``program`` (its text without the library) uses.

    Parameters
    ----------
    library : str
        The library's text, as :func:`~robust_stan.common.resources.library_code` gives it.
    program : str
        The text of the program that includes it, the include line itself left out.

    Returns
    -------
    str
        The library's opening comment, then the definitions the program calls directly or
        through others, in the library's order.
    """
    header, items, calls = _parsed(library)
    needed = _names_in(program) & set(calls)
    to_visit = list(needed)
    while to_visit:
        for called in calls[to_visit.pop()] - needed:
            needed.add(called)
            to_visit.append(called)
    kept = "".join(item.text for item in items if item.name in needed)
    return f"{header}// (the functions this program uses)\n{kept.lstrip(chr(10))}\n"
