"""The ops bundle's linears: Linear and PackedLinear (oneDNN, fused activation) against F.linear + the activation."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.kernels.activations import ACTIVATIONS
from poolgate.workers.kernels.linear import Linear, PackedLinear, packed_linear_available, prepack_linears
from poolgate.workers.kernels.ops import REFERENCE
from poolgate.workers.models import build_model
from poolgate.workers.batch.packing import pack
from poolgate.workers.load.st_config import read_spec

onednn = pytest.mark.skipif(not packed_linear_available(),
                            reason="no oneDNN bf16 linears here: torch built without oneDNN, or a CPU without its bf16 path")


@pytest.mark.parametrize("activation", ["none", "gelu", "silu"])
def test_reference_linear_applies_its_named_activation(activation):
    torch.manual_seed(0)
    linear, x = Linear(16, 8, activation=activation), torch.randn(5, 16)
    act = (lambda t: t) if activation == "none" else ACTIVATIONS[activation]
    torch.testing.assert_close(linear(x), act(F.linear(x, linear.weight, linear.bias)))
    assert isinstance(linear, nn.Linear) and set(linear.state_dict()) == {"weight", "bias"}  # checkpoint names


@onednn
def test_prepack_swaps_every_linear_with_its_activation():
    torch.manual_seed(0)
    model = nn.Sequential(Linear(16, 32, activation="gelu"), nn.Sequential(Linear(32, 8, activation="silu"))).to(
        torch.bfloat16)
    x = torch.randn(7, 16, dtype=torch.bfloat16)
    want = model(x).float()
    prepack_linears(model)
    assert isinstance(model[0], PackedLinear) and isinstance(model[1][0], PackedLinear)
    torch.testing.assert_close(model(x).float(), want, atol=3e-2, rtol=3e-2)


@onednn
@pytest.mark.parametrize("activation", ["none", "gelu", "gelu_new", "relu", "silu"])
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


@onednn
def test_packed_bert_matches_unpacked(tiny_bert):
    folder, _ = tiny_bert
    spec = read_spec(WorkerConfig(model=str(folder), served_model_name="t"))
    seqs = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 60)) + [3]]
    batch = pack(seqs)
    model, _ = build_model(spec, REFERENCE, allow_pickle=False)
    model = model.to(torch.bfloat16)
    with torch.no_grad():
        plain = model(batch).float()
        prepack_linears(model)
        packed = model(batch).float()
    cos = F.cosine_similarity(plain, packed, dim=-1)
    assert cos.min() >= 0.999
