"""Builds a Stan program into httpstan's extension module, with the compiler's messages kept.

httpstan compiles with its own flags (the C++ standard and optimisation its
Stan headers need: C++14 up to httpstan 4.13, C++17 from 4.14 on), so
robust-stan never names a standard: it appends only ``-include`` of its C
interface (``oracle_interface.hpp``) to the compiler arguments httpstan gives
the model's extension.

httpstan links every module with a prebuilt ``stan_services.o`` (its pybind11
bindings). The httpstan 4.17.0 wheel for CPython 3.13 ships that object built
for Python 3.10, so no module built from it loads on 3.13 ("module was
compiled for Python 3.10"; "undefined symbol: _PyThreadState_UncheckedGet").
When the shipped object was built for another Python than the running one,
the child compiles httpstan's own ``stan_services.cpp`` once, with the same
settings httpstan gives the model, keeps the object in httpstan's cache and
links models with it instead.

The environment variable ``ROBUST_STAN_CXXFLAGS`` adds compiler flags after httpstan's own
(:func:`extra_compiler_flags`): ``-O1`` builds about a fifth faster than httpstan's ``-O3`` and
samples slower; the flags are part of the build's name, so a build made with other flags is not
reused.

Two settings make a build faster and the module smaller: debug information is left out
(``-g0``; Python's own flags ask for ``-g``), and with GCC or clang the Stan headers and
the C interface are parsed once into a precompiled header, kept in httpstan's
cache for the compiler settings it was made with (:func:`precompiled_header`).
clang's header also holds the templates it instantiates (``-fpch-instantiate-templates``),
which each model then reuses. Another compiler, or a precompiled header that cannot be made,
leaves the build as it was: the interface header included as text. The compiler is the one
setuptools uses, ``CXX`` (or ``CC``) from the environment when set. Eigen's warnings that
attributes on template arguments are ignored are not asked for
(``-Wno-ignored-attributes``): under Python's ``-Wall`` every model drew hundreds
of them, each with its chain of template instantiations, which filled the
compiler's output that httpstan keeps beside the module; the object is the same
without them.

The build runs in a child Python process. httpstan sends the compiler's
standard error to a file it drops when the build fails; in the child,
``HTTPSTAN_DEBUG=1`` leaves the compiler's output on the child's standard
error, which the parent reads, so a failed build can show the compiler's own message.
The child's environment changes nothing in the user's process.

A program that uses robust-stan's native losses (``robust_stan_native.stanfunctions``)
is translated with stanc's ``--allow-undefined`` and compiled with their header
(``robust_stan_native.hpp``) included too; see :func:`forced_headers`.

The child runs :func:`main` with the program text (already marked with the
interface's version) on standard input.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from ..building.stanc import stanc_process
from ..common.errors import StanCompileError
from ..common.resources import native_header_path, uses_native_functions
from .native_model import INTERFACE_HEADER, SECOND_ORDER_MARK


def forced_headers(code: str) -> tuple[Path, ...]:
    """Headers compiled into the module of ``code``: robust-stan's C interface, and the native
    losses' definitions when the program declares them."""
    return (INTERFACE_HEADER, native_header_path()) if uses_native_functions(code) else (INTERFACE_HEADER,)


#: The flags every model is compiled with after httpstan's own: no debug information, and not Eigen's
#: ignored-attributes warnings (see the module's docstring).
MODEL_COMPILER_FLAGS = ["-g0", "-Wno-ignored-attributes"]

#: The environment variable of :func:`extra_compiler_flags`.
CXXFLAGS_VARIABLE = "ROBUST_STAN_CXXFLAGS"


def extra_compiler_flags() -> list[str]:
    """The compiler flags in ``ROBUST_STAN_CXXFLAGS`` (split as a shell splits them), added after
    httpstan's own, so that ``-O1`` replaces httpstan's ``-O3``; none when it is unset or empty."""
    try:
        return shlex.split(os.environ.get(CXXFLAGS_VARIABLE, ""))
    except ValueError as exc:
        raise StanCompileError(f"{CXXFLAGS_VARIABLE}: cannot split {os.environ[CXXFLAGS_VARIABLE]!r} "
                               f"into compiler flags ({exc})") from None


