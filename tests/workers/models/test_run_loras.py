"""Run-time LoRA adapters (``--max-loras``, ``workers.models.run_loras``): a PEFT adapter made here on a tiny random
BERT and Qwen3 gives the vectors of PEFT's merged model; a packed batch mixing three adapters and the base equals each
alone; what cannot be applied (modules_to_save, a fused-activation target, a rank over the cap, a full registry)
is refused by name, and unloading frees the slot."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModel

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.shared.domain.errors import InvalidRequest, ModelNotFound
from poolgate.shared.domain.params import PoolingParams
from poolgate.workers.engine.sequence import Sequence
from poolgate.workers.load.build import load_model
from tests.fakes import make_tiny_checkpoint
from tests.workers.models.test_decoder_golden import save_tiny
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import max_abs, worst_cosine
from tests.workers.rope_encoders import save as save_rope

peft = pytest.importorskip("peft")

SEQS = [[2, 10, 11, 12, 3], [2, 40, 3], [2] + list(range(5, 45)) + [3], [2, 7, 3], [2] + [9, 8, 7, 6] * 4 + [3]]
BERT_TARGETS = ["query", "key", "value", "output.dense"]  # attention.output.dense and output.dense
QWEN_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def make_adapter(base_folder, out, targets, *, seed: int, r: int = 4, alpha: int = 8, **extra):
    """A PEFT LoRA adapter on the checkpoint in ``base_folder`` (A and B random, so it changes the vectors), saved
    into ``out``; returns PEFT's merged model (the reference)."""
    torch.manual_seed(seed)
    base = AutoModel.from_pretrained(base_folder, attn_implementation="eager").eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, **extra))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(out)
    return model.merge_and_unload().eval()


def mean_vectors(model, seqs) -> np.ndarray:
    """transformers' mean-pooled, normalized vectors, one sequence at a time."""
    with torch.no_grad():
        rows = [model(input_ids=torch.tensor([s])).last_hidden_state[0].mean(0) for s in seqs]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1).numpy()


def serve(folder, **kw):
    return load_model(WorkerConfig(model=str(folder), served_model_name="base", max_batch_tokens=512,
                                   pooler_config=PoolerConfig(seq_pooling_type="MEAN"),
                                   **{"max_loras": 4, "dtype": "float32", **kw}))


def _agree(label, got, want, *, cosine=0.9999, tol=None):
    cos, diff = worst_cosine(got, want), max_abs(got, want)
    print(f"{label:<36} worst cosine {cos:.9f} max abs {diff:.2e}")  # the figures (pytest -s)
    assert cos >= cosine and (tol is None or diff <= tol), (label, cos, diff)


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bert")
    make_tiny_checkpoint(folder)
    merged = {f"a{i}": make_adapter(folder, folder / f"a{i}", BERT_TARGETS, seed=i) for i in range(3)}
    return folder, merged


def test_bert_adapters_equal_pefts_merged_model_and_the_base_stays_the_base(bert):
    folder, merged = bert
    served = serve(folder)
    base = pool_ids(served, SEQS)
    _agree("bert base vs transformers", base, mean_vectors(AutoModel.from_pretrained(folder).eval(), SEQS))
    for name in merged:
        served.runner.adapters.load(name, folder / name)
    for name, ref in merged.items():
        got = pool_ids(served, SEQS, PoolingParams(lora=name))
        _agree(f"bert {name} vs PEFT merged", got, mean_vectors(ref, SEQS))
        assert max_abs(got, base) > 1e-3  # the adapter changes the vectors
    _agree("bert base after loading", pool_ids(served, SEQS), base, tol=1e-6)


def test_a_batch_mixing_three_adapters_and_the_base_equals_each_alone(bert):
    folder, merged = bert
    served = serve(folder)
    for name in merged:
        served.runner.adapters.load(name, folder / name)
    names = ["a0", None, "a1", "a2", "a0"]
    outs = served.runner.run([Sequence(list(s), PoolingParams(lora=n)) for s, n in zip(SEQS, names)])
    got = np.concatenate([o.rows.values for o in outs])
    alone = {n: pool_ids(served, SEQS, PoolingParams(lora=n)) for n in set(names)}
    _agree("bert mixed batch vs each alone", got, [alone[n][i] for i, n in enumerate(names)], tol=1e-5)


