"""A compiled program's build files, carried to another process's cache (``rs.Cluster(ship_builds=True)``).

Workers on another machine do not see this machine's build cache. Rather than compile the
program again (15-60 s on each worker), the driver reads the build's files once and each
worker writes them into its own engine cache, where the engine then finds the build as if
it had made it.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class BuildFiles:
    """The files of one build: ``folder`` below the engine's cache root, and each file's bytes
    (in the order they are to be written). ``key`` names the build. httpstan names a build by
    the program's text and the Python executable's path as well, so its builds also carry the
    text (``program_text``) and each worker files them under its own name."""

    engine: str
    folder: str
    files: dict[str, bytes] = field(repr=False)
    program_text: str | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return f"{self.engine}/{self.folder}"

    def folder_here(self) -> str:
        """The build's folder name in this process (for httpstan, from this process's executable)."""
        if self.engine != "httpstan":
            return self.folder
        import httpstan.models

        return httpstan.models.calculate_model_name(self.program_text).split("/")[1]

    def install(self) -> str:
        """Write the files into this process's engine cache (those not there yet); returns the folder.
        Each file is written under a temporary name and renamed, so a process loading the build
        never sees half a file."""
        here = self.folder_here()
        target = cache_root(self.engine) / here
        target.mkdir(parents=True, exist_ok=True)
        for original, content in self.files.items():
            name = original.replace(self.folder, here)
            path = target / name
            if path.exists() and path.stat().st_size == len(content):
                continue
            handle, temporary = tempfile.mkstemp(dir=target, prefix=f".{name}.")
            with os.fdopen(handle, "wb") as out:
                out.write(content)
            os.chmod(temporary, 0o755)
            os.replace(temporary, path)
        return str(target)


def cache_root(engine: str) -> Path:
    """The folder below which ``engine`` keeps its builds, one folder per program."""
    if engine == "httpstan":
        import httpstan.cache

        return httpstan.cache.cache_directory() / "models"
    if engine == "cmdstan":
        from .base import cache_folder

        return cache_folder() / "cmdstan"
    raise ValueError(f"no build cache for engine {engine!r}")


def read_build_files(engine: str, folder: Path, names: list[str], program_text: str | None = None) -> BuildFiles:
    """The named files of the build in ``folder`` (below ``engine``'s cache root)."""
    return BuildFiles(engine, folder.name, {name: (folder / name).read_bytes() for name in names}, program_text)
