"""The offline API (``workers.offline``) against sentence-transformers, transformers and the fake runner."""
import gc
import subprocess
import sys
import textwrap
import threading
import time

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

from poolgate.shared.domain.errors import ContextLengthExceeded, InvalidRequest, Unavailable
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.scoring import maxsim
from poolgate.workers.offline import LLM, PoolingModel, offline_config
from tests.fakes import expected_output, expected_vector, fake_model, make_tiny_tokenizer

TEXTS = ["a", "Hello world!", "The quick brown fox jumps over the lazy dog.",
         "Zürich, São Paulo and Kraków are cities; 東京 is Tokyo.", "x " * 120]
LABELS = {0: "negative", 1: "neutral", 2: "positive"}
WORDS = ["w1 w2 w3", "w40", "w7 w8 w9 w10 w11 w12 w13"]


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def minilm():
    from sentence_transformers import SentenceTransformer

    with PoolingModel(dtype="float32", max_batch_tokens=512) as model:
        yield model, SentenceTransformer(str(bundled_model_path()), device="cpu")


def _classifier(folder, num_labels: int):
    """A tiny random BertForSequenceClassification saved in ``folder`` (labels named when there are 3)."""
    names = {"id2label": LABELS, "label2id": {v: k for k, v in LABELS.items()}} if num_labels == 3 else {}
    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=64, pad_token_id=0,
                                  num_labels=num_labels, **names)
    torch.manual_seed(0)
    ref = AutoModelForSequenceClassification.from_config(config).eval()
    ref.save_pretrained(folder, safe_serialization=True)
    make_tiny_tokenizer(folder)
    return ref


