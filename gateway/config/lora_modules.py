"""``--lora-modules`` items, read as vLLM reads them: ``NAME=PATH``, or JSON ``{"name", "path", "base_model_name"?}``
(or a JSON list of such objects); anything else, a path that is not a folder or a name given twice is refused."""

from __future__ import annotations

import json
from pathlib import Path

from poolgate.shared.config.frozen import LoraModule

KEYS = {"name", "path", "base_model_name"}


def lora_modules(items: list[str]) -> tuple[LoraModule, ...]:
    """The adapters of ``items``; ValueError naming the item that is wrong."""
    out: list[LoraModule] = []
    for item in items:
        if "=" in item and "," not in item and not item.lstrip().startswith(("{", "[")):
            name, _, path = item.partition("=")
            out.append(_module({"name": name, "path": path}, item))
            continue
        try:
            parsed = json.loads(item)
        except ValueError as exc:
            raise ValueError(f"lora_modules item {item!r}: neither NAME=PATH nor JSON ({exc})") from None
        for entry in parsed if isinstance(parsed, list) else [parsed]:
            out.append(_module(entry, item))
    names = [m.name for m in out]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"lora_modules: adapter names given twice: {twice}")
    return tuple(out)


def _module(entry: object, item: str) -> LoraModule:
    if not isinstance(entry, dict) or not entry.get("name") or not entry.get("path"):
        raise ValueError(f"lora_modules item {item!r}: a name and a path are required")
    unknown = sorted(set(entry) - KEYS)
    if unknown:
        raise ValueError(f"lora_modules item {item!r}: unknown keys {unknown} (poolgate reads {sorted(KEYS)})")
    path = Path(str(entry["path"])).expanduser().resolve()
    if not path.is_dir():
        raise ValueError(f"lora_modules item {item!r}: {path} is not a folder")
    base = entry.get("base_model_name")
    return LoraModule(str(entry["name"]), str(path), None if base is None else str(base))
