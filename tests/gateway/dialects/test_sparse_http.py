"""Sparse vectors on the standard routes (/v1/embeddings embedding_types, Cohere /v2/embed "sparse").

References are computed here with transformers: SPLADE's ``log1p(relu(MLM logits))`` max over the
content tokens; BGE-M3's ``relu(sparse_linear(h))`` per token, each id's max without the unused ids
(FlagEmbedding's rule), its CLS vector and its ColBERT vectors.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.engine.engine import Engine
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_tokenizer
from tests.workers.pooling.test_bge_m3 import _layout

TEXTS = ["w1 w2 w3 w2", "w40 w41", "w7 w8 w9 w10 w11 w12 w7 w13"]
VOCAB = 100


def dense_of(sparse: dict) -> np.ndarray:
    """A {indices, values} answer as a (vocab,) vector (the ids must ascend, no repeats)."""
    assert sparse["indices"] == sorted(set(sparse["indices"]))
    out = np.zeros(VOCAB, dtype=np.float32)
    out[sparse["indices"]] = sparse["values"]
    return out


async def post(client, path, body, status=200):
    resp = await client.post(path, json=body)
    out = await resp.json()
    assert resp.status == status, out
    return out


@pytest.fixture(scope="module")
def splade(tmp_path_factory):
    folder = tmp_path_factory.mktemp("splade")
    config = AutoConfig.for_model("bert", vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0)
    torch.manual_seed(0)
    mlm = AutoModelForMaskedLM.from_config(config).eval()
    mlm.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    tok = AutoTokenizer.from_pretrained(str(folder))
    refs = []
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            weights = torch.log1p(torch.relu(mlm(input_ids=torch.tensor([ids])).logits[0]))  # (T, vocab)
            refs.append(weights[1:-1].max(0).values.numpy())  # CLS and SEP left out
    model = load_model(WorkerConfig(model=str(folder), served_model_name="splade", dtype="float32",
                                    hf_overrides={"architectures": ["BertSpladeSparseEmbeddingModel"]}))
    return model, np.stack(refs), tok


@pytest.fixture(scope="module")
def bge_m3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bge")
    encoder, sparse, colbert = _layout(folder, pickles=False)
    tok = AutoTokenizer.from_pretrained(str(folder))
    # FlagEmbedding's unused ids (CLS, EOS, PAD, UNK); XLM-R's EOS is its SEP, which this tiny tokenizer names SEP
    unused = {tok.cls_token_id, tok.eos_token_id, tok.sep_token_id, tok.pad_token_id, tok.unk_token_id}
    refs = {"dense": [], "sparse": [], "multi_vector": []}
    with torch.no_grad():
        for text in TEXTS:
            ids = tok(text)["input_ids"]
            h = encoder(input_ids=torch.tensor([ids])).last_hidden_state[0]  # (T, 32)
            weights = torch.relu(sparse(h))[:, 0].numpy()  # (T,)
            vector = np.zeros(VOCAB, dtype=np.float32)
            for w, i in zip(weights, ids):
                if i not in unused and w > vector[i]:
                    vector[i] = w
            refs["sparse"].append(vector)
            refs["dense"].append(torch.nn.functional.normalize(h[0], dim=-1).numpy())
            refs["multi_vector"].append(torch.nn.functional.normalize(colbert(h[1:]), dim=-1).numpy())
    model = load_model(WorkerConfig(model=str(folder), served_model_name="bge-m3", dtype="float32",
                                    hf_overrides={"architectures": ["BgeM3EmbeddingModel"]}))
    return model, refs, tok


async def test_splade_sparse_equals_transformers_on_both_routes(gateway, splade):
    model, refs, tok = splade
    client = await gateway(models=[model])
    out = await post(client, "/v1/embeddings", {"input": TEXTS, "embedding_types": ["sparse"], "return_tokens": True})
    for item, ref in zip(out["data"], refs):
        assert "embedding" not in item or item["embedding"] is None
        np.testing.assert_allclose(dense_of(item["sparse_embedding"]), ref, atol=1e-5)
        sparse = item["sparse_embedding"]
        assert sparse["tokens"] == tok.convert_ids_to_tokens(sparse["indices"])
        assert min(sparse["values"]) > 0
    cohere = await post(client, "/v2/embed", {"texts": TEXTS, "embedding_types": ["float", "sparse"]})
    for vector, sparse, ref in zip(cohere["embeddings"]["float"], cohere["embeddings"]["sparse"], refs):
        np.testing.assert_allclose(dense_of(sparse), ref, atol=1e-5)
        np.testing.assert_allclose(np.float32(vector), ref, atol=1e-5)  # SPLADE's dense is the same vector
    assert out["usage"]["prompt_tokens"] == cohere["meta"]["billed_units"]["input_tokens"] == sum(
        len(tok(t)["input_ids"]) for t in TEXTS)


async def test_bge_m3_dense_sparse_and_multi_vector_in_one_request(gateway, bge_m3):
    model, refs, _ = bge_m3
    client = await gateway(models=[model])
    out = await post(client, "/v1/embeddings", {"input": TEXTS, "embedding_types": ["dense", "sparse", "multi_vector"]})
    for i, item in enumerate(out["data"]):
        np.testing.assert_allclose(item["embedding"], refs["dense"][i], atol=1e-5)
        np.testing.assert_allclose(dense_of(item["sparse_embedding"]), refs["sparse"][i], atol=1e-5)
        np.testing.assert_allclose(item["multi_vector"], refs["multi_vector"][i], atol=1e-5)
    assert "tokens" not in out["data"][0]["sparse_embedding"]
    cohere = await post(client, "/v2/embed", {"texts": TEXTS, "embedding_types": ["sparse"]})
    assert list(cohere["embeddings"]) == ["sparse"]
    for sparse, ref in zip(cohere["embeddings"]["sparse"], refs["sparse"]):
        np.testing.assert_allclose(dense_of(sparse), ref, atol=1e-5)
    plain = await post(client, "/v1/embeddings", {"input": TEXTS})  # without the field: the OpenAI answer
    assert set(plain["data"][0]) == {"index", "object", "embedding"}


class Counting:
    """Wraps the runner's model: counts its forwards."""

    def __init__(self, model):
        self.model, self.calls = model, 0

    def __call__(self, batch):
        self.calls += 1
        return self.model(batch)


