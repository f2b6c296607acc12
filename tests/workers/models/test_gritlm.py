"""GritLM (``GritLM``) served by the packed Llama, against transformers' LlamaModel without the causal mask and a
masked mean written here: the fp32 mean of the final states after the instruction (``<|embed|>`` + newline),
normalized. A tiny random LlamaForCausalLM saved as GritLM ships it (``model.*`` and ``lm_head``), with a
word-level tokenizer that has ``<s>``, ``<|user|>``, ``<|embed|>`` and a newline token."""
from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.backends.cpu import CpuBackend
from poolgate.workers.load.build import load_model
from poolgate.workers.load.inspect import plan
from poolgate.workers.pooling.gritlm import NO_BOS, NO_MARKER, instruction_length, marker_patterns
from tests.workers.models.test_decoder_golden import save_tiny
from tests.workers.pooled import pool_ids, pool_texts

SPECIALS = ["<pad>", "<unk>", "<s>", "</s>", "<|user|>", "<|embed|>", "\n"]
BOS, USER, EMBED, NL = 2, 4, 5, 6
# text → how many leading tokens are its instruction (after the tokenizer adds <s>)
TEXTS = {"<|user|>\nw1 w2 w3\n<|embed|>\nw4 w5 w6 w7": 9, "<|embed|>\nw8 w9": 3, "w10 w11 w12": 1,
         "<|user|>\nw13\n<|embed|>\n" + " ".join(f"w{i}" for i in range(20, 60)): 7}


def make_grit_tokenizer(folder) -> None:
    """Word-level: words split on spaces, each newline its own token; ``<s>`` prepended."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(100 - len(SPECIALS))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(" +"), "removed"),
                                                 pre_tokenizers.Split("\n", "isolated")])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(folder)


def save_gritlm(folder):
    """The tiny GritLM checkpoint; returns transformers' LlamaModel of it without the causal mask."""
    ref = save_tiny(folder, "llama", "GritLM", auto=AutoModelForCausalLM, is_causal=False)
    config = json.loads((folder / "config.json").read_text())
    config.pop("is_causal", None)  # GritLM's config says nothing: the architecture name makes it bidirectional
    (folder / "config.json").write_text(json.dumps({**config, "architectures": ["GritLM"]}))
    make_grit_tokenizer(folder)
    return ref.model


def _load(folder, **pooler):
    return load_model(WorkerConfig(model=str(folder), served_model_name="grit", dtype="float32",
                                   max_batch_tokens=1024, pooler_config=PoolerConfig(**pooler)))


def reference(ref, ids: list[list[int]], skips: list[int]) -> np.ndarray:
    with torch.no_grad():
        states = [ref(input_ids=torch.tensor([s])).last_hidden_state[0] for s in ids]  # (len, hidden) each
        rows = [h[k:].float().mean(0) for h, k in zip(states, skips, strict=True)]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


def test_embed_is_the_bidirectional_mean_after_the_instruction(tmp_path, caplog):
    ref = save_gritlm(tmp_path)
    model = _load(tmp_path)
    assert model.info.tasks == ("embed", "token_embed") and model.runner.model.__class__.__name__ == "PackedDecoder"
    assert not model.runner.model.config.causal
    with caplog.at_level(logging.WARNING, logger="poolgate.workers.pooling.gritlm"):
        got, ids = pool_texts(model, list(TEXTS))
    assert ids[0][:3] == [BOS, USER, NL] and ids[0][6:9] == [NL, EMBED, NL]
    want = reference(ref, ids, list(TEXTS.values()))
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.9999 and np.abs(got - want).max() < 1e-5, (cos.min(), np.abs(got - want).max())
    assert [r.message for r in caplog.records if NO_MARKER in r.message][-1].endswith("so far)")


def test_the_instruction_and_the_causal_mask_are_what_decides(tmp_path):
    """The golden test can fail: the mean over every token, or a causal forward, disagrees."""
    ref = save_gritlm(tmp_path)
    got, ids = pool_texts(_load(tmp_path), list(TEXTS)[:1])
    assert np.abs(got - reference(ref, ids, [0])).max() > 1e-3
    ref.config.is_causal = True
    assert np.abs(got - reference(ref, ids, [9])).max() > 1e-3


def test_without_bos_nothing_is_left_out_and_it_warns_at_powers_of_ten(tmp_path, caplog):
    ref = save_gritlm(tmp_path)
    model = _load(tmp_path)
    ids = [[EMBED, NL, 10, 11], [USER, NL, 12, NL, EMBED, NL, 13]]
    with caplog.at_level(logging.WARNING, logger="poolgate.workers.pooling.gritlm"):
        got = pool_ids(model, ids)
        for _ in range(5):
            pool_ids(model, ids)
    np.testing.assert_allclose(got, reference(ref, ids, [0, 0]), atol=1e-5)
    assert [r.message for r in caplog.records if NO_BOS in r.message] == [
        f"GritLM: {NO_BOS} (1 prompt so far)", f"GritLM: {NO_BOS} (10 prompts so far)"]