def translate(program_code: str, stan_model_name: str) -> tuple[str, str]:
    """A program in C++ as httpstan's ``httpstan.compile.compile`` gives it (stanc with ``--name``,
    ``--warn-pedantic`` and ``--print-cpp``): the C++ code and stanc's warnings; ValueError with
    stanc's message on an error. stanc runs through :func:`~robust_stan.building.stanc.stanc_process`
    (which adds ``--allow-undefined`` for the native losses) with no time limit: httpstan's own call
    gives stanc one second, which a niced process on busy cores misses.

    Parameters
    ----------
    program_code : str
        The Stan program.
    stan_model_name : str
        The C++ model's name.
    """
    done, message = stanc_process(program_code, ["--name", stan_model_name, "--warn-pedantic", "--print-cpp"])
    if done.returncode != 0:
        raise ValueError(message)
    return done.stdout.strip(), done.stderr.strip()


#: How many of the compiler's last lines a failed build shows.
MESSAGE_LINES = 40


#: The start of the child's program (its first argument is the folder of the robust_stan package): it
#: imports this module without running the ``__init__`` of robust_stan or of its subpackages, which import
#: the whole library (pandas, ArviZ, SciPy: most of the child's start-up time). The modules a build
#: needs import only the standard library, NumPy and httpstan.
CHILD_IMPORTS = """\
import os, sys, types
for name in ("robust_stan", "robust_stan.building", "robust_stan.common", "robust_stan.engines"):
    package = types.ModuleType(name)
    package.__path__ = [os.path.join(sys.argv[1], *name.split(".")[1:])]
    sys.modules[name] = package
from robust_stan.engines.httpstan_build import main
"""


def build_in_child(marked_code: str) -> str:
    """Build ``marked_code`` into httpstan's cache; return the compiler's messages.

    Raises StanCompileError with the last lines of the compiler's output when
    the build fails.
    """
    env = dict(os.environ)
    env["HTTPSTAN_DEBUG"] = "1"
    # setuptools puts its intermediate files under the working directory: a scratch one, not the user's
    with tempfile.TemporaryDirectory(prefix="robust_stan_build_") as scratch:
        done = subprocess.run([sys.executable, "-c", CHILD_IMPORTS + "main()\n", str(Path(__file__).resolve().parents[1])],
                              input=marked_code,
                              capture_output=True, text=True, env=env, cwd=scratch)
    messages = done.stderr
    if done.returncode != 0:
        raise StanCompileError("The C++ compiler could not build the Stan program (httpstan engine). "
                               f"The last lines of its output:\n{last_lines(messages)}")
    return messages


def last_lines(text: str, count: int = MESSAGE_LINES) -> str:
    """The first error line of a compiler's output and its last ``count`` non-empty lines."""
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) <= count:
        return "\n".join(lines)
    first_error = next((line for line in lines[:-count] if "error" in line), None)
    head = [first_error, "[...]"] if first_error else [f"[... {len(lines) - count} earlier lines]"]
    return "\n".join(head + lines[-count:])


def built_for_python(object_file: Path) -> str | None:
    """The Python version ("3.10") a pybind11 object was compiled for, read from its version check.

    pybind11 keeps the compiled-for version as a string literal in the same
    read-only data as its "Python version mismatch" message; the "3.N" literal
    nearest that message is taken. None when the object has no such check.
    """
    data = object_file.read_bytes()
    message = data.find(b"module was compiled for Python")
    if message < 0:
        return None
    found = [(abs(m.start() - message), m.group(1).decode()) for m in re.finditer(rb"\x00(3\.\d{1,2})\x00", data)]
    return min(found)[1] if found else None


