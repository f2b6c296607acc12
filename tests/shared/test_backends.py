"""shared.config.backends: replicas and devices expanded into placements, per-backend env, disjoint CPU core sets."""
from __future__ import annotations

import pytest

from poolgate.shared.config.backends import (Placement, parse_cpu_list, physical_cores, place, placed, split_cores,
                                      worker_env)
from poolgate.shared.config.frozen import WorkerConfig

SMT = {0: {0, 4}, 1: {1, 5}, 2: {2, 6}, 3: {3, 7}, 4: {0, 4}, 5: {1, 5}, 6: {2, 6}, 7: {3, 7}}  # 4 cores x 2 threads


def cfg(**kw) -> WorkerConfig:
    return WorkerConfig(model="/m", served_model_name="m", **kw)


def test_parse_cpu_list():
    assert parse_cpu_list("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert parse_cpu_list("") == set()


def test_physical_cores_keep_smt_siblings_together():
    assert physical_cores(range(8), SMT.__getitem__) == [(0, 4), (1, 5), (2, 6), (3, 7)]
    assert physical_cores([0, 1, 4], SMT.__getitem__) == [(0, 4), (1,)]  # only the CPUs we may use
    assert physical_cores([2, 3], lambda c: {c}) == [(2,), (3,)]


def test_split_cores_is_disjoint_and_even():
    cores = [(i,) for i in range(7)]
    shares = split_cores(cores, 3)
    assert [len(s) for s in shares] == [3, 2, 2]
    flat = [c for s in shares for c in s]
    assert sorted(flat) == cores and len(set(flat)) == len(flat)
    with pytest.raises(ValueError, match="at least 8 physical cores"):
        split_cores(cores, 8)


@pytest.mark.parametrize("backend, var", [("cuda", "CUDA_VISIBLE_DEVICES"), ("rocm", "HIP_VISIBLE_DEVICES"),
                                          ("xpu", "ZE_AFFINITY_MASK")])
def test_gpu_backends_get_one_worker_per_device(backend, var):
    assert place(backend, 2, ["3", "5"]) == [Placement(device="3"), Placement(device="5")]
    assert place(backend, 2) == [Placement(device="0"), Placement(device="1")]  # the default devices
    workers = [placed(cfg(backend=backend), p) for p in place(backend, 2, ["3", "5"])]
    assert [worker_env(w) for w in workers] == [{var: "3"}, {var: "5"}]
    with pytest.raises(ValueError, match="one .* worker per device"):
        place(backend, 3, ["0", "1"])
    with pytest.raises(ValueError, match="twice"):
        place(backend, 2, ["1", "1"])


def test_cpu_workers_are_pinned_to_disjoint_cores_with_one_thread_per_core():
    places = place("cpu", 2, cpus=range(8), siblings=SMT.__getitem__)
    assert places == [Placement(cpus=(0, 4, 1, 5), num_threads=2), Placement(cpus=(2, 6, 3, 7), num_threads=2)]
    worker = placed(cfg(backend="cpu"), places[1])
    assert (worker.cpu_affinity, worker.num_threads, worker.device) == ((2, 6, 3, 7), 2, None)
    assert worker_env(worker) == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    assert placed(cfg(backend="cpu", num_threads=1), places[0]).num_threads == 1  # an explicit count is kept
    with pytest.raises(ValueError, match="at least 5 physical cores"):
        place("cpu", 5, cpus=range(8), siblings=SMT.__getitem__)


def test_one_cpu_worker_and_auto_are_not_pinned():
    assert place("cpu", 1) == [Placement()]
    assert place("auto", 3) == [Placement()] * 3
    assert worker_env(placed(cfg(), Placement())) == {}


def test_devices_need_a_gpu_backend():
    with pytest.raises(ValueError, match="takes no devices"):
        place("cpu", 1, ["0"])
    with pytest.raises(ValueError, match="takes no devices"):
        place("auto", 1, ["0"])
    with pytest.raises(ValueError, match="unknown backend"):
        place("tpu", 1)
    with pytest.raises(ValueError, match="at least 1"):
        place("cpu", 0)


def test_placement_travels_to_the_worker():
    worker = placed(cfg(backend="cuda"), Placement(device="GPU-1234"))
    back = WorkerConfig.from_wire(worker.to_wire())
    assert back == worker and back.device == "GPU-1234"
    pinned = placed(cfg(backend="cpu"), Placement(cpus=(0, 1), num_threads=1))
    assert WorkerConfig.from_wire(pinned.to_wire()).cpu_affinity == (0, 1)


@pytest.mark.parametrize("backend, var", [("cuda", "CUDA_VISIBLE_DEVICES"), ("xpu", "ZE_AFFINITY_MASK")])
def test_replicas_per_device_put_several_workers_on_each_device(backend, var):
    assert place(backend, 2, per_device=2) == [Placement(device="0")] * 2
    assert place(backend, 4, ["3", "5"], per_device=2) == [Placement(device=d) for d in ("3", "3", "5", "5")]
    workers = [placed(cfg(backend=backend), p) for p in place(backend, 2, ["1"], per_device=2)]
    assert [worker_env(w) for w in workers] == [{var: "1"}, {var: "1"}]
    with pytest.raises(ValueError, match="do not split into 2 per device"):
        place(backend, 3, per_device=2)
    with pytest.raises(ValueError, match="2 cuda worker per device|2 xpu worker per device"):
        place(backend, 2, ["0", "1"], per_device=2)
    with pytest.raises(ValueError, match="not backend 'cpu'"):
        place("cpu", 2, per_device=2)
