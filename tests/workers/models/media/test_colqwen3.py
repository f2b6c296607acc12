"""ColQwen3 (``workers.models.media.colqwen3``) in its three published layouts, and colpali-engine's ColQwen3.5,
against colpali-engine's own models.

colpali-engine 0.3.18's ``ColQwen3`` (its modeling file, loaded alone: the package imports torchvision, which has
no wheel for this torch; ``.ci/run`` unpacks the wheel under ``.cache/colpali-engine``) is the reference for its
layout and for TomoroAI's (the same tensors under ``vlm.`` with ``embedding_proj_layer``); its processor's strings
are read from its processing file. OpenSearch-AI's head (hidden → hidden, the first ``dims`` kept, normalised) and
NVIDIA's (no projection; the language model attending both ways, as its published code sets) are written over the
same transformers backbone. Each tiny random checkpoint is served (queries and pages in one packed batch) and
every token's vector compared with the reference run one input at a time."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.inputs.stage import InputStage
from poolgate.shared.wire.media import MediaInput
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.workers.models.media import qwen_vl_tiny as tiny
from tests.workers.models.media.test_qwen_vl import _cos, _png

pytest.importorskip("transformers")

ENGINE = Path(__file__).resolve().parents[4] / ".cache" / "colpali-engine" / "colpali_engine" / "models"
WORST: dict[str, float] = {}  # worst cosine per layout and dtype (the report quotes them)


def _engine_file(relative: str) -> Path:
    path = ENGINE / relative
    if not path.is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{path} is missing: .ci/run unpacks colpali-engine 0.3.18 there")
        pytest.skip(f"colpali-engine is not unpacked at {ENGINE} (.ci/run does it)")
    return path


def _engine_module(relative: str):
    """A colpali-engine modeling file, loaded alone. Importing it registers a weight-name mapping for every
    ``qwen3_vl`` model in the process (transformers' ``register_checkpoint_conversion_mapping``); that is undone
    here, so no other test's Qwen3-VL checkpoint is saved or loaded through it."""
    from transformers import conversion_mapping

    before = set(conversion_mapping.USER_REGISTERED_MAPPINGS)
    spec = importlib.util.spec_from_file_location(f"reference_{Path(relative).stem}", _engine_file(relative))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in conversion_mapping.USER_REGISTERED_MAPPINGS - before:
        conversion_mapping.USER_REGISTERED_MAPPINGS.discard(name)
        conversion_mapping._checkpoint_conversion_mapping_cache.pop(name, None)
    return module


def _engine_model():
    return _engine_module("qwen3/colqwen3/modeling_colqwen3.py").ColQwen3


def _engine_strings(processing: str = "qwen3/colqwen3/processing_colqwen3.py") -> dict[str, str]:
    """A colpali-engine processor's class strings, and its base class's query prefix, as written there."""
    found: dict[str, str] = {}
    for relative in (processing, "../utils/processing_utils.py"):
        tree = ast.parse(_engine_file(relative).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                with contextlib.suppress(ValueError):  # a value that is not a literal: not a string we read
                    found.setdefault(node.target.id, ast.literal_eval(node.value))
    return found


def _save(folder: Path, tensors: dict[str, torch.Tensor], config: dict, *, template: bool = False, **processor):
    from safetensors.torch import save_file
    from transformers import Qwen2VLImageProcessorPil

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    tok = tiny.tokenizer()
    if not template:
        tok.chat_template = None
    tok.save_pretrained(folder)
    Qwen2VLImageProcessorPil(**tiny.PIXELS, patch_size=16).save_pretrained(folder)
    if processor:
        (folder / "processor_config.json").write_text(json.dumps(processor))


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """colpali-engine's ColQwen3 (random, weights scaled up so images and positions move the vectors), saved (its
    tensors as the module names them: ``visual.*``, ``language_model.*``, ``custom_text_proj.*``); and the folder."""
    cls = _engine_model()
    torch.manual_seed(0)
    model = cls(tiny.config("qwen3_vl", "ColQwen3")).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0) if p.dim() > 1 else None
    folder = tmp_path_factory.mktemp("colqwen3") / "colpali-engine"
    model.save_pretrained(folder, safe_serialization=True)
    tok = tiny.tokenizer()
    tok.chat_template = None
    tok.save_pretrained(folder)
    from transformers import Qwen2VLImageProcessorPil

    Qwen2VLImageProcessorPil(**tiny.PIXELS, patch_size=16).save_pretrained(folder)
    return model, folder


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _variant(engine, root: Path, name: str) -> Path:
    """The engine's tensors in another publisher's layout (module doc), with its config."""
    model, source = engine
    saved, config = _tensors(source), json.loads((source / "config.json").read_text())
    backbone = {k.removeprefix("model."): v for k, v in saved.items() if "custom_text_proj" not in k}
    proj = {k.rsplit(".", 1)[1]: v for k, v in saved.items() if "custom_text_proj" in k}
    torch.manual_seed(1)
    folder = root / name
    if name == "tomoro":
        tensors = {f"vlm.model.{k}": v for k, v in backbone.items()}
        tensors |= {f"embedding_proj_layer.{k}": v for k, v in proj.items()}
        tensors["vlm.lm_head.weight"] = torch.randn(200, 32)
        _save(folder, tensors, {**config, "model_type": "colqwen3", "architectures": ["ColQwen3"],
                                "embed_dim": int(proj["weight"].shape[0])})
    elif name == "opensearch":
        square = torch.nn.Linear(32, 32)
        tensors = {**backbone, "custom_text_proj.weight": square.weight.detach() * 3,
                   "custom_text_proj.bias": square.bias.detach()}
        _save(folder, tensors, {**config, "model_type": "ops_colqwen3", "architectures": ["OpsColQwen3Model"],
                                "dims": 16})
    else:  # nemotron
        tensors = {f"model.{k}": v for k, v in backbone.items()} | {"lm_head.weight": torch.randn(200, 32)}
        _save(folder, tensors, {**config, "model_type": "qwen3_vl_nemotron_embed",
                                "architectures": ["Qwen3VLNemotronEmbedModel"], "pooling": "colbert"},
              template=True, query_prefix="query:", passage_prefix="passage:")
    return folder


def _serve(folder: Path, inputs: list, dtype: str = "float32"):
    model = load_model(WorkerConfig(model=str(folder), served_model_name="m", dtype=dtype))
    params = PoolingParams(task="token_embed")
    encoded = InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", inputs, params))
    media = encoded.media or [None] * len(encoded.ids)
    seqs = [Sequence(ids, params, media=m) for ids, m in zip(encoded.ids, media, strict=True)]
    outputs = model.runner.execute(model.runner.prepare(seqs))
    return [np.asarray(o.rows.item(i)) for o in outputs for i in range(len(o.rows))], encoded, model


def _reference_inputs(text: str, images: list[np.ndarray], max_pixels: int | None = None, tok=None):
    """The ids and model inputs the publisher's processor makes for one input (``tiny.reference_hidden``'s steps)."""
    from transformers import Qwen2VLImageProcessorPil

    processor = Qwen2VLImageProcessorPil(**{**tiny.PIXELS, **({"max_pixels": max_pixels} if max_pixels else {})},
                                         patch_size=16)
    kwargs: dict = {}
    if images:
        out = processor(images=images, return_tensors="pt")
        n = int(out["image_grid_thw"][0].prod()) // processor.merge_size**2
        text = text.replace("<|image_pad|>", "<|image_pad|>" * n)
        kwargs = {"pixel_values": out["pixel_values"], "image_grid_thw": out["image_grid_thw"]}
    ids = (tok or tiny.tokenizer())(text, add_special_tokens=True)["input_ids"]
    input_ids = torch.tensor([ids])
    kwargs["mm_token_type_ids"] = (input_ids == tiny.IMAGE_TOKEN).int()
    return ids, input_ids, kwargs


def _hidden(model, input_ids, kwargs, *, bidirectional: bool = False) -> torch.Tensor:
    """transformers' Qwen3VLModel forward (the engine's backbone) for one input: causal, or both ways as NVIDIA's
    text model runs (``is_causal`` off, a 4-D mask of its attention mask)."""
    from transformers import Qwen3VLModel

    mask = torch.ones_like(input_ids)
    if not bidirectional:
        return Qwen3VLModel.forward(model, input_ids=input_ids, attention_mask=mask, **kwargs).last_hidden_state[0]
    positions, _ = model.get_rope_index(input_ids, image_grid_thw=kwargs.get("image_grid_thw"), attention_mask=mask,
                                        mm_token_type_ids=kwargs["mm_token_type_ids"])
    layers = model.language_model.layers
    for layer in layers:
        layer.self_attn.is_causal = False
    try:
        full = torch.zeros((1, 1, input_ids.shape[1], input_ids.shape[1]))
        return Qwen3VLModel.forward(model, input_ids=input_ids, attention_mask=full, position_ids=positions,
                                    **kwargs).last_hidden_state[0]
    finally:
        for layer in layers:
            layer.self_attn.is_causal = True


QUERIES = ["w1 w2 w3", "  a photo of w7  ", "w9"]
# (height, width, seed); the last is over the tiny folder's max_pixels, which TomoroAI's cap (1,280 tokens) replaces
PAGES = [(60, 90, 11), (150, 40, 12), (33, 33, 13), (120, 120, 14)]


def _inputs():
    return [*QUERIES, *[MediaInput((_png(tiny.image(seed, h, w)),)) for h, w, seed in PAGES]]


def _expected(engine, name: str, folder: Path) -> list[tuple[list[int], torch.Tensor]]:
    """Per input (queries, then pages): the reference ids and token vectors, one input at a time."""
    model, _ = engine
    s = _engine_strings()
    augmentation = s["query_augmentation_token"] * 10
    out = []
    with torch.no_grad():
        for q in QUERIES:
            if name == "nemotron":
                text = f"<|im_start|>user\nQuery: query: {q}<|im_end|>\n<|im_start|>assistant\n"
            elif name == "opensearch":
                text = q  # its processor's process_queries: the text alone
            else:
                text = s["query_prefix"] + (q.strip() if name == "tomoro" else q) + augmentation
            out.append(_reference_inputs(text, []))
        for h, w, seed in PAGES:
            if name == "nemotron":
                text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>passage: <|im_end|>\n" \
                       "<|im_start|>assistant\n"
            elif name == "opensearch":
                text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Describe the image.<|im_end|>" \
                       "<|im_start|>assistant\n<|endoftext|>"
            else:
                text = s["visual_prompt_prefix"]
            cap = 1280 * 32 * 32 if name == "tomoro" else None  # TomoroAI's processor: 1,280 image tokens at most
            out.append(_reference_inputs(text, [tiny.image(seed, h, w)], cap))
        vectors = []
        for ids, input_ids, kwargs in out:
            if name in ("colpali-engine", "tomoro"):  # colpali-engine's own forward (pixel rows padded per image)
                args = dict(kwargs)
                if "pixel_values" in args:
                    args["pixel_values"] = args["pixel_values"][None]
                vec = model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **args)[0]
            elif name == "opensearch":
                tensors = _tensors(folder)
                hidden = _hidden(model, input_ids, kwargs)
                proj = hidden @ tensors["custom_text_proj.weight"].T + tensors["custom_text_proj.bias"]
                vec = torch.nn.functional.normalize(proj[:, :16], dim=-1)
            else:
                vec = torch.nn.functional.normalize(_hidden(model, input_ids, kwargs, bidirectional=True), dim=-1)
            vectors.append((ids, vec))
    return vectors


