"""Qwen2-VL / Qwen3-VL embedders and the jina-reranker-m0 reranker against transformers' own forward.

Each tiny random checkpoint is served by poolgate (the plan's ids and images, one padded batch through the
family) and compared with transformers' processor + base model run one input at a time."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.wire.media import MediaInput, MediaRef
from poolgate.shared.wire.messages import ChatInput, PoolingCall, TextPair
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from tests.workers.models.media import qwen_vl_tiny as tiny

pytest.importorskip("transformers")

WORST: dict[str, float] = {}  # the figures the report quotes: worst cosine per case


def _png(pixels: np.ndarray) -> MediaRef:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return MediaRef("image", url="data:image/png;base64," + base64.b64encode(out.getvalue()).decode())


def _serve(folder, inputs, task: str, dtype: str = "float32", **cfg):
    """(rows per input, the ids the plan made): one call, one batch."""
    model = load_model(WorkerConfig(model=str(folder), served_model_name="m", dtype=dtype, **cfg))
    params = PoolingParams(task=task)
    encoded = InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", inputs, params))
    media = encoded.media or [None] * len(encoded.ids)
    seqs = [Sequence(ids, params, media=m) for ids, m in zip(encoded.ids, media, strict=True)]
    outputs = model.runner.execute(model.runner.prepare(seqs))
    return [o.rows.item(i) for o in outputs for i in range(len(o.rows))], encoded, model


def _cos(a, b) -> float:
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _embed_cases():
    a, b, c = tiny.image(1, 60, 90), tiny.image(2, 150, 40), tiny.image(3, 33, 33)
    chat = ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                          {"type": "text", "text": "a photo of w3"}]},)
    two = ({"role": "user", "content": [{"type": "text", "text": "w9"}, {"type": "image_url", "image_url": {}},
                                         {"type": "image_url", "image_url": {}}]},)
    messages = [{"role": "user", "content": "w4 w5 w6"}]
    render = tiny.tokenizer().apply_chat_template
    return [  # (input, the text transformers' processor gets, its images)
        ("w1 w2 w3 w4", "w1 w2 w3 w4", []),
        (MediaInput((_png(a), "a photo of w3"), chat=chat), render(list(chat), tokenize=False), [a]),
        (MediaInput((_png(b),)), render([{"role": "user", "content": [{"type": "image"}]}], tokenize=False), [b]),
        (MediaInput(("w9", _png(c), _png(a)), chat=two), render(list(two), tokenize=False), [c, a]),
        (ChatInput(messages), render(messages, tokenize=False), []),
    ]


@pytest.mark.parametrize("kind", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
@pytest.mark.parametrize("pooling", ["LAST", "MEAN"])
def test_embedder_equals_transformers(tmp_path, kind, pooling):
    from poolgate.shared.config.pooler_config import PoolerConfig

    processor, ref = tiny.make(tmp_path, kind)
    cases = _embed_cases()
    pooler = PoolerConfig(seq_pooling_type=pooling)
    for dtype, floor in (("float32", 0.9999), ("bfloat16", 0.99)):
        rows, encoded, _ = _serve(tmp_path, [x for x, _, _ in cases], "embed", dtype, pooler_config=pooler)
        for (_, text, images), got, ids in zip(cases, rows, encoded.ids, strict=True):
            hidden, want_ids = tiny.reference_hidden(processor, ref, text, images)
            assert ids == want_ids  # the pads expanded as transformers' processor expands them
            pooled = hidden[-1] if pooling == "LAST" else hidden.mean(0)
            want = torch.nn.functional.normalize(pooled, dim=-1).numpy()
            cos = _cos(got, want)
            WORST[f"{kind} {pooling} {dtype}"] = min(WORST.get(f"{kind} {pooling} {dtype}", 1.0), cos)
            assert cos >= floor, (kind, dtype, text)
    # the image moved the vector: the same text without its image is far from it
    assert _cos(rows[1], rows[0]) < 0.99


def test_a_transformers_4_layout_loads(tmp_path):
    """GME and jina-reranker-m0 on the Hub are saved as transformers 4 wrote them (``model.layers.*``,
    ``visual.*``): transformers' own key mapping places them; the vectors are the same."""
    from safetensors.torch import load_file, save_file

    processor, ref = tiny.make(tmp_path)
    path = tmp_path / "model.safetensors"

    def old(key: str) -> str:
        if key.startswith("model.visual."):
            return key.removeprefix("model.")
        return key.replace("model.language_model.", "model.", 1)

    save_file({old(k): v for k, v in load_file(path).items()}, path, metadata={"format": "pt"})
    assert any(k.startswith("visual.") for k in load_file(path))
    cases = _embed_cases()
    rows, _, _ = _serve(tmp_path, [x for x, _, _ in cases], "embed")
    for (_, text, images), got in zip(cases, rows, strict=True):
        hidden, _ = tiny.reference_hidden(processor, ref, text, images)
        assert _cos(got, torch.nn.functional.normalize(hidden[-1], dim=-1).numpy()) >= 0.9999