def test_qwen3_adapter_on_fused_qkv_and_gate_up_equals_pefts_merged_model(tmp_path):
    save_tiny(tmp_path, "qwen3", "Qwen3Model", head_dim=32)
    ref = make_adapter(tmp_path, tmp_path / "q", QWEN_TARGETS, seed=3, r=8, alpha=16)
    other = make_adapter(tmp_path, tmp_path / "k", ["k_proj", "up_proj"], seed=4)  # parts of the fused ones
    served = serve(tmp_path)
    served.runner.adapters.load("q", tmp_path / "q")
    served.runner.adapters.load("k", tmp_path / "k")
    _agree("qwen3 q vs PEFT merged", pool_ids(served, SEQS, PoolingParams(lora="q")), mean_vectors(ref, SEQS))
    _agree("qwen3 k vs PEFT merged", pool_ids(served, SEQS, PoolingParams(lora="k")), mean_vectors(other, SEQS))
    names = ["q", None, "k", "q", None]
    outs = served.runner.run([Sequence(list(s), PoolingParams(lora=n)) for s, n in zip(SEQS, names)])
    alone = {n: pool_ids(served, SEQS, PoolingParams(lora=n)) for n in set(names)}
    _agree("qwen3 mixed vs alone", np.concatenate([o.rows.values for o in outs]),
           [alone[n][i] for i, n in enumerate(names)], tol=1e-5)


def test_what_cannot_be_applied_is_refused_by_name(bert, tmp_path):
    folder, _ = bert
    served = serve(folder, max_loras=2, max_lora_rank=8)
    loras = served.runner.adapters
    make_adapter(folder, tmp_path / "head", ["query"], seed=5, modules_to_save=["pooler"])
    make_adapter(folder, tmp_path / "inter", ["intermediate.dense"], seed=6)
    make_adapter(folder, tmp_path / "big", ["query"], seed=7, r=16)
    for name, why in [("head", "modules_to_save"), ("inter", "activation fused: .gelu"), ("big", "--max-lora-rank 8"),
                      ("missing", "adapter config")]:
        with pytest.raises(InvalidRequest, match=why):
            loras.load(name, tmp_path / name)
    loras.load("a0", folder / "a0")
    with pytest.raises(InvalidRequest, match="already been loaded"):
        loras.load("a0", folder / "a0")
    loras.load("a1", folder / "a1")
    with pytest.raises(InvalidRequest, match="--max-loras"):
        loras.load("a2", folder / "a2")
    a0, a1 = (pool_ids(served, SEQS, PoolingParams(lora=n)) for n in ("a0", "a1"))
    loras.unload("a0")
    with pytest.raises(ModelNotFound):
        loras.unload("a0")
    # a call queued before the unload still runs the adapter, until a load takes its slot
    _agree("a0 queued across its unload", pool_ids(served, SEQS, PoolingParams(lora="a0")), a0, tol=1e-6)
    loras.load("a2", folder / "a2")  # into the unloaded one's slot
    with pytest.raises(ModelNotFound, match="not loaded"):
        pool_ids(served, SEQS, PoolingParams(lora="a0"))
    _agree("a1 after a slot changed hands", pool_ids(served, SEQS, PoolingParams(lora="a1")), a1, tol=1e-6)
    assert max_abs(pool_ids(served, SEQS, PoolingParams(lora="a2")), a0) > 1e-3


def test_a_model_without_slots_refuses_an_adapters_call(bert):
    served = serve(bert[0], max_loras=0)
    assert served.runner.adapters is None and served.info.max_loras == 0
    with pytest.raises(ValueError, match="serves none"):
        pool_ids(served, SEQS, PoolingParams(lora="a0"))


