"""Reads a model folder (Hugging Face or sentence-transformers layout) into a ModelSpec.

The sentence-transformers files are the model's own description of its
pipeline: ``modules.json`` names the Pooling, Dense and Normalize modules,
``1_Pooling/config.json`` the pooling mode, ``sentence_bert_config.json`` the
max length and lower-casing. Precedence everywhere: user flag
(``--pooler-config`` and its aliases) > sentence-transformers config >
architecture default; ``--hf-overrides`` is merged over ``config.json``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from poolgate.shared.config.frozen import WorkerConfig
from poolgate.shared.config.model_settings import SEQ_POOLING_TYPES
from poolgate.shared.config.pooler_config import PoolerConfig
from poolgate.workers.load.convert import model_kind
from poolgate.workers.load.gguf import find_gguf
from poolgate.workers.load.gguf import read_config as read_gguf_config

ST_CONFIG_FILES = (
    "sentence_bert_config.json", "sentence_roberta_config.json", "sentence_distilbert_config.json",
    "sentence_camembert_config.json", "sentence_albert_config.json",
    "sentence_xlm-roberta_config.json", "sentence_xlnet_config.json",
)
POOLING_ALIASES = {"lasttoken": "LAST"}
# what a PyLate ColBERT folder adds to config_sentence_transformers.json (query/document markers, [MASK]
# query expansion, the punctuation skiplist): settings of its encode path, not of the modules poolgate runs
PYLATE_KEYS = ("query_prefix", "document_prefix", "query_length", "document_length", "attend_to_expansion_tokens",
               "skiplist_words", "do_query_expansion")
PYLATE_LENGTHS = {"query_length": 32, "document_length": 180}  # PyLate's defaults


@dataclass(frozen=True)
class DenseSpec:
    """A sentence-transformers Dense module: Linear(in→out) + activation."""

    path: Path
    in_features: int
    out_features: int
    bias: bool
    activation: str  # e.g. "torch.nn.modules.activation.Tanh"


@dataclass(frozen=True)
class ModelSpec:
    """Everything about a model folder that decides how it is served."""

    path: Path
    hf_config: dict
    architecture: str
    pooling_type: str | None  # CLS | MEAN | LAST; None = the architecture's default
    normalize: bool | None  # None = the architecture's default
    max_model_len: int
    do_lower_case: bool
    dense: tuple[DenseSpec, ...]
    is_matryoshka: bool
    matryoshka_dimensions: tuple[int, ...] | None
    pooler: PoolerConfig = PoolerConfig()  # the user's --pooler-config (task, calibration, default dims, ...)
    kind: str = "embed"  # embed | classify | token_classify (workers.load.convert, from --runner / --convert)
    gguf_file: str | None = None  # the GGUF file in ``path`` that holds config, tokenizer and weights
    pylate: tuple[str, ...] = ()  # the PyLate ColBERT settings its config_sentence_transformers.json sets


def _read_json(path: Path) -> dict | list | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _st_pooling_type(pooling_dir: Path) -> str | None:
    """vLLM's parse: ``pooling_mode`` string, else the ``pooling_mode_*`` key set true.

    Modes we cannot reproduce (max, weighted mean, several concatenated) are an
    error rather than a silent fallback to other vectors."""
    cfg = _read_json(pooling_dir / "config.json") or {}
    modes = [cfg["pooling_mode"]] if cfg.get("pooling_mode") else [
        k for k, v in cfg.items() if k.startswith("pooling_mode_") and v is True]
    if not modes:
        return None
    names = [POOLING_ALIASES.get(n, n).upper() for n in (m.removeprefix("pooling_mode_").split("_")[0] for m in modes)]
    if len(names) > 1 or names[0] not in SEQ_POOLING_TYPES:
        raise ValueError(f"{pooling_dir}: pooling {'+'.join(names)} is not supported "
                         f"(supported: {', '.join(SEQ_POOLING_TYPES)}); pass --pooling-type to override")
    return names[0]


def _dense_spec(module_dir: Path) -> DenseSpec:
    cfg = _read_json(module_dir / "config.json") or {}
    return DenseSpec(
        path=module_dir,
        in_features=int(cfg["in_features"]),
        out_features=int(cfg["out_features"]),
        bias=bool(cfg.get("bias", True)),
        activation=cfg.get("activation_function", "torch.nn.modules.linear.Identity"),
    )


def _pylate_len(path: Path) -> int:
    """The longest sequence a PyLate folder's own encode makes (its query / document length), else 0."""
    st = _read_json(path / "config_sentence_transformers.json")
    if not isinstance(st, dict) or (st.get("model_type") != "ColBERT" and not any(k in st for k in PYLATE_KEYS)):
        return 0
    return max(int(st.get(k) or v) for k, v in PYLATE_LENGTHS.items())


