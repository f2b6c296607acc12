"""Chunked processing on the bundled MiniLM (MEAN, max_model_len 256): a ~600-token text through the Engine.

Two references for the same 256-token chunks of the text's own ids:

- the runner's own chunk embeddings (``pool_ids``), folded by hand: the exact
  one, since the engine runs those very sequences through that very runner, so
  only the fold (weights, order, re-normalization) can differ — checked to 1e-6;
- sentence-transformers' own pipeline (Transformer → mean Pooling → Normalize)
  on the same chunk ids, folded by hand: independent of poolgate's model code,
  but a different fp32 kernel path, so checked by cosine as the parity tests are.

Tokenizing the chunks' text again would not give the same ids (the later
chunks have no [CLS], the earlier no [SEP]), so both references take ids.
"""
import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.load.build import load_model
from poolgate.workers.engine.engine import Engine
from tests.workers.pooled import pool_ids

TEXT = " ".join(f"Sentence {i} of a long report says that item {i * 7} costs {i * 3} euros." for i in range(40))


@pytest.fixture(scope="module")
def model():
    cfg = WorkerConfig(model=str(bundled_model_path()), served_model_name="m", dtype="float32",
                       max_batch_tokens=512, pooler_config=PoolerConfig(enable_chunked_processing=True))
    return load_model(cfg)


async def _embed(model, params: PoolingParams):
    engine = Engine(model)
    await engine.start()
    try:
        return await engine.submit(PoolingCall(request_id="r", model="m", inputs=[TEXT, "short"], params=params))
    finally:
        await engine.stop()


def _fold(chunk_vectors: np.ndarray, weights: list[int], renormalize: bool) -> np.ndarray:
    mean = (chunk_vectors.astype(np.float64) * np.array(weights)[:, None]).sum(0) / sum(weights)
    return mean / np.linalg.norm(mean) if renormalize else mean


def _st_chunks(chunks: list[list[int]]) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(bundled_model_path()), device="cpu")
    out = []
    with torch.inference_mode():
        for ids in chunks:
            x = torch.tensor([ids])
            features = {"input_ids": x, "attention_mask": torch.ones_like(x), "token_type_ids": torch.zeros_like(x)}
            out.append(st(features)["sentence_embedding"][0].numpy())
    return np.stack(out)


async def test_a_600_token_text_is_the_weighted_mean_of_its_256_token_chunks(model):
    assert model.info.chunked_processing and model.info.max_embed_len is None
    ids = model.encoder.encode([TEXT])[0]
    assert 512 < len(ids) < 768  # three chunks, the last one partial
    chunks = [ids[i:i + 256] for i in range(0, len(ids), 256)]
    weights = [len(c) for c in chunks]
    result = await _embed(model, PoolingParams())
    assert result.prompt_tokens == [len(ids), len(model.encoder.encode(["short"])[0])]
    got = result.outputs.item(0)
    own = _fold(pool_ids(model, chunks), weights, renormalize=True)
    np.testing.assert_allclose(got, own, atol=1e-6)
    st = _fold(_st_chunks(chunks), weights, renormalize=True)
    assert float(np.dot(got, st) / np.linalg.norm(got)) >= 0.99999
    np.testing.assert_allclose(got, st, atol=1e-4)
    np.testing.assert_allclose(result.outputs.item(1), pool_ids(model, model.encoder.encode(["short"]))[0], atol=1e-6)


async def test_use_activation_false_is_the_plain_weighted_mean_of_raw_chunks(model):
    ids = model.encoder.encode([TEXT])[0]
    chunks = [ids[i:i + 256] for i in range(0, len(ids), 256)]
    params = PoolingParams(use_activation=False)
    got = (await _embed(model, params)).outputs.item(0)
    want = _fold(pool_ids(model, chunks, params), [len(c) for c in chunks], renormalize=False)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert abs(np.linalg.norm(got) - 1) > 1e-3  # raw MiniLM vectors are not unit norm


def test_start_up_refuses_chunking_with_cls_pooling():
    cfg = WorkerConfig(model=str(bundled_model_path()), served_model_name="m", dtype="float32",
                       pooler_config=PoolerConfig(pooling_type="CLS", enable_chunked_processing=True))
    with pytest.raises(ValueError, match="enable_chunked_processing needs MEAN pooling, but this model pools "
                                         "embed with CLS"):
        load_model(cfg)
