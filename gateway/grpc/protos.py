"""The gRPC server's protos: ``tei.proto`` and ``inference.proto`` (beside this file) compiled when it starts.

grpcio-tools' ``protoc`` compiles each file to a descriptor set, which goes into
a descriptor pool of the server's own (not protobuf's default pool, so a
client generated from the same files in the same process, as the tests do,
clashes with nothing); message classes come from that pool. The servicers use
no generated service code: ``gateway.grpc.server`` registers each method with
grpcio's generic handlers and these classes' (de)serializers. The health and
reflection services' files are added to the pool too, so server reflection
answers for every service from the one pool.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FileDescriptor, ServiceDescriptor

PROTOS = ("tei.proto", "inference.proto")


class ProtoError(RuntimeError):
    """A proto beside this module did not compile (a broken install)."""


@dataclass(frozen=True)
class Protos:
    """The pool and its files by name."""

    pool: descriptor_pool.DescriptorPool
    files: dict[str, FileDescriptor]

    def message(self, full_name: str) -> Any:
        """The message class of ``full_name`` (e.g. ``tei.v1.EmbedRequest``)."""
        return message_factory.GetMessageClass(self.pool.FindMessageTypeByName(full_name))

    def service(self, full_name: str) -> ServiceDescriptor:
        return self.pool.FindServiceByName(full_name)

    def services(self) -> list[str]:
        """Every service the protos define, by full name."""
        return [s.full_name for f in self.files.values() for s in f.services_by_name.values()]


def _compile(name: str, folder: Path) -> descriptor_pb2.FileDescriptorSet:
    from grpc_tools import protoc  # grpcio-tools: only the gRPC server needs it

    include = resources.files("grpc_tools") / "_proto"  # protoc's well-known types
    with tempfile.TemporaryDirectory(prefix="poolgate-proto-") as tmp:
        out = Path(tmp) / "set.pb"
        code = protoc.main(
            ["protoc", f"-I{folder}", f"-I{include}", f"--descriptor_set_out={out}", "--include_imports", name]
        )
        if code != 0 or not out.exists():
            raise ProtoError(f"protoc could not compile {folder / name} (exit {code})")
        return descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())


def _add_module(pool: descriptor_pool.DescriptorPool, file: FileDescriptor) -> None:
    """A compiled module's file (and its dependencies) into ``pool``, once."""
    for dep in file.dependencies:
        _add_module(pool, dep)
    try:
        pool.FindFileByName(file.name)
    except KeyError:
        pool.Add(descriptor_pb2.FileDescriptorProto.FromString(file.serialized_pb))


@cache
def load() -> Protos:
    """The compiled protos (once per process)."""
    from grpc_health.v1 import health_pb2
    from grpc_reflection.v1alpha import reflection_pb2

    pool = descriptor_pool.DescriptorPool()
    folder = Path(__file__).resolve().parent
    for name in PROTOS:
        for file in _compile(name, folder).file:
            try:
                pool.FindFileByName(file.name)
            except KeyError:
                pool.Add(file)
    for module in (health_pb2, reflection_pb2):
        _add_module(pool, module.DESCRIPTOR)
    return Protos(pool, {name: pool.FindFileByName(name) for name in PROTOS})
