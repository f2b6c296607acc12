"""An example IO-processor plugin for poolgate's ``/pooling``: sentence similarity from an embedding model.

Request ``{"data": {"source": "...", "sentences": ["...", ...]}}``; response
``data``: ``{"similarities": [cosine of source to each sentence]}``. Install
this folder (``pip install ./examples/io_processor_plugin``) and serve with
``--io-processor-plugin similarity``.
"""

from __future__ import annotations

import numpy as np

from poolgate.shared.domain.errors import InvalidRequest


class SimilarityPlugin:
    task = "embed"

    def to_inputs(self, data):
        if not isinstance(data, dict) or not isinstance(data.get("source"), str):
            raise InvalidRequest("data.source: a string is required", param="data.source")
        sentences = data.get("sentences")
        if not isinstance(sentences, list) or not sentences or not all(isinstance(s, str) for s in sentences):
            raise InvalidRequest("data.sentences: a non-empty list of strings is required", param="data.sentences")
        return [data["source"], *sentences]

    def to_response(self, data, outputs):
        source, rest = np.asarray(outputs[0], dtype=np.float32), np.asarray(outputs[1:], dtype=np.float32)
        norms = np.maximum(np.linalg.norm(rest, axis=1) * np.linalg.norm(source), 1e-12)
        return {"similarities": [float(x) for x in rest @ source / norms]}


def plugin() -> SimilarityPlugin:
    return SimilarityPlugin()
