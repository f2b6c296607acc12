"""The request fields every text-embeddings-inference route shares, and how its ``inputs`` become call inputs.

TEI's bodies are strict about their fields (``extra="forbid"``: a field TEI
does not have is refused, never ignored), plus poolgate's ``model`` to pick
one of several served models (default: the only one). ``truncate`` true cuts
each input to the model's length; absent or false, the server's
``--auto-truncate`` decides (TEI's explicit false means "never", which a
request cannot ask of poolgate's policy). ``truncation_direction`` is
``right`` (keep the first tokens) or ``left``, in either case.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

from poolgate.gateway.dialects.prompts import prompt_for
from poolgate.gateway.dialects.request import as_batch
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.domain.tasks import PoolingTask
from poolgate.shared.wire.messages import Input, ModelInfo, only_texts

TokenIds = list[Annotated[StrictInt, Field(ge=0)]]
TextOrIds = StrictStr | TokenIds
Inputs = TextOrIds | list[TextOrIds]  # a text, token ids, or a batch of either


class TeiBody(BaseModel):
    """``model`` (poolgate's), ``truncate``, ``truncation_direction``."""

    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    truncate: bool | None = None
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"

    def params(self, task: PoolingTask, **fields: Any) -> PoolingParams:
        return PoolingParams(
            task=task,
            truncate_prompt_tokens=-1 if self.truncate else None,
            truncation_side=self.truncation_direction.lower(),
            **fields,
        )


class InputsBody(TeiBody):
    """A body with TEI's ``inputs`` and ``prompt_name``."""

    inputs: Inputs
    prompt_name: str | None = None

    def batch(self, info: ModelInfo) -> list[Input]:
        """One call input per item of ``inputs`` (a lone text or id list is a batch of one), prompted."""
        return prompted(batch_of(self.inputs), prompt_for(info, prompt_name=self.prompt_name))


def batch_of(inputs: Inputs) -> list[Input]:
    if not inputs:
        raise InvalidRequest("`inputs` cannot be empty", param="inputs")
    return as_batch(inputs)


def prompted(inputs: list[Input], prompt: str | None) -> list[Input]:
    """Each text prefixed with the prompt, as sentence-transformers' ``encode(prompt=...)`` does."""
    if not prompt:
        return inputs
    texts = only_texts(inputs)
    if texts is None:
        raise InvalidRequest(
            "prompt_name prefixes texts: pass the inputs as strings, not token ids", param="prompt_name"
        )
    return [prompt + x for x in texts]
