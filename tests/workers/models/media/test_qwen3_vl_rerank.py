"""Qwen3-VL-Reranker (``Qwen3VLForSequenceClassification`` over a Qwen3-VL generation checkpoint, as vLLM documents
it) against transformers' ``Qwen3VLForConditionalGeneration``: sigmoid of the LAST token's logit for the second
``classifier_from_token`` minus the first's, on the reranker's prompt, text and image pairs in one batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.score_templates import qwen3_vl_rerank
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.messages import PoolingCall, TextPair
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.workers.models.media import qwen_vl_tiny as tiny
from tests.workers.models.media.test_qwen_vl import _png, _serve

transformers = pytest.importorskip("transformers")

TOKENS = ["w5", "w6"]  # the tiny vocabulary's stand-ins for ["no", "yes"]
OVERRIDES = {"architectures": ["Qwen3VLForSequenceClassification"], "classifier_from_token": TOKENS,
             "is_original_qwen3_reranker": True}
PH = "<|vision_start|><|image_pad|><|vision_end|>"


def _reference(gen, text: str, images: list[np.ndarray]) -> float:
    """transformers' generation model on the prompt (its image pads expanded as its processor does): sigmoid of
    logit(yes) − logit(no) at the last token."""
    processor = transformers.Qwen2VLImageProcessorPil(**tiny.PIXELS, patch_size=16)
    kwargs = {}
    if images:
        out = processor(images=images, return_tensors="pt")
        counts = [int(g.prod()) // processor.merge_size**2 for g in out["image_grid_thw"]]
        pieces = text.split("<|image_pad|>")
        text = pieces[0] + "".join("<|image_pad|>" * n + rest for n, rest in zip(counts, pieces[1:], strict=True))
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    tok = tiny.tokenizer()
    ids = torch.tensor([tok(text)["input_ids"]])
    kwargs["mm_token_type_ids"] = (ids == tiny.IMAGE_TOKEN).int()
    with torch.no_grad():
        logits = gen(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs).logits[0, -1]
    no, yes = tok.convert_tokens_to_ids(TOKENS)
    return float(torch.sigmoid(logits[yes] - logits[no]))


def test_prompt_is_vllms_template():
    assert qwen3_vl_rerank("q", "d", None) == (
        "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
        'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n<|im_start|>user\n<Instruct>: Given a '
        "search query, retrieve relevant candidates that answer the query.<Query>:q\n<Document>:d<|im_end|>\n"
        "<|im_start|>assistant\n\n")


def test_qwen3_vl_reranker_equals_transformers(tmp_path):
    tiny.make(tmp_path, "qwen3_vl")
    gen = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32).eval()
    page, photo = tiny.image(7, 120, 80), tiny.image(8, 64, 64)
    inputs = [TextPair("w1 w2", "w3 w4 w7", instruction="w9 w8"),
              MediaInput((_png(page), "w3 w4"), role="pair"),  # an image document, a text query
              MediaInput(("w8", _png(page), _png(photo)), role="pair", chat_template_kwargs={"instruction": "w2"})]
    want = [_reference(gen, qwen3_vl_rerank("w1 w2", "w3 w4 w7", "w9 w8"), []),
            _reference(gen, qwen3_vl_rerank("w3 w4", PH, None), [page]),
            _reference(gen, qwen3_vl_rerank(PH, "w8\n" + PH, "w2"), [page, photo])]
    assert len(set(np.round(want, 4))) == 3, want  # the pairs score apart: the check below can tell them
    print("Qwen3-VL-Reranker reference scores", want)
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 3e-2)):
        rows, _, model = _serve(tmp_path, inputs, "classify", dtype, hf_overrides=OVERRIDES)
        got = [float(np.asarray(r).ravel()[0]) for r in rows]
        print(f"Qwen3-VL-Reranker {dtype}: max abs diff {np.abs(np.subtract(got, want)).max():.2e}")
        assert np.allclose(got, want, atol=tol), (dtype, got, want)
    assert model.info.tasks[0] == "classify" and "image" in model.info.modalities
    with pytest.raises(InvalidRequest, match="pairs only"):
        InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", ["w1"], PoolingParams(task="classify")))


def test_reranker_without_its_tokens_is_refused(tmp_path):
    tiny.make(tmp_path, "qwen3_vl")
    bare = {"architectures": ["Qwen3VLForSequenceClassification"]}
    with pytest.raises(CheckpointError, match="classifier_from_token"):
        load_model(WorkerConfig(model=str(tmp_path), served_model_name="m", hf_overrides=bare))
    unknown = {**bare, "classifier_from_token": ["no", "yes"]}  # not in the tiny vocabulary
    with pytest.raises(ValueError, match="not in the vocabulary"):
        load_model(WorkerConfig(model=str(tmp_path), served_model_name="m", hf_overrides=unknown))


def test_jina_reranker_refuses_an_instruction(tmp_path):
    tiny.make(tmp_path, architecture="JinaVLForRanking", num_labels=1)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(tmp_path / "model.safetensors"))  # give it the head it needs
    torch.manual_seed(0)
    tensors |= {"score.0.weight": torch.randn(32, 32), "score.0.bias": torch.zeros(32),
                "score.2.weight": torch.randn(1, 32), "score.2.bias": torch.zeros(1)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="m"))
    pair = TextPair("w1", "w2", instruction="judge")
    with pytest.raises(InvalidRequest, match="takes no instruction"):
        InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", [pair], PoolingParams(task="classify")))


def test_rerank_over_http_with_an_instruction(tmp_path):
    """``poolgate serve --hf-overrides`` as vLLM's example serves Qwen3-VL-Reranker: /rerank of an image page, a
    caption with its image and a text, with ``instruction``, equals the reference; /score likewise."""
    import json

    import requests

    from tests.live_server import live_server

    tiny.make(tmp_path / "m", "qwen3_vl")
    gen = transformers.Qwen3VLForConditionalGeneration.from_pretrained(tmp_path / "m", dtype=torch.float32).eval()
    page, other = tiny.image(11, 90, 140), tiny.image(12, 40, 40)
    documents = [{"content": [{"type": "image_url", "image_url": {"url": _png(page).url}}]},
                 {"content": [{"type": "text", "text": "w8"},
                              {"type": "image_url", "image_url": {"url": _png(other).url}}]},
                 "w5 w6 w7"]
    want = [_reference(gen, qwen3_vl_rerank("w1 w2", PH, "w9"), [page]),
            _reference(gen, qwen3_vl_rerank("w1 w2", "w8\n" + PH, "w9"), [other]),
            _reference(gen, qwen3_vl_rerank("w1 w2", "w5 w6 w7", "w9"), [])]
    with live_server(tmp_path, str(tmp_path / "m"), "--served-model-name", "m", "--dtype", "float32",
                     "--hf-overrides", json.dumps(OVERRIDES)) as server:
        body = requests.post(f"{server.url}/rerank", json={"model": "m", "query": "w1 w2", "documents": documents,
                                                           "instruction": "w9"}, timeout=60).json()
        got = {r["index"]: r["relevance_score"] for r in body["results"]}
        assert [got[i] for i in range(3)] == pytest.approx(want, abs=1e-5), body
        score = requests.post(f"{server.url}/score", json={"model": "m", "queries": "w1 w2", "documents": documents[0],
                                                           "instruction": "w9"}, timeout=60).json()
        assert score["data"][0]["score"] == pytest.approx(want[0], abs=1e-5), score