def test_image_tokens_and_refusals(tmp_path):
    tiny.make(tmp_path)
    pic = tiny.image(5, 200, 300)
    _, encoded, model = _serve(tmp_path, [MediaInput((_png(pic),))], "embed")
    (item,) = encoded.media[0]
    assert encoded.ids[0].count(tiny.IMAGE_TOKEN) == item.tokens == 8  # 200x300 in 28*28*12 pixels: 56x112
    assert item.arrays["image_grid_thw"].tolist() == [[1, 4, 8]]
    stage = InputStage(model.info, model.encoder)
    call = PoolingCall("r", "m", [MediaInput((_png(pic),))] * 17, PoolingParams(task="embed"))
    with pytest.raises(InvalidRequest, match="--max-images-per-request"):
        stage.encode(call)
    audio = MediaRef("audio", url="data:audio/wav;base64,AAAA")
    with pytest.raises(InvalidRequest, match="not audio"):
        stage.encode(PoolingCall("r", "m", [MediaInput((audio,))], PoolingParams(task="embed")))
    from dataclasses import replace

    short = InputStage(replace(model.info, max_model_len=6), model.encoder)
    with pytest.raises(InvalidRequest, match="not processed in chunks"):
        short.encode(PoolingCall("r", "m", [MediaInput((_png(pic),))], PoolingParams(task="embed")))
    with pytest.raises(InvalidRequest, match="not truncated"):
        stage.encode(PoolingCall("r", "m", [MediaInput((_png(pic),))],
                                 PoolingParams(task="embed", truncate_prompt_tokens=5)))


def test_jina_embeddings_v4_pooling(tmp_path):
    """Single vector: the mean over the image's span (vision start..end) for an input with an image, over every
    token otherwise; multi-vector: each token through multi_vector_projector, normalized."""
    from safetensors.torch import load_file, save_file

    processor, ref = tiny.make(tmp_path, "qwen2_5_vl")
    torch.manual_seed(4)
    proj = {"multi_vector_projector.weight": torch.randn(8, 32), "multi_vector_projector.bias": torch.randn(8)}
    path = tmp_path / "model.safetensors"
    save_file({**load_file(path), **proj}, path, metadata={"format": "pt"})
    cases = _embed_cases()
    overrides = {"single_vector_pool_strategy": "mean"}
    norm = torch.nn.functional.normalize
    vectors, encoded, _ = _serve(tmp_path, [x for x, _, _ in cases], "embed", hf_overrides=overrides)
    tokens, _, _ = _serve(tmp_path, [x for x, _, _ in cases], "token_embed", hf_overrides=overrides)
    for (_, text, images), vector, rows, ids in zip(cases, vectors, tokens, encoded.ids, strict=True):
        hidden, _ = tiny.reference_hidden(processor, ref, text, images)
        t = torch.tensor(ids)
        if images:
            span = torch.cumsum((t == tiny.START).int() - torch.roll((t == tiny.END).int(), 1), 0) > 0
            assert span.sum() < len(ids)  # the text around the image is left out
            pooled = hidden[span].mean(0)
        else:
            pooled = hidden.mean(0)
        assert _cos(vector, norm(pooled, dim=-1).numpy()) >= 0.9999, text
        want = norm(hidden @ proj["multi_vector_projector.weight"].T + proj["multi_vector_projector.bias"], dim=-1)
        assert rows.shape == (len(ids), 8)
        assert min(_cos(a, b) for a, b in zip(rows, want.numpy(), strict=True)) >= 0.9999


