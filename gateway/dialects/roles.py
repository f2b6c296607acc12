"""Input roles: whether a request's texts are queries or documents (``input_type``), for models that encode them apart.

A PyLate ColBERT model (``ModelInfo.input_roles``) marks and expands queries
and documents differently (``shared.inputs.pylate_roles``), so a request that is not
a (query, document) scoring request must say which its inputs are. It says so
with the field that already picks prompts (``dialects.prompts``): ``input_type``
``query`` or ``search_query`` (Cohere's) for queries, ``document``,
``search_document``, ``passage`` or ``corpus`` for documents. The role travels as
``PoolingParams.query_inputs`` (all inputs, or none, are queries). A model's
prompt of that name, if it has one, still applies; a role name it has no
prompt for applies none. A model without roles is untouched: ``input_type``
there means a prompt only.
"""

from __future__ import annotations

from poolgate.gateway.dialects.prompts import COHERE_TYPES, prompt_for
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.wire.messages import ModelInfo

ROLES: dict[str, str] = {
    **dict.fromkeys(("search_query", *COHERE_TYPES["search_query"]), "query"),
    **dict.fromkeys(("search_document", *COHERE_TYPES["search_document"]), "document"),
}
NEEDS_ROLE = (
    "this model encodes queries and documents differently (PyLate ColBERT): say which the inputs are "
    f"with input_type ({', '.join(ROLES)})"
)


def query_inputs(info: ModelInfo | None, input_type: str | None, n_inputs: int) -> int | None:
    """``PoolingParams.query_inputs`` for a request of ``n_inputs`` inputs: None for a model without roles."""
    if info is None or not info.input_roles:
        return None
    role = ROLES.get(input_type) if input_type is not None else None
    if role is None:
        raise InvalidRequest(
            NEEDS_ROLE if input_type is None else f"Unsupported input_type '{input_type}'. " + NEEDS_ROLE,
            param="input_type",
        )
    return n_inputs if role == "query" else 0


def role_prompt(info: ModelInfo, input_type: str | None, prompt_name: str | None) -> str | None:
    """``prompt_for``, where a role model's role name it has no prompt of needs none."""
    if (
        info.input_roles
        and prompt_name is None
        and input_type in ROLES
        and input_type not in (info.prompts or {})
        and input_type not in COHERE_TYPES
    ):
        return None
    return prompt_for(info, input_type, prompt_name)
