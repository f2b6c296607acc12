"""Late chunking on ``/v1/embeddings`` (Jina's ``late_chunking``): a document encoded once, a vector per chunk.

Opt-in per request with ``late_chunking: true``, in one of three forms:

- Jina's: ``input`` is the list of a document's chunks, in order; they are
  joined with a space into one document and each input gets its chunk's vector;
- ``chunk_boundaries`` (character offsets where chunks start, strictly
  increasing, inside the text) with one text in ``input``;
- ``chunk_size`` (tokens per chunk) with one or more texts in ``input``.

The worker (``shared.inputs.late_plan``) encodes each document as one
sequence and gives each chunk the normalized mean of its tokens' vectors.
The answer is the embeddings list with one item per chunk, in order, each
naming its ``chunk``: ``{document, start, end}`` (characters of the document
as encoded). Bad boundaries are 400s, as is a model without token vectors.
"""

from __future__ import annotations

import time
from dataclasses import replace
from itertools import accumulate

from poolgate.gateway.dialects.encoding import json_encoder
from poolgate.gateway.dialects.envelope import EMBEDDINGS, list_response
from poolgate.gateway.serving import Served, ServeRequest
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.late_chunks import LateChunkText
from poolgate.shared.wire.messages import Input, only_texts

JOINER = " "  # between Jina-style chunks when they are joined into one document
TEXTS_ONLY = "late chunking reads texts: pass the input as strings, not token ids or chat messages"


def late_request(base: ServeRequest, boundaries: list[int] | None, size: int | None) -> ServeRequest:
    """``base`` (the plain embeddings request) as a late-chunking one."""
    texts = only_texts(base.inputs)
    if not texts:
        raise InvalidRequest(TEXTS_ONLY, param="input")
    if boundaries is not None and size is not None:
        raise InvalidRequest("give chunk_boundaries or chunk_size, not both", param="chunk_size")
    docs: list[Input]
    if boundaries is not None:
        if len(texts) != 1:
            raise InvalidRequest("chunk_boundaries split one document: pass one text as input", param="input")
        docs = [LateChunkText(texts[0], list(boundaries))]
    elif size is not None:
        docs = [LateChunkText(t, None, size) for t in texts]
    else:  # Jina's form: the inputs are the chunks of one document
        starts = [0, *accumulate(len(t) + len(JOINER) for t in texts[:-1])]
        docs = [LateChunkText(JOINER.join(texts), starts)]
    return replace(base, inputs=docs)


def to_response(served: Served, *, encoding_format: str, embed_dtype: str, endianness: str) -> dict:
    """One embeddings item per chunk, in order, each naming its document and character span."""
    encode, rows, windows = (
        json_encoder(encoding_format, embed_dtype, endianness),
        served.result.outputs,
        served.result.windows,
    )
    if windows is None:
        raise ValueError("a late-chunking call's result has no windows")
    documents = [d for d, count in enumerate(windows.counts) for _ in range(count)]
    data = [
        {
            "index": i,
            "object": "embedding",
            "embedding": encode(rows.item(i)),
            "chunk": {"document": documents[i], "start": start, "end": end},
        }
        for i, (start, end) in enumerate(windows.spans)
    ]
    return list_response(EMBEDDINGS, served, data, created=int(time.time()))
