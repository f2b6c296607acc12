"""Per-request task adapters (``jina_task: per_request``): jina-embeddings-v3 and -v5 served with their base weights
unmerged and every task's LoRA applied per call equal, task by task, the model merged at load for that task and the
model's own reference (v3's parametrized forward re-created, v5 through PEFT); a batch mixing tasks equals each task
alone; a merged model takes only its own task."""
import numpy as np
import pytest

from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.models.task_adapters import LoraEmbedding, LoraLinear
from tests.workers.models import test_jina_v3 as v3
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import max_abs, worst_cosine

PER_REQUEST = {"jina_task": "per_request"}


def _agree(label, got, want, tol=1e-5):
    cos, diff = worst_cosine(got, want), max_abs(got, want)
    print(f"{label:<40} worst cosine {cos:.9f} max abs {diff:.2e}")  # the figures (pytest -s)
    assert cos > 0.99999 and diff <= tol, (label, cos, diff)


def _mixed(model, seqs, tasks):
    """One batch: sequence i under ``tasks[i]``, outputs in order."""
    outs = model.runner.run([Sequence(list(s), PoolingParams(adapter=t)) for s, t in zip(seqs, tasks)])
    return np.concatenate([o.rows.values for o in outs])


def test_v3_each_task_equals_its_merged_model_and_the_reference(tmp_path):
    state = v3._checkpoint(tmp_path)
    served = v3._load(tmp_path, **PER_REQUEST)
    assert served.info.adapters == tuple(v3.TASKS)
    wrapped = [m for m in served.runner.model.modules() if isinstance(m, (LoraLinear, LoraEmbedding))]
    assert len(wrapped) == 2 + 4 * v3.HF["num_hidden_layers"]  # word + token type, 4 linears a layer
    for i, task in enumerate(v3.TASKS):
        got = pool_ids(served, v3.SEQS, PoolingParams(adapter=task))
        _agree(f"v3 {task} vs merged", got, pool_ids(v3._load(tmp_path, jina_task=task), v3.SEQS))
        _agree(f"v3 {task} vs reference", got, v3.reference(state, i))
    default = v3.reference(state, v3.TASKS.index("text-matching"))
    _agree("v3 default vs text-matching", pool_ids(served, v3.SEQS), default)


def test_v3_a_batch_mixing_tasks_equals_each_task_alone(tmp_path):
    v3._checkpoint(tmp_path)
    served = v3._load(tmp_path, **PER_REQUEST)
    tasks = ["retrieval.query", "retrieval.passage", "retrieval.passage", "retrieval.query", None, "separation"]
    got = _mixed(served, v3.SEQS, tasks)
    alone = {t: pool_ids(served, v3.SEQS, PoolingParams(adapter=t)) for t in set(tasks)}
    want = [alone[t][i] for i, t in enumerate(tasks)]
    _agree("v3 mixed batch vs alone", got, want)
    assert max_abs(alone["retrieval.query"], alone["retrieval.passage"]) > 1e-3  # the tasks differ


def test_a_merged_model_names_only_its_task(tmp_path):
    v3._checkpoint(tmp_path)
    assert v3._load(tmp_path, jina_task="separation").info.adapters == ("separation",)
    assert v3._load(tmp_path).info.adapters == ("text-matching",)


def test_v5_each_task_equals_its_merged_model_and_peft(tmp_path):
    pytest.importorskip("peft")
    from tests.workers.models import test_jina_v5 as v5
    from tests.workers.models.test_decoder_golden import SEQS, save_tiny

    references = v5._as_jina_v5(tmp_path, save_tiny(tmp_path, "qwen3", "Qwen3Model"))
    served = v5._load(tmp_path, **PER_REQUEST)
    assert served.info.adapters == tuple(v5.TASKS)
    for task in v5.TASKS:
        got = pool_ids(served, SEQS, PoolingParams(adapter=task))
        _agree(f"v5 {task} vs merged", got, pool_ids(v5._load(tmp_path, jina_task=task), SEQS))
        _agree(f"v5 {task} vs PEFT", got, v5._reference(references[task]))
    tasks = ["clustering", "retrieval", "clustering", None, "classification"]
    alone = {t: pool_ids(served, SEQS, PoolingParams(adapter=t)) for t in set(tasks)}
    _agree("v5 mixed batch vs alone", _mixed(served, SEQS, tasks), [alone[t][i] for i, t in enumerate(tasks)])



def test_bf16_prepacked_linears_keep_their_lora(tmp_path):
    from poolgate.shared.config.frozen import WorkerConfig
    from poolgate.workers.load.build import load_model

    state = v3._checkpoint(tmp_path)
    load = lambda **hf: load_model(WorkerConfig(model=str(tmp_path), served_model_name="j3",  # noqa: E731
                                                dtype="bfloat16", max_batch_tokens=1024, hf_overrides=hf))
    served = load(**PER_REQUEST)
    assert served.info.dtype == "bfloat16"
    got = pool_ids(served, v3.SEQS, PoolingParams(adapter="separation"))
    assert worst_cosine(got, pool_ids(load(jina_task="separation"), v3.SEQS)) > 0.9999
    assert worst_cosine(got, v3.reference(state, v3.TASKS.index("separation"))) > 0.9999


def test_a_wrapped_model_run_without_a_plan_refuses(tmp_path):
    from poolgate.workers.batch.packing import pack

    v3._checkpoint(tmp_path)
    model = v3._load(tmp_path, **PER_REQUEST).runner.model
    with pytest.raises(RuntimeError, match="without its batch's adapter plan"):
        model(pack(v3.SEQS[:1]))


def test_v5_per_request_needs_its_task_names(tmp_path):
    pytest.importorskip("peft")
    import json

    from tests.workers.models import test_jina_v5 as v5
    from tests.workers.models.test_decoder_golden import save_tiny

    v5._as_jina_v5(tmp_path, save_tiny(tmp_path, "qwen3", "Qwen3Model"))
    config = json.loads((tmp_path / "config.json").read_text())
    del config["task_names"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="jina_task per_request needs the model's task_names"):
        v5._load(tmp_path, **PER_REQUEST)
