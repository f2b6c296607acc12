"""One lazy handle on a model's weights, opened once per load: names and shapes up front, tensors on demand.

``Checkpoint.open(folder)`` opens every safetensors shard (``SafetensorsFile``:
the header at open, each tensor read when asked for), or, only with
``--allow-pickle-weights``, ``pytorch_model*.bin`` files with ``torch.load``
(``weights_only``, memory-mapped where the file's format allows). ``close``
lets the files go once the model and its poolers are built. The model
(``workers.models.build_model``) and the poolers (score layers, SPLADE's MLM
head) read their tensors from the same handle, so each tensor is read once
and a classifier's body is never read for its head. ``InMemory`` gives a dict
(GGUF's dequantized tensors, tests) the same face; ``strip_prefix`` is the
one base-model-prefix view (``bert.``, ``model.`` …) and ``find_name`` the one
reading of old TF-style LayerNorm names (``gamma``/``beta``) every reader uses.
"""
from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path

import torch

from poolgate.workers.load.safetensors_file import SafetensorsFile
from poolgate.workers.load.weights import CheckpointError, weight_files, weights_source

log = logging.getLogger("poolgate.worker")
LEGACY_NAMES = {".weight": ".gamma", ".bias": ".beta"}  # old TF-style LayerNorm names


class Tensors(Mapping[str, torch.Tensor]):
    """Named tensors read when indexed; ``shape`` without reading; ``source`` for error messages."""

    source: str

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self[name].shape)

    def close(self) -> None:
        """Let go of open files (nothing to do for tensors in memory)."""

    def was_read(self, name: str) -> bool:
        """Whether a reader (a head, the model) asked for ``name`` already (only an open checkpoint keeps count)."""
        return False


class InMemory(Tensors):
    """Tensors already in memory (a GGUF file's dequantized state, a test's state dict)."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], source: str):
        self._tensors, self.source = dict(tensors), str(source)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)


class Deferred(Tensors):
    """Tensors made on first use: a GGUF file is dequantized only if a packed model asks for its tensors."""

    def __init__(self, make, source: str):
        self._make, self._tensors, self.source = make, None, str(source)

    def _all(self) -> dict[str, torch.Tensor]:
        if self._tensors is None:
            self._tensors = dict(self._make())
        return self._tensors

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def close(self) -> None:
        self._tensors = None


class Indexed(Tensors):
    """Tensors whose names are a dict kept by the handle (``name →`` where to read it)."""

    _names: dict

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


class Checkpoint(Indexed):
    """A folder's weight files, open: each name maps to the file that holds it (the first, for repeats)."""

    def __init__(self, folder: Path, files: dict[Path, object], names: dict[str, Path]):
        self.folder, self._files, self._names = folder, files, names
        self.source = weights_source(folder)
        self._read: set[str] = set()

    @classmethod
    def open(cls, folder: str | Path, *, allow_pickle: bool = False) -> "Checkpoint":
        folder = Path(folder)
        paths, pickled = weight_files(folder, allow_pickle=allow_pickle)
        files, names = {}, {}
        for i, path in enumerate(paths, 1):
            log.info("opening %sweights %s [%d/%d]", "pickle " if pickled else "", path.name, i, len(paths))
            files[path] = _open(path, pickled)
            for name in files[path].keys():
                names.setdefault(name, path)
        return cls(folder, files, names)

    def __getitem__(self, name: str) -> torch.Tensor:
        path = self._names[name]
        self._read.add(name)
        try:
            return self._files[path].get_tensor(name)
        except Exception as exc:  # a file cut short after its header, a bad offset: name the file and tensor
            raise CheckpointError(path, f"cannot read tensor {name} ({type(exc).__name__}: {exc})") from exc

    def shape(self, name: str) -> tuple[int, ...]:
        return self._files[self._names[name]].shape(name)

    def was_read(self, name: str) -> bool:
        return name in self._read

    def close(self) -> None:
        """Let the files go (the tensors already read stay valid)."""
        for handle in self._files.values():
            handle.close()


class _Pickled(dict):
    """A pickle's tensors (``torch.load``, memory-mapped where it can be) with a weights file's methods."""

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self[name].shape)

    def get_tensor(self, name: str) -> torch.Tensor:
        return self[name]

    def close(self) -> None:
        self.clear()


def _open(path: Path, pickled: bool) -> SafetensorsFile | _Pickled:
    """One weights file, open (``keys``, ``shape``, ``get_tensor``, ``close``); errors name the file."""
    try:
        if not pickled:
            return SafetensorsFile(path)
        try:
            return _Pickled(torch.load(path, map_location="cpu", weights_only=True, mmap=True))
        except RuntimeError:  # the legacy (pre-zip) format cannot be memory-mapped
            return _Pickled(torch.load(path, map_location="cpu", weights_only=True))
    except Exception as exc:  # a missing shard, a truncated or corrupt file: name it
        raise CheckpointError(path, f"cannot read the weights ({type(exc).__name__}: {exc})") from exc


class Renamed(Indexed):
    """A view of ``base`` under other names (``ours → theirs``); nothing is read until indexed."""

    def __init__(self, base: Tensors, names: dict[str, str]):
        self.base, self._names, self.source = base, names, base.source

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.base[self._names[name]]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.base.shape(self._names[name])

    def was_read(self, name: str) -> bool:
        return name in self._names and self.base.was_read(self._names[name])


def strip_prefix(tensors: Tensors, prefixes: tuple[str, ...]) -> Tensors:
    """The first base-model prefix (``bert.``, ``roberta.`` …) any name has, dropped from every name that has it."""
    for prefix in prefixes:
        if any(k.startswith(prefix) for k in tensors):
            return Renamed(tensors, {k.removeprefix(prefix): k for k in tensors})
    return tensors


def find_name(tensors: Mapping[str, torch.Tensor], name: str) -> str | None:
    """``name`` if the checkpoint has it, else its old TF-style LayerNorm name (gamma/beta) if that is there."""
    if name in tensors:
        return name
    for new, old in LEGACY_NAMES.items():
        if "LayerNorm" in name and name.endswith(new) and (alt := name[: -len(new)] + old) in tensors:
            return alt
    return None


def few(items: list[str], n: int = 8) -> str:
    """The first ``n`` of ``items``, and how many more (error messages that name tensors)."""
    shown = ", ".join(items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def read_file(path: Path, *, allow_pickle: bool) -> dict[str, torch.Tensor]:
    """All tensors of one small weights file (a head saved beside the model): safetensors, or a pickle if allowed."""
    path = Path(path)
    if path.suffix != ".safetensors" and not allow_pickle:
        raise PermissionError(f"{path} is a pickle (which can run code when loaded): pass --allow-pickle-weights "
                              "to load it, or convert it to safetensors")
    handle = _open(path, pickled=path.suffix != ".safetensors")
    try:
        return {name: handle.get_tensor(name) for name in handle.keys()}
    finally:
        handle.close()
