"""poolgate's version: the one string in pyproject.toml, read from the installed package's metadata."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("poolgate")
except PackageNotFoundError:  # imported from a source tree that was never installed
    VERSION = "0+unknown"