@pytest.mark.parametrize("ids, want", [
    ([BOS, USER, NL, 10, NL, EMBED, NL, 11], 7), ([BOS, EMBED, NL, 11], 3), ([BOS, 10, 11], 1),
    ([BOS, EMBED, NL], 3), ([BOS], 1), ([10, EMBED, NL], 0),
    ([BOS, EMBED, NL, 12, EMBED, NL, 13], 3),  # the first marker ends the instruction
])
def test_instruction_length(ids, want):
    patterns = ((EMBED, NL), (NL, EMBED, NL))
    assert instruction_length(np.asarray(ids), BOS, patterns)[0] == want


def test_a_prompt_that_is_all_instruction_pools_to_zeros(tmp_path):
    save_gritlm(tmp_path)
    got = pool_ids(_load(tmp_path), [[BOS, EMBED, NL], [BOS, EMBED, NL, 20]])
    assert not got[0].any() and abs(np.linalg.norm(got[1]) - 1) < 1e-5


@pytest.mark.parametrize("pooler, match", [
    ({"pooling_type": "LAST"}, "GritLM pools embed with MEAN after its instruction"),
    ({"enable_chunked_processing": True}, "after its instruction, which a later chunk does not have"),
])
def test_what_it_cannot_honour_is_refused(tmp_path, pooler, match):
    save_gritlm(tmp_path)
    with pytest.raises(ValueError, match=match):
        _load(tmp_path, **pooler)


def test_inspect_says_how_it_runs(tmp_path):
    save_gritlm(tmp_path)
    p = plan(WorkerConfig(model=str(tmp_path), served_model_name="grit"), CpuBackend())
    assert p.implementation == "packed llama" and p.tasks == "embed, token_embed (served as embed)"
    assert p.attention.endswith("; bidirectional") and p.pooling.startswith("GritLM: embed fp32 MEAN")


def _sentencepiece_like():
    """A byte-fallback BPE with a Metaspace prefix, as Llama / Mistral tokenizers (GritLM-7B's) spell text:
    ``<|embed|>`` is five pieces, ``▁<`` at a text's start and ``<`` after a newline (``<0x0A>``)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    merges = [("▁", "<"), ("e", "m"), ("em", "b"), ("emb", "e"), ("embe", "d"), ("▁", "a"), ("u", "s"), ("us", "e"),
              ("use", "r")]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "<0x0A>", "▁", *"<|>abdemrsu"])}
    vocab |= {a + b: len(vocab) + i for i, (a, b) in enumerate(merges)}
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>"), vocab


def test_both_sentencepiece_spellings_of_the_marker_are_found():
    tokenizer, vocab = _sentencepiece_like()
    pieces = {i: w for w, i in vocab.items()}
    patterns = marker_patterns(tokenizer)
    assert [[pieces[i] for i in p] for p in patterns] == [["▁<", "|", "embed", "|", ">", "<0x0A>"],
                                                          ["<0x0A>", "<", "|", "embed", "|", ">", "<0x0A>"]]
    for text, want in (("<|user|>\na\n<|embed|>\nab", 15), ("<|embed|>\nab", 7)):
        ids = np.asarray(tokenizer(text)["input_ids"])
        assert instruction_length(ids, tokenizer.bos_token_id, patterns) == (want, None)
        assert [pieces[i] for i in ids[want:]] == ["a", "b"]


def test_a_mistral_body_runs_without_its_sliding_window(tmp_path):
    """GritLM-7B is a Mistral: served as GritLM (``--hf-overrides``) its window is off, as vLLM turns it off. The
    reference is LlamaModel on its weights (transformers' MistralModel has no ``is_causal`` switch; without a window
    a Mistral block is a Llama block)."""
    from transformers import AutoConfig, LlamaModel

    save_tiny(tmp_path, "mistral", "GritLM", auto=AutoModelForCausalLM, sliding_window=4)
    make_grit_tokenizer(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    config = AutoConfig.for_model("llama", is_causal=False,
                                  **{k: v for k, v in saved.items() if k not in ("model_type", "sliding_window")})
    ref = LlamaModel.from_pretrained(str(tmp_path), config=config, attn_implementation="eager").eval()
    model = load_model(WorkerConfig(model=str(tmp_path), served_model_name="grit", dtype="float32",
                                    hf_overrides={"architectures": ["GritLM"]}))
    assert model.runner.model.config.windows == (None,) * 3 and not model.runner.model.config.causal
    got, ids = pool_texts(model, list(TEXTS))
    np.testing.assert_allclose(got, reference(ref, ids, list(TEXTS.values())), atol=1e-5)