def test_bf16_adapters_on_prepacked_linears_stay_close_to_pefts_merged_model(bert):
    """bf16 on the CPU prepacks every linear (oneDNN, GELU fused): the adapters wrap those, and a fused one is
    still refused by name."""
    folder, merged = bert
    served = serve(folder, dtype="bfloat16")
    assert served.info.dtype == "bfloat16"
    served.runner.adapters.load("a1", folder / "a1")
    got = pool_ids(served, SEQS, PoolingParams(lora="a1"))
    _agree("bert a1 bf16 vs PEFT merged fp32", got, mean_vectors(merged["a1"], SEQS), cosine=0.999)


def test_a_classifiers_encoder_adapter_gives_pefts_merged_scores(tmp_path):
    """A cross-encoder (BertForSequenceClassification): an adapter on its encoder (its head as served), the raw
    scores of PEFT's merged model; PEFT's SEQ_CLS default (the head saved whole: modules_to_save) is refused."""
    from transformers import AutoModelForSequenceClassification

    from tests.fakes import make_tiny_cross_encoder

    make_tiny_cross_encoder(tmp_path)
    torch.manual_seed(8)
    base = AutoModelForSequenceClassification.from_pretrained(tmp_path).eval()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=BERT_TARGETS))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0.0, 0.2)
    model.save_pretrained(tmp_path / "ce")
    merged = model.merge_and_unload().eval()
    served = load_model(WorkerConfig(model=str(tmp_path), served_model_name="ce", dtype="float32", max_loras=2,
                                     max_batch_tokens=512))
    served.runner.adapters.load("ce", tmp_path / "ce")
    got = pool_ids(served, SEQS, PoolingParams(task="classify", use_activation=False, lora="ce"))
    with torch.no_grad():
        want = np.stack([merged(input_ids=torch.tensor([s])).logits[0].numpy() for s in SEQS])
    print(f"cross-encoder adapter vs PEFT merged max abs {max_abs(got, want):.2e}")
    assert max_abs(got, want) < 1e-4
    assert max_abs(pool_ids(served, SEQS, PoolingParams(task="classify", use_activation=False)), want) > 1e-3
    seq_cls = peft.get_peft_model(AutoModelForSequenceClassification.from_pretrained(tmp_path),
                                  peft.LoraConfig(r=4, target_modules=["query"], task_type="SEQ_CLS"))
    seq_cls.save_pretrained(tmp_path / "seq_cls")
    with pytest.raises(InvalidRequest, match="modules_to_save"):
        served.runner.adapters.load("seq_cls", tmp_path / "seq_cls")


FAMILIES = {  # family → (write a tiny random checkpoint into a folder, the PEFT targets)
    "xlm-roberta": (lambda f: make_tiny_checkpoint(f, model_type="xlm-roberta"), BERT_TARGETS),
    "modernbert": (lambda f: save_rope(f, "modernbert", AutoModel), ["Wqkv", "attn.Wo", "Wi", "mlp.Wo"]),
    "llama": (lambda f: save_tiny(f, "llama", "LlamaModel"), QWEN_TARGETS),
    "gemma3": (lambda f: save_tiny(f, "gemma3_text", "Gemma3TextModel", head_dim=16, sliding_window=8,
                                   sliding_window_pattern=2, query_pre_attn_scalar=24), QWEN_TARGETS),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_other_packed_families_equal_pefts_merged_model(tmp_path, family):
    write, targets = FAMILIES[family]
    write(tmp_path)
    ref = make_adapter(tmp_path, tmp_path / "ad", targets, seed=9)
    served = serve(tmp_path)
    served.runner.adapters.load("ad", tmp_path / "ad")
    got = pool_ids(served, SEQS, PoolingParams(lora="ad"))
    _agree(f"{family} adapter vs PEFT merged", got, mean_vectors(ref, SEQS))
    assert max_abs(got, pool_ids(served, SEQS)) > 1e-3