async def test_bge_m3_three_outputs_are_one_call_and_one_forward_equal_to_three_calls(gateway, bge_m3, monkeypatch):
    model, _, _ = bge_m3
    forwards = Counting(model.runner.model)
    monkeypatch.setattr(model.runner, "model", forwards)
    submits = []
    submit = Engine.submit_tokens
    monkeypatch.setattr(Engine, "submit_tokens", lambda self, call: (submits.append(call), submit(self, call))[1])
    client = await gateway(models=[model])
    one = {"dense": {}, "sparse": {"return_tokens": True}, "multi_vector": {}}
    separate = {}
    for kind, extra in one.items():
        before = forwards.calls
        separate[kind] = await post(client, "/v1/embeddings", {"input": TEXTS, "embedding_types": [kind], **extra})
        per_call = forwards.calls - before  # 1, or one per CPU lane the batch was cut into
    submits.clear()
    before = forwards.calls
    out = await post(client, "/v1/embeddings", {"input": TEXTS, "embedding_types": list(one), "return_tokens": True})
    assert len(submits) == 1 and forwards.calls - before == per_call
    assert [p.task for p in submits[0].params.all_outputs()] == ["embed", "token_classify", "token_embed"]
    fields = {"dense": "embedding", "sparse": "sparse_embedding", "multi_vector": "multi_vector"}
    for kind, field in fields.items():
        for item, alone in zip(out["data"], separate[kind]["data"]):
            assert item[field] == alone[field], kind  # bit for bit: the same floats from the same forward
    assert out["usage"] == separate["dense"]["usage"]
    out = await post(client, "/v1/embeddings", {"input": TEXTS, "embedding_types": ["multi_vector", "dense"]})
    for item, alone in zip(out["data"], separate["dense"]["data"]):
        assert item["embedding"] == alone["embedding"] and "sparse_embedding" not in item
    cohere = {kind: await post(client, "/v2/embed", {"texts": TEXTS, "embedding_types": [kind]})
              for kind in ("float", "sparse")}
    submits.clear()
    before = forwards.calls
    both = await post(client, "/v2/embed", {"texts": TEXTS, "embedding_types": ["float", "sparse"]})
    assert len(submits) == 1 and forwards.calls - before == per_call
    assert both["embeddings"] == {**cohere["float"]["embeddings"], **cohere["sparse"]["embeddings"]}


async def test_sparse_of_a_model_without_a_sparse_head_is_a_400(gateway):
    client = await gateway()
    out = await post(client, "/v1/embeddings", {"input": "a", "embedding_types": ["sparse"]}, status=400)
    assert "has no sparse head" in out["error"]["message"]
    out = await post(client, "/v2/embed", {"texts": ["a"], "embedding_types": ["sparse"]}, status=400)
    assert set(out) == {"message"} and "has no sparse head" in out["message"]
    out = await post(client, "/v1/embeddings", {"input": "a", "embedding_types": ["multi_vector"]}, status=400)
    assert "no multi-vector output" in out["error"]["message"]


@pytest.mark.parametrize("body,message", [
    ({"return_tokens": True}, "return_tokens applies to sparse embeddings"),
    ({"embedding_types": ["sparse"], "encoding_format": "bytes"}, "encoding_format must be float or base64"),
    ({"embedding_types": ["sparse"], "dimensions": 8}, "dimensions"),
])
async def test_bad_sparse_requests_are_400s(gateway, splade, body, message):
    model, _, _ = splade
    client = await gateway(models=[model])
    out = await post(client, "/v1/embeddings", {"input": TEXTS[:1], **body}, status=400)
    assert message in out["error"]["message"]
