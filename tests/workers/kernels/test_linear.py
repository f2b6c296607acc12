"""PackedLinear (oneDNN, fused activation) against F.linear + the torch activation."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.config import WorkerConfig
from poolgate.workers.kernels.attention import grouped_sdpa
from poolgate.workers.kernels.linear import PackedLinear, packed_linear_available
from poolgate.workers.models import build_model
from poolgate.workers.models.bert import ACTIVATIONS
from poolgate.workers.engine.packing import pack
from poolgate.workers.load.st_config import read_spec

pytestmark = pytest.mark.skipif(not packed_linear_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_new", "relu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_packed_linear_matches_reference(activation, dtype):
    torch.manual_seed(0)
    linear = nn.Linear(64, 96).to(dtype)
    x = torch.randn(37, 64, dtype=dtype)
    act = (lambda t: t) if activation == "none" else ACTIVATIONS[activation]
    want = act(F.linear(x.float(), linear.weight.float(), linear.bias.float()))
    got = PackedLinear(linear, activation)(x).float()
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def test_packed_bert_matches_unpacked(tiny_bert):
    folder, _ = tiny_bert
    spec = read_spec(WorkerConfig(model_path=str(folder), served_model_name="t"))
    seqs = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3]]
    batch = pack(seqs)
    model, _ = build_model(spec, grouped_sdpa, allow_pickle=False)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        plain = model(batch).float()
        model.use_packed_linears()
        packed = model(batch).float()
    cos = F.cosine_similarity(plain, packed, dim=-1)
    assert cos.min() >= 0.999
