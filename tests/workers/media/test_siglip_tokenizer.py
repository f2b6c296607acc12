"""SigLIP (v1) checkpoints with only a SentencePiece ``spiece.model``: the fast tokenizer poolgate builds encodes as
transformers' slow ``SiglipTokenizer``, and such a folder serves text vectors equal to transformers'."""
import json
import random

import pytest
import torch

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.siglip_tokenizer import siglip_tokenizer
from tests.workers.media.dual_encoders import TEXT_LEN, make_dual
from tests.workers.media.test_dual_encoders import embed

spm = pytest.importorskip("sentencepiece")
WORDS = ["photo", "cat", "dog", "a", "of", "the", "two", "red", "blue", "car", "on", "street", "in", "image",
         "zürich", "naïve", "café", "über", "são", "paulo", "東京", "москва"]
TEXTS = ["A photo of two cats!!  On the  street.", "hello", "  leading spaces", "trailing   ", "!!!", "",
         "Zürich, München, São Paulo", "東京は日本の首都です。", "Москва — столица России.", "tabs\tand\nnew lines",
         "12345 67890 !!! ??? ... --- ###", "CAFÉ naïve Über", "a-b_c d.e", "x\u3000y\u00a0z", "ﬁ ligature ①",
         "Don't stop", "▁under▁score"]


def spiece(folder, tmp_path) -> None:
    """A small Unigram SentencePiece model, trained here (nmt_nfkc, as SigLIP's), as the folder's spiece.model."""
    rng = random.Random(0)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 9))) for _ in range(3000)))
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(folder / "spiece"), vocab_size=80,
                                   model_type="unigram", normalization_rule_name="nmt_nfkc", pad_id=0, eos_id=1,
                                   unk_id=2, bos_id=-1, pad_piece="<pad>", eos_piece="</s>", unk_piece="<unk>",
                                   minloglevel=2, hard_vocab_limit=False)
    (folder / "spiece.vocab").unlink()


def test_encodes_as_the_slow_tokenizer(tmp_path):
    from transformers import SiglipTokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    spiece(folder, tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "SiglipTokenizer"}))
    slow, fast = SiglipTokenizer(str(folder / "spiece.model")), siglip_tokenizer(folder)
    rng = random.Random(1)
    chars = "abcdefghij XYZ.,!?-'éü東京\t\n  ①ﬁ▁"
    texts = TEXTS + ["".join(rng.choice(chars) for _ in range(rng.randint(0, 40))) for _ in range(300)]
    for text in texts:
        assert fast(text)["input_ids"] == slow(text)["input_ids"], text


async def test_a_spiece_only_siglip_serves_transformers_vectors(tmp_path):
    from transformers import SiglipTokenizer

    folder = tmp_path / "siglip"
    folder.mkdir()
    ref = make_dual(folder, "siglip")
    for name in ("tokenizer.json", "special_tokens_map.json", "vocab.txt"):
        (folder / name).unlink(missing_ok=True)
    spiece(folder, tmp_path)
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "SiglipTokenizer", "model_max_length": TEXT_LEN["siglip"], "pad_token": "</s>"}))
    model = load_model(WorkerConfig(model=str(folder), served_model_name="t", dtype="float32"))
    texts = ["A photo of two cats!", "café on the street", "東京"]
    got = (await embed(model, texts)).outputs.values
    slow = SiglipTokenizer(str(folder / "spiece.model"), model_max_length=TEXT_LEN["siglip"])
    ids = slow(texts, padding="max_length", truncation=True, max_length=TEXT_LEN["siglip"], return_tensors="pt")
    with torch.no_grad():  # SigLIP's texts padded to their length, every token attended, as trained
        out = ref.get_text_features(input_ids=ids["input_ids"])
    want = torch.nn.functional.normalize(getattr(out, "pooler_output", out), dim=-1).numpy()
    assert float((got * want).sum(-1).min()) >= 0.9999