@pytest.mark.parametrize("name", ["colpali-engine", "tomoro", "opensearch", "nemotron"])
def test_colqwen3_layouts_equal_their_reference(engine, tmp_path, name):
    folder = engine[1] if name == "colpali-engine" else _variant(engine, tmp_path, name)
    expected = _expected(engine, name, folder)
    for dtype, floor in (("float32", 0.9999), ("bfloat16", 0.99)):
        rows, encoded, model = _serve(folder, _inputs(), dtype)
        assert model.info.tasks == ("token_embed",)
        worst = 1.0
        for got, ids, (want_ids, want) in zip(rows, encoded.ids, expected, strict=True):
            assert list(ids) == want_ids  # the publisher's prompt, token for token
            assert got.shape == tuple(want.shape)
            worst = min(worst, *(_cos(a, b) for a, b in zip(got, want.numpy(), strict=True)))
        WORST[f"{name} {dtype}"] = worst
        print(f"ColQwen3 {name} {dtype}: worst per-token cosine {worst:.7f}")
        assert worst >= floor, (name, dtype, worst)
    assert model.info.embedding_dim == (16 if name == "opensearch" else 32 if name == "nemotron" else 320)


def test_nemotron_attends_both_ways(engine, tmp_path):
    """The first token of a query changes with the text after it (causal attention would leave it alone)."""
    folder = _variant(engine, tmp_path, "nemotron")
    rows, _, _ = _serve(folder, ["w1 w2", "w1 w3"])
    assert _cos(rows[0][0], rows[1][0]) < 0.9999


