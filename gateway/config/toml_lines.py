"""Where each key of a TOML text is written: the line numbers tomllib does not give.

``KeyLines`` parses growing prefixes of the text (cut at line ends) with tomllib
itself and notes, for each key path that first appears, the first non-blank,
non-comment line after the previous prefix that parsed. Multi-line strings,
arrays and inline tables are thereby handled by the real parser, not by a
second, approximate one. A key path is a tuple of keys and array indices, e.g.
``("models", 1, "replicas")`` for the ``replicas`` of the second ``[[models]]``.
"""
from __future__ import annotations

import tomllib

Path_ = tuple[str | int, ...]


class KeyLines:
    """The line (1-based) where each key path of a TOML text is written, found lazily: the scan stops
    at the line that introduces the path asked for (errors early in a long file cost little)."""

    def __init__(self, text: str):
        self._found: dict[Path_, int] = {}
        self._scan = _scan(text)

    def line(self, path: Path_) -> int | None:
        """The line of ``path``, else of its nearest enclosing table that has one."""
        for found, line in self._scan:
            self._found[found] = line
            if found == path:
                break
        while path:
            if path in self._found:
                return self._found[path]
            path = path[:-1]
        return None


def _scan(text: str):
    """(key path, line) for every key path, in the order the lines introduce them."""
    src = text.splitlines(keepends=True)
    known: set[Path_] = set()
    start = 0  # first line after the last prefix that parsed
    for n in range(1, len(src) + 1):
        if not _content(src[n - 1]) and n < len(src):
            continue
        try:
            doc = tomllib.loads("".join(src[:n]))
        except tomllib.TOMLDecodeError:
            continue
        first = next((i for i in range(start, n) if _content(src[i])), n - 1)
        paths = list(_paths(doc, ()))
        for path in paths:
            if path not in known:
                yield path, first + 1
        known, start = set(paths), n


def _content(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _paths(value, prefix: Path_):
    if isinstance(value, dict):
        for key, sub in value.items():
            yield prefix + (key,)
            yield from _paths(sub, prefix + (key,))
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            if isinstance(sub, dict):
                yield prefix + (i,)
                yield from _paths(sub, prefix + (i,))
