"""Which files hold a folder's weights (safetensors; pickles only when allowed) and how load errors name them.

The files are read through one lazy handle, ``workers.load.checkpoint.Checkpoint``.
"""
from __future__ import annotations

import json
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint poolgate cannot load; the message names the file (or folder) and the problem."""

    def __init__(self, source: str | Path, problem: str):
        super().__init__(f"{source}: {problem}")
        self.source, self.problem = str(source), problem


def _safetensors_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [folder / s for s in shards]
    single = folder / "model.safetensors"
    return [single] if single.is_file() else sorted(folder.glob("*.safetensors"))


def weights_source(folder: Path) -> str:
    """How load errors name a checkpoint: its one weights file, or its shard index, or the folder."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return str(index)
    files = _safetensors_files(folder) or sorted(folder.glob("pytorch_model*.bin"))
    return str(files[0]) if len(files) == 1 else str(folder)


def weight_files(folder: Path, *, allow_pickle: bool = False) -> tuple[list[Path], bool]:
    """The files ``folder``'s weights load from and whether they are pickles; the errors name what is wrong."""
    folder = Path(folder)
    files = _safetensors_files(folder)
    if files:
        return files, False
    pickles = sorted(folder.glob("pytorch_model*.bin"))
    if not pickles:
        raise FileNotFoundError(f"no safetensors or pytorch_model*.bin weights in {folder}")
    if not allow_pickle:
        raise PermissionError(
            f"{pickles[0]}: pickle weights (which can run code when loaded) and no safetensors in {folder}; "
            "convert them to safetensors, or pass --allow-pickle-weights to load them")
    return pickles, True