def test_opensearch_dimensions_cut_further(engine, tmp_path):
    folder = _variant(engine, tmp_path, "opensearch")
    model = load_model(WorkerConfig(model=str(folder), served_model_name="m"))
    params = PoolingParams(task="token_embed", dimensions=8)
    encoded = InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", ["w1 w2"], params))
    out = model.runner.execute(model.runner.prepare([Sequence(encoded.ids[0], params)]))
    rows = np.asarray(out[0].rows.item(0))
    assert rows.shape[1] == 8 and np.allclose(np.linalg.norm(rows, axis=1), 1.0, atol=1e-5)


def test_text_and_image_in_one_input_is_refused(engine):
    model = load_model(WorkerConfig(model=str(engine[1]), served_model_name="m"))
    both = MediaInput(("w1", _png(tiny.image(1, 40, 40))))
    with pytest.raises(InvalidRequest, match="not both"):
        InputStage(model.info, model.encoder).encode(PoolingCall("r", "m", [both], PoolingParams(task="token_embed")))


def test_a_missing_projection_or_tensor_is_refused(engine, tmp_path):
    saved, config = _tensors(engine[1]), json.loads((engine[1] / "config.json").read_text())
    _save(tmp_path / "noproj", {k: v for k, v in saved.items() if "custom_text_proj" not in k}, config)
    with pytest.raises(CheckpointError, match="no projection"):
        load_model(WorkerConfig(model=str(tmp_path / "noproj"), served_model_name="m"))
    _save(tmp_path / "partial", {k: v for k, v in saved.items() if "layers.1.mlp" not in k}, config)
    with pytest.raises(CheckpointError, match="missing tensors"):
        load_model(WorkerConfig(model=str(tmp_path / "partial"), served_model_name="m"))