def _make_reranker(folder):
    from safetensors.torch import load_file, save_file

    processor, ref = tiny.make(folder, architecture="JinaVLForRanking", num_labels=1)
    torch.manual_seed(3)
    head = {"score.0.weight": torch.randn(32, 32) * 0.3, "score.0.bias": torch.randn(32) * 0.3,
            "score.2.weight": torch.randn(1, 32) * 0.3, "score.2.bias": torch.tensor([1.5])}
    path = folder / "model.safetensors"
    save_file({**load_file(path), **head}, path, metadata={"format": "pt"})
    return processor, ref, head


def _jina_reference(processor, ref, head, document: str, query: str, images) -> float:
    text = f"**Document**:\n{document}\n**Query**:\n{query}"
    hidden, _ = tiny.reference_hidden(processor, ref, text, images, suffix=(100,))
    h = torch.relu(hidden[-1] @ head["score.0.weight"].T + head["score.0.bias"])
    return float(torch.sigmoid(h @ head["score.2.weight"].T + head["score.2.bias"] - 2.65))


def test_jina_reranker_equals_a_hand_built_reference(tmp_path):
    processor, ref, head = _make_reranker(tmp_path)
    page, photo = tiny.image(7, 120, 80), tiny.image(8, 64, 64)
    ph = "<|vision_start|><|image_pad|><|vision_end|>"
    inputs = [TextPair("w1 w2", "w5 w6 w7"), MediaInput((_png(page), "w3 w4"), role="pair"),
              MediaInput(("w8", _png(page), _png(photo)), role="pair")]
    want = [_jina_reference(processor, ref, head, "w5 w6 w7", "w1 w2", []),
            _jina_reference(processor, ref, head, ph, "w3 w4", [page]),
            _jina_reference(processor, ref, head, "w8" + ph, ph, [page, photo])]
    for dtype, tol in (("float32", 1e-5), ("bfloat16", 3e-2)):
        rows, encoded, model = _serve(tmp_path, inputs, "classify", dtype)
        got = [float(np.asarray(r).ravel()[0]) for r in rows]
        WORST[f"jina_vl {dtype} max abs"] = float(np.abs(np.subtract(got, want)).max())
        assert np.allclose(got, want, atol=tol), (dtype, got, want)
        assert all(ids[-1] == 100 for ids in encoded.ids)
    assert model.info.tasks[0] == "classify" and "image" in model.info.modalities
    capped = TextPair("w1 w2 w3", "w4 w5 w6", max_text_tokens=1, max_pair_tokens=2)
    stage = InputStage(model.info, model.encoder)
    (ids,) = stage.encode(PoolingCall("r", "m", [capped], PoolingParams(task="classify"))).ids
    assert ids == tiny.tokenizer()("**Document**:\nw4 w5\n**Query**:\nw1")["input_ids"] + [100]
    with pytest.raises(InvalidRequest, match="pairs only"):
        InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", ["w1"], PoolingParams(task="classify")))


def test_missing_head_is_refused(tmp_path):
    from poolgate.workers.load.weights import CheckpointError

    tiny.make(tmp_path, architecture="JinaVLForRanking", num_labels=1)
    with pytest.raises(CheckpointError, match="score.0.weight"):
        load_model(WorkerConfig(model=str(tmp_path), served_model_name="m", dtype="float32"))


def test_report_worst_cosines():
    """Prints the figures collected above (run with -s)."""
    for name, value in sorted(WORST.items()):
        print(f"{name}: {value:.8f}")


def test_chat_options_reach_the_template(tmp_path):
    """A media chat's add_generation_prompt is rendered by the template (never dropped): the assistant turn's
    opening tokens follow the conversation, and a model that reads no template refuses the option instead."""
    tiny.make(tmp_path)
    pic = tiny.image(3, 56, 56)
    chat = ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}},
                                         {"type": "text", "text": "a cat"}]},)
    plain = MediaInput((_png(pic), "a cat"), chat=chat)
    opened = MediaInput((_png(pic), "a cat"), chat=chat, add_generation_prompt=True)
    _, encoded, model = _serve(tmp_path, [plain, opened], "embed")
    stage = InputStage(model.info, model.encoder)
    want = model.encoder.render_chat(ChatInput([{"role": "user", "content": [{"type": "image"},
                                                {"type": "text", "text": "a cat"}]}], add_generation_prompt=True))
    assert want.endswith("<|im_start|>assistant\n")
    assert len(encoded.ids[1]) > len(encoded.ids[0]) and encoded.ids[1][: len(encoded.ids[0])] == encoded.ids[0]
    assert stage.encode(PoolingCall("r", "m", [opened], PoolingParams(task="embed"))).ids == [encoded.ids[1]]