def _new_threads(before: set[threading.Thread], wait_s: float = 5.0) -> list[threading.Thread]:
    """Threads started since ``before`` that are still alive after up to ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while (left := [t for t in threading.enumerate() if t not in before]) and time.monotonic() < deadline:
        time.sleep(0.01)
    return left


def test_embed_matches_sentence_transformers(minilm):
    model, st = minilm
    got = model.embed(TEXTS)
    want = st.encode(TEXTS, convert_to_numpy=True)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    assert min(_cos(g, w) for g, w in zip(got, want)) >= 0.9999
    assert LLM is PoolingModel and model.info.tasks[0] == "embed" and model.labels is None


def test_batched_equals_single(minilm):
    model, st = minilm
    together = model.embed(TEXTS)
    for text, vec in zip(TEXTS, together):
        alone = model.embed(text)  # one string is a list of one
        assert alone.shape == (1, 384) and _cos(alone[0], vec) >= 0.99999
    ids = st.tokenizer(TEXTS[1])["input_ids"]
    np.testing.assert_allclose(model.embed(ids), together[1:2], atol=1e-6)  # one token-id list is one input


def test_errors_are_typed_with_vllms_messages(minilm):
    model, st = minilm
    with pytest.raises(InvalidRequest, match="does not support Matryoshka"):
        model.embed("hi", dimensions=8)
    with pytest.raises(ContextLengthExceeded, match="maximum context length is 256 tokens"):
        model.embed(["short", "word " * 400])
    truncated = model.embed("word " * 400, truncate_prompt_tokens=-1)
    assert _cos(truncated[0], st.encode(["word " * 400])[0]) >= 0.9999
    with pytest.raises(InvalidRequest, match="Unsupported task: 'classify'"):  # vLLM's 400
        model.classify("hi")
    with pytest.raises(InvalidRequest, match="needs pooling_task"):
        model.encode("hi")
    with pytest.raises(InvalidRequest, match="`score` task was removed"):
        model.encode("hi", pooling_task="score")


async def test_sync_methods_work_inside_a_running_event_loop(minilm):
    model, st = minilm
    got = model.embed(TEXTS[:2])  # blocks this loop while the model's own loop runs the engine
    assert min(_cos(g, w) for g, w in zip(got, st.encode(TEXTS[:2]))) >= 0.9999


def test_encode_token_embed_gives_one_vector_per_token(minilm):
    model, st = minilm
    outputs = model.encode(TEXTS[:3], pooling_task="token_embed")
    lengths = [len(x) for x in st.tokenizer(TEXTS[:3])["input_ids"]]
    assert [o.shape for o in outputs] == [(n, 384) for n in lengths]
    np.testing.assert_allclose(np.linalg.norm(outputs[2], axis=1), 1.0, atol=1e-5)
    embedded = model.encode(TEXTS[:3], pooling_task="embed")
    assert [e.shape for e in embedded] == [(384,)] * 3
    np.testing.assert_allclose(np.stack(embedded), model.embed(TEXTS[:3]), atol=1e-6)


def test_submit_answers_the_outputs_with_each_inputs_token_count(minilm):
    model, st = minilm
    result = model.submit(TEXTS, PoolingParams(task="embed", truncate_prompt_tokens=16))
    assert result.prompt_tokens == [min(len(ids), 16) for ids in st.tokenizer(TEXTS)["input_ids"]]
    np.testing.assert_allclose(result.outputs.values[:4], model.embed(TEXTS[:4]), atol=1e-6)


def test_bi_encoder_score_is_the_cosine_of_embeddings(minilm):
    model, _ = minilm
    query, docs = "What is the capital of France?", ["Paris is the capital of France.", "Bananas are yellow."]
    vectors = model.embed([query, *docs])
    one_to_n = model.score(query, docs)
    assert one_to_n.shape == (2,) and one_to_n[0] > one_to_n[1]
    np.testing.assert_allclose(one_to_n, [_cos(vectors[0], v) for v in vectors[1:]], atol=1e-6)
    pairwise = model.score([query, docs[1]], docs)  # N:N pairs by index
    np.testing.assert_allclose(pairwise, [one_to_n[0], 1.0], atol=1e-5)
    with pytest.raises(InvalidRequest, match="Input lengths must be either 1:1, 1:N or N:N"):
        model.score([query, query], [*docs, "c"])
    with pytest.raises(InvalidRequest, match="At least one text_pair element"):
        model.score(query, [])


def test_score_caps_each_side_as_the_score_routes_do(minilm):
    model, st = minilm
    doc = TEXTS[2]
    offsets = st.tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    cut = doc[:offsets[2][1]]  # its first 3 content tokens
    np.testing.assert_allclose(model.score("fox", doc, max_tokens_per_doc=3), model.score("fox", cut), rtol=1e-6)
    assert model.score("fox", doc, max_tokens_per_doc=3)[0] != pytest.approx(model.score("fox", doc)[0])
    with pytest.raises(InvalidRequest, match=r"max_tokens_per_doc \(256\) must be less than max_model_len"):
        model.score("fox", doc, max_tokens_per_doc=256)


def test_classify_matches_transformers_and_names_labels(tmp_path):
    ref = _classifier(tmp_path, 3)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    with torch.no_grad():
        logits = torch.cat([ref(**tokenizer(text, return_tensors="pt")).logits for text in WORDS])  # (n, 3)
    before = set(threading.enumerate())
    with PoolingModel(str(tmp_path), dtype="float32", max_batch_tokens=256) as model:
        assert model.labels == ("negative", "neutral", "positive")
        np.testing.assert_allclose(model.classify(WORDS), torch.softmax(logits, -1).numpy(), atol=1e-5)
        np.testing.assert_allclose(model.classify(WORDS, use_activation=False), logits.numpy(), atol=1e-4)
        tokens = model.encode(WORDS, pooling_task="token_classify")
        assert [t.shape for t in tokens] == [(5, 3), (3, 3), (9, 3)]
        with pytest.raises(InvalidRequest, match=r"only enabled for num_labels == 1"):
            model.score("w1", "w2")
    assert not _new_threads(before)


def test_cross_encoder_score_is_one_forward_per_pair(tmp_path):
    from transformers import AutoTokenizer

    ref = _classifier(tmp_path, 1)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    with PoolingModel(str(tmp_path), dtype="float32") as model:
        got = model.score("w1 w7", ["w2", "w3 w4 w5"])
        with torch.no_grad():
            batch = tokenizer(["w1 w7", "w1 w7"], text_pair=["w2", "w3 w4 w5"], padding=True, return_tensors="pt")
            want = torch.sigmoid(ref(**batch).logits[:, 0]).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
        pairwise = model.score(["w1", "w2"], ["w3", "w4"])  # N:N by index
        assert pairwise.shape == (2,)
        with pytest.raises(InvalidRequest, match="pass the queries and documents as strings"):
            model.score([[2, 5, 3]], ["w1"])


def test_late_interaction_score_is_maxsim_of_token_vectors():
    with PoolingModel.from_loaded(fake_model(tasks=("token_embed",))) as model:
        docs = ["alpha beta", "gamma", "alpha delta epsilon"]
        q = model.encode("alpha zeta", pooling_task="token_embed")[0]
        d = model.encode(docs, pooling_task="token_embed")
        np.testing.assert_allclose(model.score("alpha zeta", docs), [maxsim(q, x) for x in d], rtol=1e-6)
    a, b = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]])
    assert maxsim(a, b) == pytest.approx(1.0 + 0.8)


def test_calls_from_many_threads_share_the_engine():
    with PoolingModel.from_loaded(fake_model(dim=8)) as model:
        texts = [f"text number {i}" for i in range(16)]
        results: dict[int, np.ndarray] = {}
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, model.embed(texts[i])))
                   for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for i, text in enumerate(texts):
            np.testing.assert_allclose(results[i][0], expected_vector(text), rtol=1e-6)
        np.testing.assert_allclose(model.encode(["x y"], pooling_task="embed")[0], expected_output("x y"),
                                   rtol=1e-6)


def test_close_stops_every_thread_and_refuses_more_work():
    before = set(threading.enumerate())
    model = PoolingModel.from_loaded(fake_model())
    model.embed(["a b", "c"])
    assert _new_threads(before, wait_s=0)  # the loop, prepare, execute and tokenizer threads
    model.close()
    model.close()  # twice is fine
    assert not _new_threads(before)
    assert "closed" in repr(model)
    with pytest.raises(Unavailable, match="closed"):
        model.embed("a")


def test_a_model_nobody_holds_shuts_itself_down():
    before = set(threading.enumerate())
    model = PoolingModel.from_loaded(fake_model())
    model.embed("a")
    del model
    gc.collect()
    assert not _new_threads(before)


EXIT_SCRIPT = textwrap.dedent("""
    from poolgate.workers.offline import PoolingModel
    from tests.fakes import fake_model

    kept = PoolingModel.from_loaded(fake_model())  # never closed: interpreter exit closes it
    assert kept.embed(["a b"]).shape == (1, 8)
    with PoolingModel.from_loaded(fake_model()) as model:
        assert model.embed("c").shape == (1, 8)
    model.close()  # already closed by the with block: a no-op
    print("done")
