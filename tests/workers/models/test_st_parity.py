"""The runner against sentence-transformers: the bundled real model and a Dense/CLS tiny model."""
import logging

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.load.build import load_model
from tests.workers.pooled import pool_texts

TEXTS = [
    "a", "Hi", "!", "The quick brown fox jumps over the lazy dog.",
    "Embeddings map text to vectors so that similar meanings land close together.",
    "Zürich, São Paulo and Kraków are cities; 東京 is Tokyo.", "x " * 120,
]


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def _run(model, texts, params=PoolingParams(), max_tokens=None):
    return pool_texts(model, texts, params, max_tokens)


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    path = str(bundled_model_path())
    runner = load_model(WorkerConfig(model=path, served_model_name="m", dtype="float32", max_batch_tokens=512))
    return runner, SentenceTransformer(path, device="cpu")


def test_bundled_model_fp32_parity(minilm):
    runner, st = minilm
    got, _ = _run(runner, TEXTS)
    want = st.encode(TEXTS, convert_to_numpy=True)
    assert runner.info.max_model_len == 256 and runner.info.embedding_dim == 384
    for g, w in zip(got, want):
        assert _cos(g, w) >= 0.9999
        assert abs(np.linalg.norm(g) - 1.0) < 1e-5


def test_truncation_matches_sentence_transformers(minilm):
    runner, st = minilm
    long_text = " ".join(f"word{i}" for i in range(400))
    got, ids = _run(runner, [long_text], max_tokens=256)
    assert len(ids[0]) == 256
    assert _cos(got[0], st.encode([long_text])[0]) >= 0.9999
    assert len(runner.encoder.encode([long_text])[0]) > 256  # untruncated count is the real one


def test_batched_equals_single(minilm):
    runner, _ = minilm
    together, _ = _run(runner, TEXTS)
    for text, vec in zip(TEXTS, together):
        alone, _ = _run(runner, [text])
        assert _cos(alone[0], vec) >= 0.99999


def test_dimensions_and_no_normalize(minilm):
    runner, _ = minilm
    raw, _ = _run(runner, ["hello"], PoolingParams(use_activation=False))
    short, _ = _run(runner, ["hello"], PoolingParams(dimensions=16))
    assert abs(np.linalg.norm(raw[0]) - 1.0) > 1e-3
    assert short[0].shape == (16,) and abs(np.linalg.norm(short[0]) - 1.0) < 1e-5


def test_auto_dtype_is_the_cpus_fast_dtype_and_keeps_cosine(minilm, caplog):
    """bf16 where the CPU has its instructions, unless the load timed it slower than fp32 here and said so
    (a Xeon's AVX512-BF16: ``workers.load.auto_speed``)."""
    from poolgate.workers.backends.cpu import BF16_FLAGS, cpu_flags

    runner, _ = minilm
    with caplog.at_level(logging.INFO, logger="poolgate.worker"):
        auto = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m",
                                       dtype="auto", max_batch_tokens=512))
    timed_slower = any("bfloat16 runs slower than float32" in r.getMessage() for r in caplog.records)
    assert auto.info.dtype == ("bfloat16" if cpu_flags() & set(BF16_FLAGS) and not timed_slower else "float32")
    got, _ = _run(auto, TEXTS)
    want, _ = _run(runner, TEXTS)
    assert min(_cos(g, w) for g, w in zip(got, want)) >= 0.999


def test_bf16_parity_runs_in_bf16(minilm):
    """Explicit bfloat16 (on any CPU): close to float32, and really computed in bf16 (not equal)."""
    runner, st = minilm
    bf16 = load_model(WorkerConfig(model=str(bundled_model_path()), served_model_name="m",
                                   dtype="bfloat16", max_batch_tokens=512))
    assert bf16.info.dtype == "bfloat16" and bf16.runner.dtype == torch.bfloat16
    got, _ = _run(bf16, TEXTS)
    want = st.encode(TEXTS, convert_to_numpy=True)
    assert min(_cos(g, w) for g, w in zip(got, want)) >= 0.999
    fp32, _ = _run(runner, TEXTS)
    assert np.abs(got - fp32).max() > 1e-4  # a float32 run would match to ~1e-7


def test_dense_cls_model_matches_sentence_transformers(tmp_path, tiny_bert):
    from sentence_transformers import SentenceTransformer, models
    from torch import nn

    folder, _ = tiny_bert
    body = models.Transformer(str(folder), max_seq_length=48)
    pool = models.Pooling(body.get_word_embedding_dimension(), pooling_mode="cls")
    dense = models.Dense(32, 16, activation_function=nn.Tanh())
    st = SentenceTransformer(modules=[body, pool, dense, models.Normalize()], device="cpu")
    st.save(str(tmp_path / "st"))
    runner = load_model(WorkerConfig(model=str(tmp_path / "st"), served_model_name="t", dtype="float32",
                                       max_batch_tokens=256))
    texts = ["w1 w2 w3", "w4", "w5 w6 w7 w8 w9 w10"]
    got, _ = _run(runner, texts)
    want = st.encode(texts)
    assert runner.info.embedding_dim == 16 and runner.info.max_model_len == 48
    for g, w in zip(got, want):
        assert _cos(g, w) >= 0.9999
    # token_embed goes through the same projector (ColBERT-style folders project token vectors)
    tokens, ids = _run(runner, texts[:1], PoolingParams(task="token_embed"))
    want_tokens = torch.as_tensor(st.encode(texts[:1], output_value="token_embeddings")[0])  # (T, 32), pre-Dense
    assert tokens.shape == (len(ids[0]), 16)
    with torch.no_grad():
        want_proj = torch.nn.functional.normalize(torch.tanh(dense.linear(want_tokens)), dim=-1).numpy()
    np.testing.assert_allclose(tokens, want_proj, atol=1e-5)


def test_do_lower_case_lowercases_before_tokenizing(tiny_bert):
    from poolgate.workers.load.hf_tokenizer import load_encoder

    folder, _ = tiny_bert
    plain, lowering = load_encoder(folder), load_encoder(folder, do_lower_case=True)
    assert lowering.encode(["W1 W2"]) == plain.encode(["w1 w2"])
    assert plain.encode(["W1 W2"]) != plain.encode(["w1 w2"])  # the vocabulary is case-sensitive
    assert lowering.encode(["W1 W2 W3"], max_tokens=3) == plain.encode(["w1"])


def test_add_special_tokens_false_matches_the_tokenizer(minilm):
    from poolgate.shared.wire.messages import PoolingCall
    from poolgate.shared.inputs.stage import InputStage

    runner, st = minilm
    stage = InputStage(runner.info, runner.encoder)
    call = PoolingCall("r", "m", ["Hello world", "x " * 300],
                       PoolingParams(add_special_tokens=False, truncate_prompt_tokens=-1))
    ids = stage.tokenize(call)
    want = st.tokenizer(["Hello world", "x " * 300], add_special_tokens=False, truncation=True,
                        max_length=256)["input_ids"]
    assert ids == want and len(ids[1]) == 256
