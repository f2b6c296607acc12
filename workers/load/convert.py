"""``--runner`` and ``--convert``: what kind of pooling model a checkpoint is served as, resolved as vLLM does.

A set ``--convert`` forces the pooling runner. Otherwise a sentence-transformers
folder (``modules.json``) is a pooling model, and the architecture's name
suffix decides (``SUFFIX_DEFAULTS``, vLLM's table, first match wins).
poolgate has no generate runner: a generative checkpoint served with
``--runner auto`` stops at start-up with a message naming ``--convert embed``
and ``--convert classify``; with ``--runner pooling`` it is converted to embed.
The result is the model's kind: ``embed`` (embed and token_embed, LAST
pooling and normalized for decoders), ``classify`` (a score layer: the
checkpoint's own, or one built from LM-head rows with ``classifier_from_token``)
or ``token_classify`` (a ``*ForTokenClassification`` checkpoint, or a reward model: ``NATIVE_KINDS``).
"""
from __future__ import annotations

SUFFIX_DEFAULTS: tuple[tuple[str, tuple[str, str]], ...] = (
    ("ForCausalLM", ("generate", "none")),
    ("ForConditionalGeneration", ("generate", "none")),
    ("ChatModel", ("generate", "none")),
    ("LMHeadModel", ("generate", "none")),
    ("ForTextEncoding", ("pooling", "embed")),
    ("EmbeddingModel", ("pooling", "embed")),
    ("ForSequenceClassification", ("pooling", "classify")),
    ("ForTokenClassification", ("pooling", "classify")),
    ("ForAudioClassification", ("pooling", "classify")),
    ("ForImageClassification", ("pooling", "classify")),
    ("ForVideoClassification", ("pooling", "classify")),
    ("ClassificationModel", ("pooling", "classify")),
    ("ForRewardModeling", ("pooling", "embed")),
    ("RewardModel", ("pooling", "embed")),
    ("Model", ("pooling", "embed")),  # let the more specific *Model suffixes above take priority
)
# pooling architectures whose own head decides their kind, whatever their name's suffix says (vLLM's reward models)
NATIVE_KINDS: dict[str, str] = {"Qwen2ForRewardModel": "token_classify", "Qwen2ForProcessRewardModel": "token_classify"}
# the tasks each kind of pooling model serves (the first is its default active task)
KIND_TASKS: dict[str, tuple[str, ...]] = {
    "embed": ("embed", "token_embed"),
    "classify": ("classify", "token_classify"),
    "token_classify": ("token_classify",),
}


def suffix_defaults(architecture: str) -> tuple[str, str]:
    """(runner, convert) for the architecture's name, by vLLM's suffix table."""
    return next((d for suffix, d in SUFFIX_DEFAULTS if architecture.endswith(suffix)), ("pooling", "embed"))


def model_kind(architecture: str, *, st_config: bool, runner: str = "auto", convert: str = "auto") -> str:
    """embed, classify or token_classify; ValueError for a generative model run without a convert."""
    if convert in ("auto", "none") and architecture in NATIVE_KINDS:
        return NATIVE_KINDS[architecture]
    default_runner, default_convert = suffix_defaults(architecture)
    if convert in ("auto", "none") and runner == "auto" and not st_config and default_runner == "generate":
        raise ValueError(
            f"{architecture} is a generative architecture and poolgate serves pooling models only: "
            "serve it with --convert embed (last-token embeddings) or --convert classify (a score layer), "
            "or with --runner pooling (embed)")
    if convert in ("auto", "none"):  # the suffix decides; a generative model run as pooling embeds
        convert = "embed" if default_convert == "none" else default_convert
    if convert == "classify" and architecture.endswith("ForTokenClassification"):
        return "token_classify"
    return convert
