"""Staging buffers on the CPU: reuse by size class, one-buffer uploads and read-backs that give back every tensor."""
import numpy as np
import torch

from poolgate.workers.backends.staging import ALIGN, Staging, layout, read_back, size_class, upload
from poolgate.workers.batch.packing import pack, tensors


def test_size_classes_and_layout():
    assert size_class(1) == 1 << 16 and size_class((1 << 16) + 1) == 1 << 17 and size_class(1 << 20) == 1 << 20
    offsets, total = layout([torch.zeros(3, dtype=torch.int64), torch.zeros(5, dtype=torch.bool),
                             torch.zeros(0, dtype=torch.int32), torch.zeros(2, 2)])
    assert offsets == [0, ALIGN, 2 * ALIGN, 2 * ALIGN] and total == 3 * ALIGN


def test_buffers_are_reused_only_once_their_copy_is_done():
    staging = Staging(pin=False)
    a = staging.take(1000)
    copying = [True]
    staging.give(a, lambda: not copying[0])
    b = staging.take(1000)
    assert b.data_ptr() != a.data_ptr() and staging.allocated == 2  # a's copy still runs
    copying[0] = False
    staging.give(b, lambda: True)
    c, d = staging.take(1000), staging.take(1000)
    assert {c.data_ptr(), d.data_ptr()} == {a.data_ptr(), b.data_ptr()} and staging.allocated == 2
    assert staging.take(1 << 20).numel() == 1 << 20 and staging.allocated == 3  # another class


def test_upload_is_one_buffer_and_gives_back_every_tensor():
    batch = pack([[5, 6, 7], [8, 9], list(range(20, 40))], token_types=[[0, 0, 1], None, None],
                 attend=[None, [True, False], None])
    staging = Staging(pin=False)
    moved = []
    on_device, buf = upload(batch, staging, lambda flat: moved.append(flat.clone()) or moved[-1])
    assert len(moved) == 1  # one copy for the whole batch
    before, after = tensors(batch), tensors(on_device)
    assert len(before) == len(after) > 8
    for a, b in zip(before, after):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
        assert b.untyped_storage().data_ptr() == moved[0].untyped_storage().data_ptr()  # views of the one copy
    assert on_device.lengths == batch.lengths and on_device.max_len == batch.max_len
    buf.zero_()  # the staging buffer is free to reuse: the moved batch does not read it
    assert torch.equal(on_device.input_ids, batch.input_ids)


def test_read_back_copies_out_of_the_buffer():
    staging = Staging(pin=False)
    outs = [torch.randn(3, 4), torch.arange(5, dtype=torch.int64), torch.zeros(0, 2)]
    got = read_back(outs, staging, lambda dst, src: dst.copy_(src), lambda: None)
    for g, o in zip(got, outs):
        np.testing.assert_array_equal(g, o.numpy())
    again = read_back([torch.ones(2)], staging, lambda dst, src: dst.copy_(src), lambda: None)
    assert staging.allocated == 1 and got[0].shape == (3, 4) and again[0].tolist() == [1.0, 1.0]
    np.testing.assert_array_equal(got[0], outs[0].numpy())  # the reused buffer did not change earlier results
    assert read_back([], staging, lambda dst, src: None, lambda: None) == []


def test_two_threads_never_hold_one_buffer_at_once():
    import threading

    staging = Staging(pin=False)
    held: set[int] = set()
    clashes = []
    guard = threading.Lock()

    def work():
        for _ in range(300):
            buf = staging.take(1000)
            with guard:
                if buf.data_ptr() in held:
                    clashes.append(buf.data_ptr())
                held.add(buf.data_ptr())
            with guard:
                held.discard(buf.data_ptr())
            staging.give(buf, lambda: True)

    threads = [threading.Thread(target=work) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clashes == [] and staging.allocated <= 3 + 3  # reused: a few buffers, not one per take
