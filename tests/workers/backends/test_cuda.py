"""The packed runner on an NVIDIA GPU: varlen flash attention in fp16 against transformers in fp32."""
import queue
import threading

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.backends import get_backend
from poolgate.workers.load.build import load_model
from poolgate.workers.kernels.attention import grouped_sdpa, has_varlen, varlen_flash
from poolgate.workers.engine.sequence import Sequence
from tests.fakes import make_tiny_checkpoint
from tests.workers.pooled import pool_ids, pool_texts

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3]]


def test_auto_backend_picks_cuda_and_its_attention():
    backend = get_backend("auto")
    assert backend.name in ("cuda", "rocm")
    assert backend.attention(torch.float16) is (varlen_flash if has_varlen() else grouped_sdpa)
    assert backend.attention(torch.float32) is grouped_sdpa


def _mean_pooled_reference(ref, seqs) -> np.ndarray:
    with torch.no_grad():
        rows = [ref(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0) for s in seqs]
    return torch.nn.functional.normalize(torch.stack(rows), dim=1).numpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_runner_matches_transformers_cpu(tmp_path, dtype):
    ref = make_tiny_checkpoint(tmp_path)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", backend="cuda",
                                    dtype=dtype, pooler_config=PoolerConfig(seq_pooling_type="MEAN"), max_batch_tokens=512))
    assert model.info.dtype == dtype
    got = pool_ids(model, SEQS)
    assert (got * _mean_pooled_reference(ref, SEQS)).sum(1).min() >= 0.999


def test_prepare_in_one_thread_execute_in_another(tmp_path):
    """The engine's pipeline: batch N+1 uploads on the copy stream (prepare thread) while the
    compute stream runs batch N (this thread); every output must match the reference."""
    ref = make_tiny_checkpoint(tmp_path)
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="t", backend="cuda",
                                    dtype="float16", pooler_config=PoolerConfig(seq_pooling_type="MEAN"), max_batch_tokens=512))
    batches = [[Sequence(s, PoolingParams()) for s in SEQS[i % 4:] + SEQS[:i % 4]] for i in range(64)]
    ready: queue.Queue = queue.Queue(maxsize=2)  # the producer runs at most two batches ahead

    def produce():
        for b in batches:
            ready.put(model.runner.prepare(b))

    producer = threading.Thread(target=produce)
    producer.start()
    want = _mean_pooled_reference(ref, SEQS)
    for i in range(len(batches)):
        outputs = model.runner.execute(ready.get(timeout=30))
        got = np.concatenate([o.rows.values for o in outputs])
        order = [(j + i % 4) % 4 for j in range(4)]
        assert (got * want[order]).sum(1).min() >= 0.999
    producer.join()


def test_cuda_bundled_model_auto_dtype_parity():
    from sentence_transformers import SentenceTransformer

    from poolgate.shared.config.models import bundled_model_path

    path = str(bundled_model_path())
    model = load_model(WorkerConfig(model=path, served_model_name="m", backend="cuda", max_batch_tokens=2048))
    texts = ["a", "Hello world", "The quick brown fox jumps over the lazy dog. " * 10]
    got, _ = pool_texts(model, texts)
    want = SentenceTransformer(path, device="cpu").encode(texts)
    assert (got * want).sum(1).min() >= 0.999
    assert model.info.dtype == "float16"