""")


def test_a_script_that_never_closes_its_model_exits_cleanly():
    """Interpreter exit closes open models before the executors stop: exit 0, nothing on stderr."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=120)
    assert (proc.returncode, proc.stderr, proc.stdout) == (0, "", "done\n")


def test_pooler_flags_fold_into_the_pooler_config_as_on_the_command_line(minilm):
    model, _ = minilm
    cfg = offline_config(None, {"pooling_type": "cls", "normalize": False, "dtype": "float32"})
    assert cfg.pooler_config == PoolerConfig(seq_pooling_type="CLS", use_activation=False) and cfg.dtype == "float32"
    assert offline_config(None, {"pooler_config": {"use_activation": False}}).pooler_config.use_activation is False
    with pytest.raises(ValueError, match="both given"):
        offline_config(None, {"pooler_config": {"pooling_type": "MEAN"}, "pooling_type": "CLS"})
    with PoolingModel(dtype="float32", pooling_type="CLS", normalize=False) as cls_model:
        raw_tokens = model.encode(TEXTS[:2], pooling_task="token_embed", use_activation=False)
        np.testing.assert_allclose(cls_model.embed(TEXTS[:2]), [t[0] for t in raw_tokens], atol=1e-5)


def test_flags_are_checked_at_the_edge():
    with pytest.raises(TypeError, match="unknown flag"):
        PoolingModel(dtpye="float32")
    with pytest.raises(ValueError, match="dtype must be one of"):
        PoolingModel(dtype="fp16")
    with pytest.raises(ValueError, match="max_batch_tokens must be a positive integer"):
        PoolingModel(max_batch_tokens=0)
    with pytest.raises(ValueError, match="batch_policy must be one of fair, fifo"):  # every declared setting's check
        PoolingModel(batch_policy="lifo")
    with pytest.raises(ValueError, match="max_tokens_per_request must be a positive integer"):
        PoolingModel(max_tokens_per_request=0)
    with pytest.raises(FileNotFoundError):
        PoolingModel("/no/such/model")


def test_a_bert_pair_carries_its_token_type_ids(tmp_path):
    from poolgate.shared.wire.messages import TextPair
    from poolgate.workers.load.hf_tokenizer import load_encoder
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "a", "b"]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]",
                            sep_token="[SEP]").save_pretrained(tmp_path)
    encoded = load_encoder(tmp_path).encode_pairs([TextPair("a", "b b"), TextPair("a a b", "b", max_text_tokens=1)])
    assert encoded.ids == [[2, 4, 3, 5, 5, 3], [2, 4, 3, 5, 3]]
    assert encoded.type_ids == [[0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1]]
