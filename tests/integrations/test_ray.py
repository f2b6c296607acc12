"""Ray Data (``integrations.ray``): the callable class on its own, then ``map_batches`` on a local Ray cluster."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
from transformers import AutoConfig, AutoModelForSequenceClassification

from poolgate.integrations.ray import PoolingUDF, check_options
from poolgate.shared.domain.corpus import synthetic_corpus
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.offline import PoolingModel
from tests.fakes import make_tiny_cross_encoder, save_random

LABELS = {0: "negative", 1: "neutral", 2: "positive"}
WORDS = ["w1 w2 w3", "w40", "w7 w8 w9 w10 w11 w12 w13", "w5 w5 w90 w3 w2"]
TEXTS = synthetic_corpus(300, seed=3)  # random English words, ~85 tokens each; a few over MiniLM's 256
# through Ray: 1 to 40 words, and every 50th text whole (some over 256 tokens, so truncated)
RAY_TEXTS = [t if i % 50 == 0 else " ".join(t.split()[: 1 + i % 40]) for i, t in enumerate(TEXTS)]


def _cos(a, b):
    return np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def minilm():
    """A PoolingUDF on the bundled all-MiniLM-L6-v2 (float32), and a separate PoolingModel as the reference."""
    udf = PoolingUDF(dtype="float32", truncate_prompt_tokens=-1)
    with PoolingModel(dtype="float32") as reference:
        yield udf, reference
    udf.model.close()


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny random 3-label BertForSequenceClassification with named labels."""
    folder = tmp_path_factory.mktemp("classifier")
    config = AutoConfig.for_model(
        "bert",
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
        num_labels=3,
        id2label=LABELS,
        label2id={v: k for k, v in LABELS.items()},
    )
    save_random(folder, AutoModelForSequenceClassification, config)
    return str(folder)


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross_encoder")
    make_tiny_cross_encoder(folder)
    return str(folder)


def test_importing_the_integration_loads_neither_ray_nor_torch(tmp_path):
    code = "import sys, poolgate.integrations.ray\nassert not {'ray', 'torch'} & set(sys.modules), sys.modules.keys()"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


def test_a_numpy_batch_gets_the_offline_vectors_and_token_counts(minilm):
    udf, reference = minilm
    texts = TEXTS[:100]
    batch = {"id": np.arange(len(texts)), "text": np.asarray(texts, dtype=object)}
    out = udf(batch)
    assert list(out) == ["id", "text", "embeddings", "num_input_tokens"] and out["id"] is batch["id"]
    assert out["embeddings"].shape == (len(texts), 384) and out["embeddings"].dtype == np.float32
    want = reference.embed(texts, truncate_prompt_tokens=-1)
    assert _cos(out["embeddings"], want).min() >= 1 - 1e-5
    lengths = [len(ids) for ids in reference_tokenizer()(texts)["input_ids"]]
    assert max(lengths) > 256  # so the counts below show truncation
    np.testing.assert_array_equal(out["num_input_tokens"], np.minimum(lengths, 256))


def reference_tokenizer():
    from transformers import AutoTokenizer

    from poolgate.shared.config.models import bundled_model_path

    return AutoTokenizer.from_pretrained(str(bundled_model_path()))


def test_pandas_and_arrow_batches_get_the_same_vectors(minilm):
    pd = pytest.importorskip("pandas", reason="pandas comes with the ray extra")
    pa = pytest.importorskip("pyarrow", reason="pyarrow comes with the ray extra")
    udf, _ = minilm
    texts = TEXTS[:40]
    want = udf({"text": np.asarray(texts, dtype=object)})["embeddings"]
    frame = udf(pd.DataFrame({"text": texts}))
    np.testing.assert_allclose(np.stack(frame["embeddings"].to_list()), want, atol=1e-6)
    table = udf(pa.table({"text": texts, "embeddings": [0] * len(texts)}))  # an output column is replaced
    assert table.column_names == ["text", "embeddings", "num_input_tokens"]
    assert table.schema.field("embeddings").type == pa.list_(pa.float32(), 384)
    np.testing.assert_allclose(np.stack(table.column("embeddings").to_numpy(zero_copy_only=False)), want, atol=1e-6)


def test_an_empty_batch_gets_empty_columns_of_the_right_shape(minilm):
    out = minilm[0]({"text": np.asarray([], dtype=object)})
    assert out["embeddings"].shape == (0, 384) and out["num_input_tokens"].shape == (0,)


def test_options_and_columns_are_checked(minilm, classifier, cross_encoder):
    udf, _ = minilm
    with pytest.raises(KeyError, match="no column 'text' .it has body"):
        udf({"body": np.asarray(["a"], dtype=object)})
    with pytest.raises(ValueError, match="column 'text' must hold one text .or token-id list. per row"):
        udf({"text": np.arange(3)})
    with pytest.raises(ValueError, match="task must be one of embed, classify, score"):
        check_options("rerank", {})
    with pytest.raises(ValueError, match="dimensions does not apply to task 'classify'"):
        check_options("classify", {"dimensions": 8, "num_input_tokens": None})
    with pytest.raises(ValueError, match="num_input_tokens does not apply to task 'score'"):
        PoolingUDF(cross_encoder, task="score", num_input_tokens=True)
    with pytest.raises(ValueError, match="does not serve 'classify' .it serves embed, token_embed"):
        PoolingUDF(task="classify", dtype="float32")
    with pytest.raises(InvalidRequest, match="Scoring API is only enabled for num_labels == 1"):
        PoolingUDF(classifier, task="score")
    with pytest.raises(TypeError, match="unknown flag"):
        PoolingUDF(cross_encoder, task="score", dtypes="float32")


