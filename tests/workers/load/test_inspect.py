"""``poolgate inspect`` and the start-up table: the builder's decisions for a folder, without loading it."""
import json
import logging

import pytest
from transformers import AutoModel, AutoModelForSequenceClassification

from poolgate.gateway.cli import main as poolgate
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.load.build import load_model
from poolgate.workers.load.inspect import FALLBACK_ATTENTION, plan
from tests.workers.rope_encoders import save


def _plan(folder, **cfg):
    return plan(WorkerConfig(model=str(folder), served_model_name="m", **cfg), CpuBackend())


def test_packed_family(tmp_path):
    save(tmp_path, "modernbert", AutoModel)
    p = _plan(tmp_path, dtype="float32", max_batch_tokens=1024)
    assert p.architecture == "ModernBertModel" and p.implementation == "packed modernbert"
    assert p.weights == str(tmp_path / "model.safetensors")
    assert p.tasks == "embed, token_embed (served as embed)"
    assert p.pooling == "CLS (architecture default), normalized; token tasks ALL"
    assert p.max_length == "128 tokens" and p.dtype == "float32" and p.backend == "cpu"
    from poolgate.workers.kernels import cpu_attention_f32

    fp32 = "packed_cpu_attention" if cpu_attention_f32.unavailable() is None else "grouped_sdpa"  # AVX2: the kernel
    assert p.attention.startswith(f"{fp32}: ") and p.attention.endswith(
        "; bidirectional; sliding windows (left, right) (4, 4)")
    assert p.token_budget == "1024 tokens per batch" and p.cuda_graphs == "off (--cuda-graphs)"
    asked = _plan(tmp_path, dtype="float32", cuda_graphs=True)
    assert asked.cuda_graphs == "off: graphs are for packed models on the cuda backend, not cpu"
    assert asked.token_budget == "8192 tokens per batch" and "cuda graphs" in asked.table()
    from poolgate.workers.backends.cuda import CudaBackend
    from poolgate.workers.load.inspect import _budget

    gpu = WorkerConfig(model=str(tmp_path), served_model_name="m", backend="cuda")
    assert _budget(gpu, CudaBackend()).startswith("from the device's memory")  # chosen at load (backends.budget)
    assert _budget(WorkerConfig(model=str(tmp_path), served_model_name="m", max_batch_tokens=4096), CudaBackend()) == "4096 tokens per batch"


def test_classifier_pooling_and_tasks(tmp_path):
    save(tmp_path, "modernbert", AutoModelForSequenceClassification, num_labels=2, classifier_pooling="mean")
    p = _plan(tmp_path)
    assert p.tasks == "classify, token_classify (served as classify)"
    assert p.pooling == "MEAN (architecture default); token tasks ALL"


def test_sentence_transformers_folder_and_flags():
    p = _plan(bundled_model_path())
    assert p.implementation == "packed bert" and p.pooling.startswith("MEAN (sentence-transformers config)")
    assert p.max_length == "256 tokens"
    from poolgate.shared.config.pooler_config import PoolerConfig

    p = _plan(bundled_model_path(), pooler_config=PoolerConfig(seq_pooling_type="CLS"), max_model_len=128)
    assert p.pooling.startswith("CLS (--pooler-config)") and p.max_length == "128 tokens"


def test_auto_dtype_names_the_candidate(tmp_path, monkeypatch):
    import torch

    save(tmp_path, "gte", AutoModel)
    monkeypatch.setattr(CpuBackend, "fast_dtype", lambda self: torch.bfloat16)
    assert _plan(tmp_path).dtype.startswith("auto: bfloat16 if the start-up probes stay at cosine >= 0.999")
    monkeypatch.setattr(CpuBackend, "fast_dtype", lambda self: torch.float32)
    assert _plan(tmp_path).dtype == "float32 (auto: no faster dtype on this hardware)"


def test_every_packed_attention_has_its_description():
    from poolgate.workers.kernels.attention import grouped_sdpa, varlen_flash
    from poolgate.workers.kernels.cpu_attention import packed_cpu_attention
    from poolgate.workers.load.inspect import ATTENTION_PATHS

    assert sorted(ATTENTION_PATHS) == sorted(f.__name__ for f in (grouped_sdpa, varlen_flash, packed_cpu_attention))


def test_fallback_architecture(tmp_path):
    """An architecture without a packed family (ELECTRA): transformers' AutoModel, padded; no weights read."""
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["ElectraModel"], "model_type": "electra", "vocab_size": 100, "hidden_size": 32,
        "embedding_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 64,
        "max_position_embeddings": 64}))
    p = _plan(tmp_path, dtype="float32")
    assert p.implementation == "transformers fallback (padded)" and p.attention == FALLBACK_ATTENTION
    assert p.pooling.startswith("CLS (architecture default)")


def test_cli_prints_the_table(tmp_path, capsys):
    save(tmp_path, "nomic_bert", AutoModel)
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu"]) == 0
    rows = {line[:14].strip(): line[16:] for line in capsys.readouterr().out.splitlines()}  # key column: 14 wide
    assert rows["implementation"] == "packed nomic_bert" and rows["dtype"] == "float32"
    assert rows["architecture"] == "NomicBertModel" and rows["max length"] == "128 tokens"


def test_cli_error_is_exit_2(tmp_path, capsys):
    assert poolgate(["inspect", str(tmp_path / "missing")]) == 2
    assert "poolgate inspect: error:" in capsys.readouterr().err
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["ModernBertModel"], "model_type": "modernbert", "vocab_size": 10, "hidden_size": 8,
        "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 8, "max_position_embeddings": 4096}))
    assert poolgate(["inspect", str(tmp_path), "--max-model-len", "100000"]) == 2
    assert "exceeds" in capsys.readouterr().err


def test_start_up_log_has_the_same_table(tmp_path, caplog):
    save(tmp_path, "modernbert", AutoModel)
    cfg = WorkerConfig(model=str(tmp_path), served_model_name="m", dtype="float32", backend="cpu",
                       max_batch_tokens=256)
    with caplog.at_level(logging.INFO, logger="poolgate.worker"):
        model = load_model(cfg)
    logged = [r.getMessage() for r in caplog.records if r.name == "poolgate.worker"]
    want = plan(cfg).table().splitlines()
    assert want[1].startswith("architecture") and want[1] in logged and want[2] in logged  # architecture, family
    assert "tasks           embed, token_embed" in logged
    assert any(line.startswith("dtype") and line.endswith("float32") for line in logged)
    assert model.info.tasks == ("embed", "token_embed")


@pytest.mark.parametrize("family", ["gte", "modernbert"])
def test_inspect_loads_no_weights(tmp_path, family, monkeypatch):
    save(tmp_path, family, AutoModel)
    from poolgate.workers.load.safetensors_file import SafetensorsFile

    monkeypatch.setattr(SafetensorsFile, "__init__", lambda *a, **k: pytest.fail("inspect opened the weights"))
    assert _plan(tmp_path).implementation == f"packed {family}"


def test_media_family_names_its_path(tmp_path):
    """A media model's plan names its family, transformers' class, what it reads and how it pools: no load."""
    from tests.workers.media.dual_encoders import make_dual

    make_dual(tmp_path, "clip")
    table = plan(WorkerConfig(model=str(tmp_path), served_model_name="m")).table()
    assert "media family clip: transformers CLIPModel (padded), text and image towers by input" in table
    assert "inputs: text, image" in table and "embed: the family's vector in each sequence's LAST row" in table
    assert FALLBACK_ATTENTION in table