def _services_object_for_this_python(hs, extension) -> Path:
    """httpstan's ``stan_services.cpp`` compiled for the running Python with the settings httpstan gives
    the model's ``extension`` (its own folder left out), built once and cached."""
    include_dirs = _shared_include_dirs(extension)
    settings = repr((sys.version, hs.__version__, extension.define_macros, include_dirs,
                     extension.extra_compile_args, os.environ.get("CPPFLAGS")))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}-{hashlib.sha256(settings.encode()).hexdigest()[:12]}"
    built = hs.cache.cache_directory() / "robust_stan_services" / tag / "stan_services.o"
    return _built_once(built, lambda: _compile_services(hs, extension, include_dirs, built.parent / "build", built))


def _shared_include_dirs(extension) -> list[str]:
    """The extension's include folders without the model's own folder (which differs per model)."""
    model_folder = str(Path(extension.sources[0]).parent)
    return [folder for folder in extension.include_dirs if folder != model_folder]


def _built_once(built: Path, build) -> Path:
    """``built``, made by ``build()`` unless it exists; parallel builds of two models take turns here."""
    built.parent.mkdir(parents=True, exist_ok=True)
    with open(built.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not built.exists():
            build()
    return built


def _compiler_command() -> list[str]:
    """The compiler and flags setuptools compiles an extension's C++ sources with (Python's CFLAGS;
    CXX, CC and CPPFLAGS from the environment; setuptools before 72 compiles C++ with CC)."""
    import setuptools  # noqa: F401  (``distutils`` is then setuptools' own, on every Python)
    # isort: split
    from distutils.ccompiler import new_compiler
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    return list(getattr(compiler, "compiler_so_cxx", None) or compiler.compiler_so)  # type: ignore[attr-defined]


def compiler_family(command: list[str]) -> str | None:
    """"gcc" or "clang" for the compiler ``command`` runs (clang also defines __GNUC__), None for another
    compiler or one that does not answer.

    Parameters
    ----------
    command : list of str
        The compiler and its flags, as :func:`_compiler_command` gives them.
    """
    try:
        macros = subprocess.run(command[:1] + ["-dM", "-E", "-x", "c++", os.devnull], capture_output=True,
                                text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    if "__clang__" in macros:
        return "clang"
    return "gcc" if "__GNUC__" in macros else None


class PrecompiledHeaderKind(NamedTuple):
    """How one compiler family makes and uses a precompiled header.

    Parameters
    ----------
    suffix : str
        Added to the header's name to name the precompiled file.
    make : list of str
        The flags that make it, after the compilation's own.
    use : list of str
        The flags that use it (``{}`` stands for the header's name).
    """

    suffix: str
    make: list[str]
    use: list[str]


#: GCC reads ``NAME.gch`` in place of an ``-include NAME`` whose flags match. clang takes its file by name
#: and refuses one made with other flags; its file also holds the templates the headers instantiate, and,
#: with no timestamps in it, is not refused when its headers are reinstalled unchanged.
PRECOMPILED = {
    "gcc": PrecompiledHeaderKind(".gch", [], ["-include", "{}"]),
    "clang": PrecompiledHeaderKind(".pch", ["-fpch-instantiate-templates", "-Xclang", "-fno-pch-timestamp"],
                                   ["-include-pch", "{}.pch"]),
}


def precompiled_header(cache: Path, arguments: list[str], includes: list[str], family: str = "gcc") -> Path | None:
    """A header of ``includes`` (one ``#include`` line each) precompiled by ``arguments`` (the compiler
    and the flags of the compilations that will use it), built once per distinct setting under ``cache``;
    None if the compiler could not build it (its messages are kept in ``failed.log``, and it is not tried
    again). :func:`using_precompiled_header` gives the flags that use it.

    GCC uses ``NAME.gch`` in place of ``NAME`` when the flags match and the header is the first one
    included (``-include``); otherwise it reads the header as text, so a stale or foreign ``.gch``
    costs time, never correctness. clang refuses a header made with other flags or by another clang
    (and a build given one fails), so each setting has its own: the setting is the flags, the family and
    the compiler's identity (:func:`compiler_identity`, which changes when the compiler is upgraded
    under the same name), and a header whose file is missing is not given.

    Parameters
    ----------
    cache : Path
        The folder the headers are kept in, one subfolder per setting.
    arguments : list of str
        The compiler and its flags.
    includes : list of str
        What each ``#include`` line names, with its ``<>`` or ``""``.
    family : str
        ``"gcc"`` or ``"clang"``: the compiler family of ``arguments[0]`` (:func:`compiler_family`).
    """
    made = PRECOMPILED[family]
    text = "".join(f"#include {name}\n" for name in includes)
    settings = repr((sys.version, arguments, family, compiler_identity(arguments[0]), text,
                     [_read_if_file(name) for name in includes]))
    folder = cache / hashlib.sha256(settings.encode()).hexdigest()[:16]
    header, failed = folder / "robust_stan_pch.hpp", folder / "failed.log"
    target = Path(f"{header}{made.suffix}")

    def build():
        header.write_text(text)
        (folder / "arguments.json").write_text(json.dumps(arguments))  # what the header is valid for
        done = subprocess.run(arguments + made.make + ["-x", "c++-header", str(header), "-o", f"{target}.part"],
                              capture_output=True, text=True)
        if done.returncode == 0:
            os.replace(f"{target}.part", target)
        else:
            failed.write_text(done.stderr)
            Path(f"{target}.part").unlink(missing_ok=True)
        (folder / "done").touch()

    _built_once(folder / "done", build)
    return None if failed.exists() or not target.exists() else header


def compiler_identity(compiler: str) -> str:
    """The real path of the program ``compiler`` runs and the first line of its ``--version``: what tells
    one compiler of a name from another, or from the same name after an upgrade; empty parts for one that
    cannot be found or does not answer.

    Parameters
    ----------
    compiler : str
        The compiler's command (a name on PATH or a path).
    """
    found = shutil.which(compiler)
    try:
        version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        version = ""
    return f"{os.path.realpath(found) if found else ''}\n{version.strip().splitlines()[0] if version.strip() else ''}"


def using_precompiled_header(header: Path, family: str) -> list[str]:
    """The compiler flags that use the precompiled ``header`` of :func:`precompiled_header`.

    Parameters
    ----------
    header : Path
        What :func:`precompiled_header` gave.
    family : str
        ``"gcc"`` or ``"clang"``, as given to :func:`precompiled_header`.
    """
    return [flag.format(header) for flag in PRECOMPILED[family].use]


def _read_if_file(name: str) -> bytes:
    """The bytes of an ``#include "path"`` target (so that an edited header gets a new build)."""
    path = Path(name.strip('"'))
    return path.read_bytes() if name.startswith('"') and path.is_file() else b""


#: What the precompiled header of every model holds: Stan's model header and robust-stan's C interface.
STAN_PRECOMPILED_INCLUDES = ["<stan/model/model_header.hpp>", f'"{INTERFACE_HEADER}"']


def _stan_precompiled_header(hs, extension, command: list[str], flags: list[str], family: str) -> Path | None:
    """Stan's model header and robust-stan's C interface, precompiled for the model ``extension``
    (its macros, shared include folders and flags, then ``flags``) by the ``family`` compiler's ``command``.
    The model's own ``#include <stan/model/model_header.hpp>`` is then skipped by its include guards."""
    macros = [f"-D{name}" if value is None else f"-D{name}={value}" for name, value in extension.define_macros]
    arguments = (command + macros + [f"-I{folder}" for folder in _shared_include_dirs(extension)]
                 + list(extension.extra_compile_args or []) + flags)
    return precompiled_header(hs.cache.cache_directory() / "robust_stan_pch", arguments, STAN_PRECOMPILED_INCLUDES,
                              family)


def _compile_services(hs, extension, include_dirs: list[str], work: Path, built: Path) -> None:
    """Compile httpstan's ``stan_services.cpp`` in ``work`` and move the object to ``built``."""
    import setuptools
    from setuptools.command.build_ext import build_ext

    services = setuptools.Extension(
        "robust_stan_services", sources=[str(Path(hs.__file__).with_name("stan_services.cpp"))], language="c++",
        define_macros=extension.define_macros, include_dirs=include_dirs,
        extra_compile_args=extension.extra_compile_args)
    command = build_ext(setuptools.Distribution({"ext_modules": [services]}))
    command.build_temp = command.build_lib = str(work)
    command.finalize_options()
    try:
        command.run()  # compiles the object (kept) and links a module nothing loads (deleted)
        (object_file,) = work.rglob("stan_services.o")
        object_file.replace(built)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def debug_stripping_link_flags(platform: str | None = None) -> list[str]:
    """The linker flags that leave debug information out of a model's module: httpstan's
    ``stan_services.o`` carries it (Python's ``-g``), which would bloat every module.

    On Linux every linker a compiler driver picks (GNU ld, gold, lld, mold) takes ``--strip-debug``;
    Apple's ld64 refuses it (and keeps DWARF out of the module anyway), so elsewhere no flag is added.
    Only builds by GCC or clang (:func:`compiler_family`) get these flags.

    Parameters
    ----------
    platform : str or None, default None
        A ``sys.platform`` value; None for the running one.
    """
    return ["-Wl,--strip-debug"] if (platform or sys.platform).startswith("linux") else []


def _add_our_parts(hs, headers: tuple[Path, ...], services_for_this_python: bool, second_order: bool = False) -> None:
    """Make httpstan's build add ``headers`` to its own compiler arguments, translate with
    :func:`translate` and, if
    ``services_for_this_python``, link with :func:`_services_object_for_this_python`. With
    ``second_order`` the model also gets its fvar<var> log_prob (STAN_MODEL_FVAR_VAR): Stan's
    model_base declares those virtual functions after all the others, so httpstan's services,
    built without them, see the same table of virtual functions.

    The model is compiled with the ``MODEL_COMPILER_FLAGS`` and the :func:`extra_compiler_flags` and, where
    :func:`_stan_precompiled_header` gives one (GCC or clang), that header in place of the C interface's
    (``headers[0]``).
    """
    run_build_ext = hs.build_ext.run_build_ext
    hs.compile.compile = translate

    def run_with_our_parts(extensions, build_lib):
        for extension in extensions:
            shipped = [o for o in extension.extra_objects if Path(o).name == "stan_services.o"]
            if services_for_this_python and shipped:
                own = _services_object_for_this_python(hs, extension)
                extension.extra_objects = [o for o in extension.extra_objects if o not in shipped] + [str(own)]
            flags = (MODEL_COMPILER_FLAGS + (["-DSTAN_MODEL_FVAR_VAR"] if second_order else [])
                     + extra_compiler_flags())
            first = ["-include", str(headers[0])]
            command = _compiler_command()
            family = compiler_family(command)
            if family is not None:
                header = _stan_precompiled_header(hs, extension, command, flags, family)
                first = using_precompiled_header(header, family) if header else first
                extension.extra_link_args = list(extension.extra_link_args or []) + debug_stripping_link_flags()
            extension.extra_compile_args = list(extension.extra_compile_args or []) + flags + first + [
                flag for header in headers[1:] for flag in ("-include", str(header))]
        return run_build_ext(extensions, build_lib)

    hs.build_ext.run_build_ext = run_with_our_parts


def main() -> None:
    """The child's work: build the program on standard input (see :func:`build_in_child`)."""
    import asyncio

    import httpstan
    import httpstan.build_ext
    import httpstan.cache
    import httpstan.models

    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    shipped_for = built_for_python(Path(httpstan.__file__).with_name("stan_services.o"))
    foreign = shipped_for not in (None, running)
    if foreign:
        print(f"robust-stan: httpstan's stan_services.o was built for Python {shipped_for}, "
              f"this is {running}: linking with one built here", file=sys.stderr)
    program = sys.stdin.read()
    _add_our_parts(httpstan, forced_headers(program), services_for_this_python=foreign,
                   second_order=SECOND_ORDER_MARK in program)
    try:
        asyncio.run(httpstan.models.build_services_extension_module(program))
    except Exception as exc:  # the compiler's own messages are already on standard error
        print(f"httpstan's build stopped: {type(exc).__name__}: {exc}", file=sys.stderr)
        sys.exit(1)

