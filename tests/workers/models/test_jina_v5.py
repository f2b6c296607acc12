"""jina-embeddings-v5-text-small (``JinaEmbeddingsV5Model``: a Qwen3 body, one PEFT LoRA adapter per task under
``adapters/<task>/``) on the packed Qwen3 with the task's adapter merged at load, against PEFT itself: the base
Qwen3Model with the adapter applied by ``PeftModel``, last token, L2-normalized (the model's own ``encode``)."""
import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from poolgate.gateway.cli import main as poolgate
from poolgate.shared.config.frozen import WorkerConfig
from poolgate.workers.load.build import load_model
from poolgate.workers.load.weights import CheckpointError
from tests.workers.models.test_decoder_golden import SEQS, save_tiny
from tests.workers.pooled import pool_ids
from tests.workers.rope_encoders import max_abs, print_figures, worst_cosine

peft = pytest.importorskip("peft")

TASKS = ["retrieval", "text-matching", "clustering", "classification"]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _as_jina_v5(folder, base, **adapter) -> dict:
    """Rewrite a saved Qwen3Model as jina-embeddings-v5 ships: its model type and task names, and a random PEFT
    LoRA adapter per task saved under adapters/<task>/; returns each task's PeftModel (the reference)."""
    config = json.loads((folder / "config.json").read_text())
    config.update(architectures=["JinaEmbeddingsV5Model"], model_type="jina_embeddings_v5", task_names=TASKS)
    (folder / "config.json").write_text(json.dumps(config))
    references = {}
    for i, task in enumerate(TASKS):
        lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS, lora_dropout=0.0, **adapter)
        model = peft.get_peft_model(copy.deepcopy(base), lora)
        torch.manual_seed(10 + i)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.normal_(0.0, 0.2)  # lora_B starts at zero: a random one makes the adapter matter
        model.save_pretrained(folder / "adapters" / task)
        references[task] = model.eval()
    return references


def _load(folder, **hf):
    return load_model(WorkerConfig(model=str(folder), served_model_name="j", dtype="float32",
                                   max_batch_tokens=1024, hf_overrides=hf))


def _reference(model, seqs=SEQS) -> np.ndarray:
    with torch.no_grad():
        return torch.stack([F.normalize(model(input_ids=torch.tensor([s])).last_hidden_state[0, -1], dim=-1)
                            for s in seqs]).numpy()


@pytest.mark.parametrize("task", [None, "text-matching"])
def test_the_task_adapter_is_merged_as_peft_applies_it(tmp_path, task):
    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    references = _as_jina_v5(tmp_path, base)
    model = _load(tmp_path, **({"jina_task": task} if task else {}))
    assert model.info.tasks[0] == "embed"
    got, want = pool_ids(model, SEQS), _reference(references[task or "retrieval"])
    assert worst_cosine(got, want) > 0.99999 and max_abs(got, want) < 1e-5, (worst_cosine(got, want),
                                                                             max_abs(got, want))
    assert max_abs(_reference(base), want) > 1e-3  # the adapter matters: merging it is what agrees


def test_rslora_scale(tmp_path):
    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    references = _as_jina_v5(tmp_path, base, use_rslora=True)
    got, want = pool_ids(_load(tmp_path), SEQS), _reference(references["retrieval"])
    assert max_abs(got, want) < 1e-5


def test_an_unknown_task_or_a_missing_adapter_is_refused(tmp_path):
    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    _as_jina_v5(tmp_path, base)
    with pytest.raises(ValueError, match=r"jina_task 'code' is not one of the model's task_names"):
        _load(tmp_path, jina_task="code")
    (tmp_path / "adapters" / "clustering" / "adapter_model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"clustering/adapter_model\.safetensors.*missing"):
        _load(tmp_path, jina_task="clustering")


def test_an_adapter_it_cannot_merge_exactly_is_refused(tmp_path):
    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    _as_jina_v5(tmp_path, base)
    path = tmp_path / "adapters" / "retrieval" / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "use_dora": True}))
    with pytest.raises(CheckpointError, match=r"adapter_config\.json.*use_dora=True cannot be merged"):
        _load(tmp_path)


def test_an_adapter_target_the_checkpoint_lacks_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    _as_jina_v5(tmp_path, base)
    path = tmp_path / "adapters" / "retrieval" / "adapter_model.safetensors"
    state = load_file(path)
    a = next(k for k in state if k.endswith("q_proj.lora_A.weight"))
    b = a.replace("lora_A", "lora_B")
    state[a.replace("layers.0.", "layers.9.")] = state[a].clone()
    state[b.replace("layers.0.", "layers.9.")] = state[b].clone()
    save_file(state, path)
    with pytest.raises(CheckpointError, match=r"adapter targets not in .*layers\.9\.self_attn\.q_proj\.weight"):
        _load(tmp_path)


def test_inspect_says_packed_qwen3(tmp_path, capsys):
    base = save_tiny(tmp_path, "qwen3", "Qwen3Model")
    _as_jina_v5(tmp_path, base)
    assert poolgate(["inspect", str(tmp_path), "--dtype", "float32", "--backend", "cpu"]) == 0
    rows = {line[:14].strip(): line[16:] for line in capsys.readouterr().out.splitlines()}
    assert rows["architecture"] == "JinaEmbeddingsV5Model" and rows["implementation"] == "packed qwen3"
    assert rows["pooling"].startswith("LAST (architecture default)")


def figures(tmp) -> list[tuple[str, float, float]]:
    base = save_tiny(tmp, "qwen3", "Qwen3Model")
    references = _as_jina_v5(tmp, base)
    rows = []
    for task in TASKS:
        got, want = pool_ids(_load(tmp, jina_task=task), SEQS), _reference(references[task])
        rows.append((f"JinaEmbeddingsV5Model jina_task={task}", worst_cosine(got, want), max_abs(got, want)))
    return rows


if __name__ == "__main__":
    print_figures(figures)