def test_rerank_over_http_is_maxsim(engine):
    """``poolgate serve`` on colpali-engine's layout: /rerank of page images for a text query is MaxSim over the
    reference's token vectors (colpali-engine's ``score_multi_vector``: per query token the best page token, summed)."""
    import requests

    from tests.live_server import served_url

    expected = _expected(engine, "colpali-engine", engine[1])
    query = expected[0][1].numpy()
    maxsim = [float((query @ page.numpy().T).max(axis=1).sum()) for _, page in expected[len(QUERIES):]]
    documents = [{"content": [{"type": "image_url", "image_url": {"url": _png(tiny.image(seed, h, w)).url}}]}
                 for h, w, seed in PAGES]
    for url in served_url(engine[1], str(engine[1]), "--served-model-name", "colqwen3", "--dtype", "float32"):
        r = requests.post(f"{url}/rerank", json={"model": "colqwen3", "query": QUERIES[0], "documents": documents},
                          timeout=60)
        assert r.status_code == 200, r.text
        results = r.json()["results"]
        assert [x["index"] for x in results] == list(np.argsort(maxsim)[::-1])
        np.testing.assert_allclose([x["relevance_score"] for x in results], sorted(maxsim, reverse=True), rtol=1e-4,
                                   atol=1e-4)


def _qwen3_5_config():
    from transformers import Qwen3_5Config

    text = dict(vocab_size=200, hidden_size=32, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                head_dim=8, intermediate_size=64, linear_num_value_heads=4, linear_num_key_heads=2,
                linear_key_head_dim=8, linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 1, 1], "rope_theta": 10000.0,
                                 "partial_rotary_factor": 1.0})
    vision = dict(depth=2, hidden_size=32, num_heads=4, intermediate_size=64, out_hidden_size=32, patch_size=16,
                  spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=64)
    return Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=tiny.IMAGE_TOKEN, video_token_id=6,
                         vision_start_token_id=tiny.START, vision_end_token_id=tiny.END, architectures=["ColQwen3_5"])


