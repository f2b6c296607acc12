"""Where each local worker of a pool runs: its device, its environment and its CPU cores (torch-free).

The gateway side of the backends registry (the worker side, with torch, is
``workers.backends``). ``place`` expands a pool's ``replicas`` / ``devices``
into one ``Placement`` per worker; ``placed`` writes a placement into the
worker's config; ``worker_env`` is what the spawner adds to that process's
environment. ``DEVICE_ENV`` maps each backend to the variable that makes one
device visible:

- cuda: one worker per GPU, ``CUDA_VISIBLE_DEVICES=<device>`` (the worker sees it as device 0);
- rocm: ``HIP_VISIBLE_DEVICES=<device>``;
- xpu: ``ZE_AFFINITY_MASK=<device>`` (Level Zero);
- cpu: no device; with several workers the cores the gateway may use are split
  into disjoint sets (whole physical cores, SMT siblings kept together), each
  worker pinned to one (``os.sched_setaffinity``, in ``workers.backends.cpu``)
  with one torch thread per physical core of its set. One CPU worker is not pinned.

``auto`` cannot be expanded here (the gateway has no torch to detect the
hardware): it takes no devices and pins nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from poolgate.shared.config.frozen import WorkerConfig

DEVICE_ENV: dict[str, str | None] = {
    "cuda": "CUDA_VISIBLE_DEVICES",
    "rocm": "HIP_VISIBLE_DEVICES",
    "xpu": "ZE_AFFINITY_MASK",
    "cpu": None,
    "auto": None,
}
CPU_TOPOLOGY = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Placement:
    """One local worker's share of the host."""

    device: str | None = None  # the GPU as the host numbers it ("0", or a UUID); None on the CPU
    cpus: tuple[int, ...] | None = None  # logical CPUs it is pinned to; None: not pinned
    num_threads: int | None = None  # torch threads (physical cores of ``cpus``); None: the backend's default


def available_cpus() -> list[int]:
    """The logical CPUs this process may use (read once, at the gateway's edge)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def physical_cores(cpus: Sequence[int], siblings: Callable[[int], set[int]] | None = None) -> list[tuple[int, ...]]:
    """``cpus`` grouped by physical core (SMT siblings together), in order of their first CPU."""
    siblings = siblings or _sysfs_siblings
    groups: dict[int, list[int]] = {}
    allowed = set(cpus)
    seen: set[int] = set()
    for cpu in sorted(allowed):
        if cpu in seen:
            continue
        group = sorted((siblings(cpu) | {cpu}) & allowed)
        seen.update(group)
        groups[group[0]] = group
    return [tuple(groups[k]) for k in sorted(groups)]


def _sysfs_siblings(cpu: int) -> set[int]:
    path = CPU_TOPOLOGY / f"cpu{cpu}" / "topology" / "thread_siblings_list"
    try:
        return parse_cpu_list(path.read_text())
    except OSError:
        return {cpu}


def parse_cpu_list(text: str) -> set[int]:
    """The kernel's CPU list format: ``0-3,8,10-11``."""
    cpus: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def split_cores(cores: list[tuple[int, ...]], workers: int) -> list[list[tuple[int, ...]]]:
    """``cores`` in ``workers`` contiguous, disjoint shares as even as they can be; ValueError if too few."""
    if workers > len(cores):
        raise ValueError(
            f"{workers} CPU workers need at least {workers} physical cores; this gateway may use {len(cores)}"
        )
    size, extra = divmod(len(cores), workers)
    shares, start = [], 0
    for i in range(workers):
        end = start + size + (1 if i < extra else 0)
        shares.append(cores[start:end])
        start = end
    return shares


def place(
    backend: str,
    replicas: int,
    devices: Sequence[str] = (),
    *,
    cpus: Sequence[int] | None = None,
    siblings: Callable[[int], set[int]] | None = None,
    per_device: int = 1,
) -> list[Placement]:
    """One Placement per local worker; ValueError for a combination that cannot be honoured.

    GPU backends: ``devices`` lists each device once (default ``0 .. replicas/per_device - 1``) and
    ``per_device`` workers go on each (``--replicas-per-device``: worker processes sharing one GPU,
    placed device by device), so ``replicas`` is ``len(devices) * per_device``.
    cpu: no devices; ``replicas`` > 1 splits ``cpus`` (default: ``available_cpus()``).
    """
    if backend not in DEVICE_ENV:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(DEVICE_ENV)}")
    if replicas < 1:
        raise ValueError(f"replicas must be at least 1, got {replicas}")
    if per_device < 1:
        raise ValueError(f"replicas per device must be at least 1, got {per_device}")
    if DEVICE_ENV[backend] is not None:
        if replicas % per_device:
            raise ValueError(f"{replicas} replicas do not split into {per_device} per device")
        devices = tuple(devices) or tuple(str(i) for i in range(replicas // per_device))
        if len(devices) * per_device != replicas:
            raise ValueError(
                f"{replicas} replicas but {len(devices)} devices: "
                f"{'one' if per_device == 1 else per_device} {backend} worker per device"
            )
        if len(set(devices)) != len(devices):
            raise ValueError(f"devices lists a device twice: {list(devices)}")
        return [Placement(device=d) for d in devices for _ in range(per_device)]
    if per_device != 1:
        raise ValueError(f"replicas per device is for cuda, rocm and xpu workers, not backend {backend!r}")
    if devices:
        raise ValueError(f"backend {backend!r} takes no devices (give backend = cuda, rocm or xpu)")
    if backend == "auto" or replicas == 1:
        return [Placement() for _ in range(replicas)]
    shares = split_cores(physical_cores(cpus if cpus is not None else available_cpus(), siblings), replicas)
    return [Placement(cpus=tuple(c for core in share for c in core), num_threads=len(share)) for share in shares]


def placed(cfg: WorkerConfig, placement: Placement) -> WorkerConfig:
    """``cfg`` for the worker at ``placement`` (an explicit ``num_threads`` in ``cfg`` is kept)."""
    return replace(
        cfg, device=placement.device, cpu_affinity=placement.cpus, num_threads=cfg.num_threads or placement.num_threads
    )


def worker_env(cfg: WorkerConfig) -> dict[str, str]:
    """What the spawner adds to the environment of the worker process for ``cfg``."""
    var = DEVICE_ENV.get(cfg.backend)
    env = {var: cfg.device} if var is not None and cfg.device is not None else {}
    if cfg.cpu_affinity is not None:
        threads = str(cfg.num_threads or len(cfg.cpu_affinity))
        env.update(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)  # before torch loads its thread pools
    return env