def _st6_max_len(path: Path) -> int | None:
    """sentence-transformers ≥ 6 saves ``max_seq_length`` as the tokenizer's ``model_max_length``."""
    n = (_read_json(path / "tokenizer_config.json") or {}).get("model_max_length")
    return int(n) if isinstance(n, int) and n < 1_000_000 else None


def _derived_max_len(hf: dict) -> int:
    from poolgate.workers.models.positions import learned_offset  # here: workers.models imports this module

    return int(hf.get("max_position_embeddings", 512)) - learned_offset(hf)  # RoBERTa-likes start after the pad


# an architecture a config's setting makes another one, as vLLM reads them: jina-embeddings-v3 says XLMRobertaModel,
# and its rotary positions (and task LoRA) are JinaRobertaModel's (workers.models.jina_xlmr)
BY_SETTING: dict[str, tuple[str, object, str]] = {
    "XLMRobertaModel": ("position_embedding_type", "rotary", "JinaRobertaModel")}


def _by_setting(architecture: str, hf: dict) -> str:
    key, value, other = BY_SETTING.get(architecture, (None, None, architecture))
    return other if key is not None and hf.get(key) == value else architecture


def read_prompts(path: Path, hf_config: dict) -> dict[str, str] | None:
    """The model's prompt per input type, as vLLM reads them for Cohere's ``input_type``:
    ``hf_config.task_instructions``, else ``config_sentence_transformers.json``'s ``prompts``."""
    prompts = hf_config.get("task_instructions") or (_read_json(path / "config_sentence_transformers.json") or {}).get("prompts")
    if not isinstance(prompts, dict):
        return None
    return {str(k): str(v) for k, v in prompts.items() if isinstance(v, str)} or None


def read_spec(cfg: WorkerConfig) -> ModelSpec:
    """Build the ModelSpec for ``cfg.model`` with the flag > ST > default precedence."""
    path = Path(cfg.model)
    gguf = find_gguf(path)  # a .gguf file (or a folder of one): config, tokenizer and weights from the file
    if gguf is not None:
        path = gguf[0]
    hf = read_gguf_config(*gguf) if gguf else _read_json(path / "config.json")
    if not isinstance(hf, dict):
        raise FileNotFoundError(f"{path} has no config.json: not a Hugging Face model folder")
    hf = {**hf, **cfg.hf_overrides}
    user_pooling = cfg.pooler_config.sequence_pooling
    modules = _read_json(path / "modules.json") or []
    pooling, normalize, dense = None, None, []
    for module in modules:
        kind = module.get("type", "").rsplit(".", 1)[-1]
        mdir = path / module.get("path", "")
        if kind == "Pooling" and pooling is None and not user_pooling:
            pooling = _st_pooling_type(mdir)
        elif kind == "Dense":
            dense.append(_dense_spec(mdir))
        elif kind == "Normalize":
            normalize = True
    if modules and normalize is None:
        normalize = False
    st = next((c for f in ST_CONFIG_FILES if (c := _read_json(path / f)) is not None), {})
    derived = _derived_max_len(hf)
    max_len = cfg.max_model_len or st.get("max_seq_length") or (_st6_max_len(path) if modules else None) or derived
    if max_len > derived:
        raise ValueError(f"max_model_len {max_len} exceeds the model's {derived} positions")
    if not cfg.max_model_len:  # PyLate encodes past max_seq_length: its marker comes on top
        max_len = min(max(max_len, _pylate_len(path)), derived)
    dims = hf.get("matryoshka_dimensions")
    architecture = _by_setting((hf.get("architectures") or ["BertModel"])[0], hf)
    kind = model_kind(architecture, st_config=bool(modules), runner=cfg.runner, convert=cfg.convert)
    if gguf and kind != "embed":
        raise ValueError(f"{path / gguf[1]}: a GGUF checkpoint serves as an embedder (--convert embed); "
                         f"{kind} needs a safetensors checkpoint with its score layer")
    return ModelSpec(
        path=path,
        hf_config=hf,
        architecture=architecture,
        pooling_type=user_pooling or pooling,
        normalize=normalize if cfg.pooler_config.use_activation is None else cfg.pooler_config.use_activation,
        max_model_len=int(max_len),
        do_lower_case=bool(st.get("do_lower_case", False)),
        dense=tuple(dense),
        is_matryoshka=bool(dims or hf.get("is_matryoshka", False)),
        matryoshka_dimensions=tuple(dims) if dims else None,
        pooler=cfg.pooler_config,
        kind=kind,
        gguf_file=gguf[1] if gguf else None,
        pylate=tuple(k for k in PYLATE_KEYS if k in (_read_json(path / "config_sentence_transformers.json") or {})),
    )
