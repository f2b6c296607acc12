"""The packed runner on an NVIDIA GPU: varlen flash attention in fp16 against transformers in fp32."""
import pytest
import torch

from poolgate.shared.config import WorkerConfig
from poolgate.shared.params import PoolingParams
from tests.conftest import make_tiny_checkpoint
from poolgate.workers.backends import get_backend
from poolgate.workers.build import build_runner
from poolgate.workers.kernels.attention import has_varlen
from poolgate.workers.sequence import Sequence

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_auto_backend_picks_cuda_with_varlen():
    backend = get_backend("auto")
    assert backend.name in ("cuda", "rocm")
    if has_varlen():
        assert backend.attention(torch.float16).__name__ == "varlen_flash"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_cuda_runner_matches_transformers_cpu(tmp_path, dtype):
    ref = make_tiny_checkpoint(tmp_path)
    runner = build_runner(WorkerConfig(model_path=str(tmp_path), served_model_name="t", backend="cuda",
                                       dtype=dtype, pooling_type="MEAN", max_batch_tokens=512))
    seqs = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3], [2, 3]]
    got = runner.run([Sequence(s, PoolingParams()) for s in seqs])
    with torch.no_grad():
        for s, g in zip(seqs, got):
            h = ref(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0)
            want = torch.nn.functional.normalize(h, dim=0)
            assert float(torch.dot(torch.from_numpy(g), want)) >= 0.999


def test_cuda_bundled_model_auto_dtype_parity():
    from sentence_transformers import SentenceTransformer

    from poolgate.shared.models import bundled_model_path

    path = str(bundled_model_path())
    runner = build_runner(WorkerConfig(model_path=path, served_model_name="m", backend="cuda", max_batch_tokens=2048))
    texts = ["a", "Hello world", "The quick brown fox jumps over the lazy dog. " * 10]
    got = runner.run([Sequence(i, PoolingParams()) for i in runner.encode_texts(texts)])
    want = SentenceTransformer(path, device="cpu").encode(texts)
    for g, w in zip(got, want):
        assert float((g * w).sum()) >= 0.999
    assert runner.info.dtype in ("float16", "bfloat16")
