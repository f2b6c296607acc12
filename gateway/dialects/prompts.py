"""Per-request prompts: a request's ``input_type`` or ``prompt_name`` → the model's prompt, or none.

A model's prompts are ``ModelInfo.prompts`` (``config_sentence_transformers.json``
``prompts``, or the HF config's ``task_instructions``), by name. A request
names one in two ways:

- ``prompt_name`` (TEI's field): exactly one of the model's prompt names;
- ``input_type`` (Cohere's field, also taken by ``/v1/embeddings``): a prompt
  name, or one of Cohere's four standard types, which map onto the names
  models use for them (``COHERE_TYPES``, first match wins):

  =================  ==========================================
  input_type         prompt names tried
  =================  ==========================================
  search_query       search_query, query
  search_document    search_document, document, passage, corpus
  classification     classification
  clustering         clustering
  =================  ==========================================

  A standard type with no matching prompt applies no prompt (the Cohere SDK
  always sends one, so a plain embedder must accept it; vLLM answers 400).
  Any other unknown type or name is a 400 listing what the model has.
"""

from __future__ import annotations

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.messages import Input, ModelInfo, only_texts

COHERE_TYPES: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "corpus"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
BOTH = "Give input_type or prompt_name, not both."


def prompt_for(info: ModelInfo, input_type: str | None = None, prompt_name: str | None = None) -> str | None:
    """The prompt the request asks for (None: no prompt); 400 for a type or name the model cannot honour."""
    if input_type is not None and prompt_name is not None:
        raise InvalidRequest(BOTH, param="prompt_name")
    prompts = info.prompts or {}
    if prompt_name is not None:
        if prompt_name not in prompts:
            raise InvalidRequest(f"Unsupported prompt_name '{prompt_name}'. {_supported(prompts)}", param="prompt_name")
        return prompts[prompt_name]
    if input_type is None:
        return None
    if input_type in prompts:
        return prompts[input_type]
    if input_type in COHERE_TYPES:
        return next((prompts[name] for name in COHERE_TYPES[input_type] if name in prompts), None)
    raise InvalidRequest(
        f"Unsupported input_type '{input_type}'. {_supported(prompts, standard=True)}", param="input_type"
    )


def prompted(inputs: list[Input], prompt: str | None) -> list[Input]:
    """Each text prefixed with ``prompt``, as sentence-transformers' ``encode(prompt=...)`` does."""
    if not prompt:
        return inputs
    texts = only_texts(inputs)
    if texts is None:
        raise InvalidRequest(
            "input_type and prompt_name prefix texts: pass the input as strings, not token ids or chat messages",
            param="input_type",
        )
    return [prompt + x for x in texts]


def _supported(prompts: dict[str, str], *, standard: bool = False) -> str:
    names = [*COHERE_TYPES, *(p for p in prompts if p not in COHERE_TYPES)] if standard else list(prompts)
    if not names:
        return "This model does not define any prompts."
    return f"Supported values: {', '.join(names)}."
