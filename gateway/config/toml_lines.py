"""Where each key of a TOML text is written (tomllib gives no positions): one pass over the lines.

A key path is a tuple of keys and array indices, e.g. ``("models", 1, "replicas")``
for the ``replicas`` of the second ``[[models]]``. The scan reads table headers
(``[a.b]``, ``[[a.b]]``, counting the elements of each array of tables) and
``key = value`` lines, and steps over the inside of multi-line strings (the
lines of a multi-line array hold no ``key =``). It only points an error at a
line, so it stays simple: a key it cannot place (inside an inline table, say)
gets its table's line (``line_of``).
"""

from __future__ import annotations

import re

Path_ = tuple[str | int, ...]

HEADER = re.compile(r"\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
KEY = re.compile(r"\s*([A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*')(\s*\.\s*([A-Za-z0-9_\-]+|\"[^\"]*\"|'[^']*'))*\s*=")


def key_lines(text: str) -> dict[Path_, int]:
    """key path -> the (1-based) line that introduces it."""
    lines: dict[Path_, int] = {}
    arrays: dict[Path_, int] = {}  # array-of-tables path -> its elements so far
    table: Path_ = ()
    closing = None  # inside a multi-line string: its closing quotes
    for n, line in enumerate(text.splitlines(), 1):
        if closing is not None:
            closing = None if closing in line else closing
        elif header := HEADER.match(line):
            table = _table(header.group(1) == "[[", _keys(header.group(2)), arrays)
            lines.setdefault(table, n)
        elif key := KEY.match(line):
            keys = _keys(line[: key.end() - 1])
            for i in range(1, len(keys) + 1):
                lines.setdefault(table + keys[:i], n)
            opened = [q for q in ('"""', "'''") if line[key.end() :].count(q) == 1]
            closing = opened[0] if opened else None
    return lines


def line_of(lines: dict[Path_, int], path: Path_) -> int | None:
    """The line of ``path``, else of its nearest enclosing table that has one."""
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return None


def _keys(text: str) -> tuple[str, ...]:
    return tuple(part.strip().strip("\"'") for part in text.split("."))


def _table(is_array: bool, keys: tuple[str, ...], arrays: dict[Path_, int]) -> Path_:
    """The key path a header opens: ``[[models.remote]]`` is the next remote of the last ``[[models]]``."""
    path: Path_ = ()
    for i, key in enumerate(keys):
        path += (key,)
        if is_array and i == len(keys) - 1:
            arrays[path] = arrays.get(path, 0) + 1
            path += (arrays[path] - 1,)
        elif path in arrays:
            path += (arrays[path] - 1,)
    return path