def test_classify_gives_probabilities_and_the_top_label(classifier):
    udf = PoolingUDF(classifier, task="classify", label_column="label", dtype="float32", output_column="p")
    with PoolingModel(classifier, dtype="float32") as reference:
        want = reference.classify(WORDS)
    out = udf({"text": np.asarray(WORDS, dtype=object)})
    np.testing.assert_allclose(out["p"], want, atol=1e-6)
    assert udf.labels == ("negative", "neutral", "positive")
    assert list(out["label"]) == [LABELS[i] for i in want.argmax(axis=1)]
    np.testing.assert_array_equal(out["num_input_tokens"], [5, 3, 9, 7])
    udf.model.close()


def test_a_label_column_needs_a_model_that_names_its_labels(classifier, tmp_path):
    unnamed = tmp_path / "unnamed"
    shutil.copytree(classifier, unnamed)
    config = json.loads((unnamed / "config.json").read_text())
    del config["id2label"], config["label2id"]
    (unnamed / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="label_column='label': this model names no labels"):
        PoolingUDF(str(unnamed), task="classify", label_column="label")
    assert PoolingUDF(str(unnamed), task="classify").labels is None  # probabilities without names still work


def test_score_reads_one_pair_per_row(cross_encoder):
    udf = PoolingUDF(cross_encoder, task="score", dtype="float32")
    queries, docs = WORDS, WORDS[::-1]
    with PoolingModel(cross_encoder, dtype="float32") as reference:
        want = reference.score(queries, docs)
    out = udf({"query": np.asarray(queries, dtype=object), "document": np.asarray(docs, dtype=object)})
    assert list(out) == ["query", "document", "score"] and len(set(out["score"].tolist())) == 4
    np.testing.assert_allclose(out["score"], want, atol=1e-6)
    udf.model.close()


# ---- on a local Ray cluster ----


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="ray is not installed (pip install 'poolgate[ray]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def test_map_batches_kwargs_builds_an_actor_pool_with_threads_per_actor():
    pytest.importorskip("ray", reason="ray is not installed (pip install 'poolgate[ray]')")
    from poolgate.integrations.ray import map_batches_kwargs

    kwargs = map_batches_kwargs("m", concurrency=(1, 4), num_cpus=2, batch_size=64, dtype="float32")
    assert kwargs["fn"] is PoolingUDF and kwargs["num_cpus"] == 2 and "num_gpus" not in kwargs
    assert kwargs["fn_constructor_kwargs"] == {"model": "m", "dtype": "float32", "num_threads": 2}
    assert (kwargs["compute"].min_size, kwargs["compute"].max_size) == (1, 4) and kwargs["batch_size"] == 64
    on_gpu = map_batches_kwargs(concurrency=3, num_gpus=1, task="classify")
    assert on_gpu["compute"].min_size == on_gpu["compute"].max_size == 3 and on_gpu["num_gpus"] == 1
    assert on_gpu["fn_constructor_kwargs"] == {"model": None, "task": "classify"}
    with pytest.raises(ValueError, match="dimensions does not apply"):
        map_batches_kwargs(task="score", dimensions=8)
    assert map_batches_kwargs(concurrency=(1, 4, 2))["compute"].initial_size == 2
    with pytest.raises(ValueError, match=r"concurrency is n, \(min, max\) or \(min, max, initial\)"):
        map_batches_kwargs(concurrency=(1, 2, 3, 4))
    with pytest.raises(ValueError, match="batch_format must be one of numpy, pandas, pyarrow"):
        map_batches_kwargs(batch_format="default")


def test_ray_data_embeds_on_two_actors_as_the_offline_api(ray_cluster, minilm):
    from poolgate.integrations.ray import map_batches_kwargs

    _, reference = minilm
    items = [{"id": i, "text": t} for i, t in enumerate(RAY_TEXTS)]
    # 5 blocks made in the driver, so both actors get some; a repartition here would need a task, and a CPU
    # besides the two the actors hold (there is none: Ray Data would wait forever)
    ds = ray_cluster.data.from_items(items, override_num_blocks=5)
    kwargs = map_batches_kwargs(concurrency=2, num_cpus=1, batch_size=64, dtype="float32", truncate_prompt_tokens=-1)
    rows = sorted(ds.map_batches(**kwargs).take_all(), key=lambda row: row["id"])  # Ray may reorder
    assert [row["id"] for row in rows] == list(range(len(RAY_TEXTS)))
    got = np.stack([row["embeddings"] for row in rows])
    assert _cos(got, reference.embed(RAY_TEXTS, truncate_prompt_tokens=-1)).min() >= 1 - 1e-5
    want_tokens = reference.submit(RAY_TEXTS, PoolingParams(truncate_prompt_tokens=-1)).prompt_tokens
    assert [row["num_input_tokens"] for row in rows] == want_tokens and 256 in want_tokens


def test_ray_data_scores_pairs_with_a_cross_encoder(ray_cluster, cross_encoder):
    from poolgate.integrations.ray import map_batches_kwargs

    pairs = [(WORDS[i % 4], WORDS[(i * 3 + 1) % 4] + f" w{i % 90}") for i in range(200)]
    ds = ray_cluster.data.from_items([{"id": i, "query": q, "document": d} for i, (q, d) in enumerate(pairs)])
    kwargs = map_batches_kwargs(
        cross_encoder, task="score", concurrency=1, num_cpus=1, batch_size=50, dtype="float32", batch_format="pyarrow"
    )
    rows = sorted(ds.map_batches(**kwargs).take_all(), key=lambda row: row["id"])
    with PoolingModel(cross_encoder, dtype="float32") as reference:
        want = reference.score([q for q, _ in pairs], [d for _, d in pairs])
    np.testing.assert_allclose([row["score"] for row in rows], want, atol=1e-6)