def test_colqwen3_5_equals_colpali_engine(tmp_path):
    """colpali-engine's ColQwen3.5 (a Qwen3.5 backbone: linear-attention and full-attention layers) served padded,
    a sequence a row, against its own forward one input at a time."""
    module = _engine_module("qwen3_5/colqwen3_5/modeling_colqwen3_5.py")
    torch.manual_seed(0)
    model = module.ColQwen3_5(_qwen3_5_config()).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0) if p.dim() > 1 else None
    model.save_pretrained(tmp_path, safe_serialization=True)
    _save(tmp_path, _tensors(tmp_path), json.loads((tmp_path / "config.json").read_text()))
    # transformers reads a qwen3_5 folder with its Qwen3_5Tokenizer (byte-level BPE) whatever the file names: a
    # character vocabulary it can read, the vision tokens at the tiny config's ids
    from transformers import AutoTokenizer, Qwen3_5Tokenizer

    from poolgate.workers.tools.late_shapes import small_vocab

    specials = tiny.SPECIALS[:7]
    bpe = Qwen3_5Tokenizer(vocab=small_vocab(specials, "Ġ", "Ċ"), merges=[])
    bpe.add_special_tokens({"additional_special_tokens": specials[1:]})
    bpe.save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)  # as colpali-engine's processor loads it
    assert tok.convert_tokens_to_ids("<|image_pad|>") == tiny.IMAGE_TOKEN and len(tok) <= 200
    strings = _engine_strings("qwen3_5/colqwen3_5/processing_colqwen3_5.py")
    texts = [strings["query_prefix"] + q + strings["query_augmentation_token"] * 10 for q in QUERIES]
    cases = [_reference_inputs(t, [], tok=tok) for t in texts]
    cases += [_reference_inputs(strings["visual_prompt_prefix"], [tiny.image(seed, h, w)], tok=tok)
              for h, w, seed in PAGES]
    with torch.no_grad():
        want = []
        for ids, input_ids, kwargs in cases:
            if "pixel_values" in kwargs:
                kwargs = {**kwargs, "pixel_values": kwargs["pixel_values"][None]}
            want.append((ids, model(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)[0]))
    with torch.no_grad():  # colpali-engine's own forward in bf16 too: on this tiny model bf16 alone moves the
        half = model.to(torch.bfloat16)  # linear-attention recurrence's vectors to ~0.96, so bf16 is checked against it
        want_bf16 = []
        for ids, input_ids, kwargs in cases:
            if "pixel_values" in kwargs:
                kwargs = {**kwargs, "pixel_values": kwargs["pixel_values"][None].bfloat16()}
            got = half(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)[0].float()
            want_bf16.append((ids, got))
    for dtype, floor, reference in (("float32", 0.9999, want), ("bfloat16", 0.99, want_bf16)):
        rows, encoded, served = _serve(tmp_path, _inputs(), dtype)
        assert served.info.embedding_dim == 128
        worst = 1.0
        for got, ids, (want_ids, vec) in zip(rows, encoded.ids, reference, strict=True):
            assert list(ids) == want_ids
            worst = min(worst, *(_cos(a, b) for a, b in zip(got, vec.numpy(), strict=True)))
        WORST[f"colqwen3.5 {dtype}"] = worst
        print(f"ColQwen3.5 {dtype}: worst per-token cosine to colpali-engine in {dtype} {worst:.7f}")
        assert worst >= floor, (dtype, worst)


@pytest.mark.parametrize("name", ["tomoro", "nemotron"])
def test_verify_checks_colqwen3(engine, tmp_path, name):
    """``poolgate verify``'s ColQwen3 checks (workers.tools.verify_colqwen3): probe queries and pages, every token."""
    from poolgate.workers.tools.verify_media import verify_media

    folder = _variant(engine, tmp_path, name)
    checks, skipped = verify_media(load_model(WorkerConfig(model=str(folder), served_model_name="m")), str(folder))
    assert [c.task for c in checks] == ["token_embed query", "token_embed page"] and not skipped
    assert all(c.passes(0.9999) for c in checks), [c.line() for c in checks]


def test_inspect_names_each_layouts_path(engine, tmp_path):
    from poolgate.workers.load.inspect import plan

    nemotron = plan(WorkerConfig(model=str(_variant(engine, tmp_path, "nemotron")), served_model_name="m"))
    assert "no projection" in nemotron.implementation and "both ways (a block mask)" in nemotron.attention
    colpali = plan(WorkerConfig(model=str(engine[1]), served_model_name="m"))
    assert "custom_text_proj" in colpali.implementation
    assert colpali.attention.startswith("transformers' own over packed")
    assert "token_embed" in colpali.pooling


def test_late_shapes_writes_a_servable_colqwen3(tmp_path):
    """``python -m poolgate.workers.tools.late_shapes DIR --family colqwen3``'s writer (tiny widths here): TomoroAI's
    layout, served whole: a ``dim``-wide vector per token of a query and of a page."""
    from poolgate.workers.tools.late_shapes import write_colqwen3

    write_colqwen3(tmp_path, hidden=32, intermediate=64, layers=2, heads=4, kv_heads=2, vision_dim=32, vision_depth=2,
                   vision_heads=4, vision_intermediate=64, dim=24, mrope=[24, 20, 20])
    rows, encoded, model = _serve(tmp_path, ["what is the revenue", MediaInput((_png(tiny.image(1, 64, 96)),))])
    assert model.info.architecture == "ColQwen3" and model.info.embedding_dim == 24
    assert [r.shape for r in rows] == [(len(ids), 24) for ids in encoded.ids]
