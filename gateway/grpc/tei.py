"""TEI's gRPC API (``tei.v1``) on poolgate's serving path: every RPC of ``tei.proto``, unary and streaming.

Each request message becomes the body TEI's HTTP route of the same name takes
(``dialects.tei``, ``tei_scores``, ``tei_tokens``), validated by the same
model, and runs through the same functions, so a gRPC answer is the HTTP
answer in protobuf: ``Embed`` is ``/embed``, ``EmbedSparse`` ``/embed_sparse``,
``EmbedAll`` ``/embed_all``, ``Predict``/``PredictPair`` ``/predict``,
``Rerank`` TEI's ``/rerank``, ``Tokenize`` ``/tokenize``, ``Decode`` ``/decode``.
Unset proto3 fields are what TEI's HTTP defaults are: ``normalize`` unset is
true; ``truncate`` false leaves it to ``--auto-truncate``. A ``*Stream`` method
answers each message in order, batching messages that arrived together
(``gateway.grpc.handlers``); ``RerankStream`` reads every document (one per
message, the first message's query, ``raw_scores`` and ``return_text``) and
ranks them once.

TEI's messages name no model: the call's ``x-poolgate-model`` metadata picks
one of several served models (default: the only or first one). Every answer's
``Metadata`` is measured per input: its characters and tokens, the batch's
tokenization, queue and inference times, and the time from the batch's start
until its answer (``total_time_ns``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
from aiohttp import web

from poolgate.gateway.dialects import tei, tei_scores, tei_tokens
from poolgate.gateway.dialects.body import validated
from poolgate.gateway.dialects.tei import EmbedAllRequest, EmbedRequest, embed_fields, served
from poolgate.gateway.grpc.handlers import collecting, streaming, unary
from poolgate.gateway.grpc.protos import Protos
from poolgate.gateway.http.state import CONFIG, RECORD, ROUTER
from poolgate.gateway.scope import CallScope
from poolgate.gateway.serving import Served, chars
from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.domain.sparse import sparse_vector
from poolgate.shared.version import VERSION

MODEL_HEADER = "x-poolgate-model"
DIRECTIONS = {0: "right", 1: "left"}


def _model(scope: CallScope) -> str | None:
    return scope.headers.get(MODEL_HEADER)


def _direction(message: Any) -> str:
    return DIRECTIONS.get(message.truncation_direction, "right")


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


class Tei:
    """The ``tei.v1`` servicers of one app: ``handlers()`` maps each service to its grpcio method handlers."""

    def __init__(self, app: web.Application, protos: Protos) -> None:
        self.app, self.protos = app, protos
        self.m = protos.message

    # -- metadata --------------------------------------------------------------------------------------------

    def metadata(self, scope: CallScope, served_: Served | None, inputs: list[Any], i: int | None) -> Any:
        """TEI's ``Metadata`` of input ``i`` of a batch (None: the whole call) from the batch's record."""
        record = scope.get(RECORD)
        meta = self.m("tei.v1.Metadata")()
        if record is None:
            return meta
        tokens = served_.result.prompt_tokens if served_ is not None else []
        meta.compute_chars = chars(inputs[i]) if i is not None else sum(chars(x) for x in inputs)
        meta.compute_tokens = (tokens[i] if i is not None and i < len(tokens) else sum(tokens)) if tokens else 0
        meta.total_time_ns = int((time.perf_counter() - record.started) * 1e9)
        if record.tokenize_ns is not None:
            meta.tokenization_time_ns = record.tokenize_ns[1] - record.tokenize_ns[0]
        meta.queue_time_ns = int((record.queue_s or 0.0) * 1e9)
        meta.inference_time_ns = int((record.inference_s or 0.0) * 1e9)
        return meta

    # -- bodies: a batch of messages as TEI's HTTP body -------------------------------------------------------

    def _inputs_body(self, scope: CallScope, messages: list[Any]) -> dict[str, Any]:
        """What every embed-like body has: the model, the batch's texts, the first message's options."""
        first = messages[0]
        return {
            "model": _model(scope),
            "inputs": [m.inputs for m in messages],
            "truncate": first.truncate or None,
            "truncation_direction": _direction(first),
            "prompt_name": _optional(first, "prompt_name"),
        }

    def _embed_body(self, scope: CallScope, messages: list[Any]) -> EmbedRequest:
        normalize = _optional(messages[0], "normalize")
        body = self._inputs_body(scope, messages)
        body.update(dimensions=_optional(messages[0], "dimensions"), normalize=True if normalize is None else normalize)
        return validated(body, EmbedRequest)

    def _all_body(self, scope: CallScope, messages: list[Any]) -> EmbedAllRequest:
        return validated(self._inputs_body(scope, messages), EmbedAllRequest)

    # -- batches: messages sharing their options -> one answer each ------------------------------------------

    async def embed(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        body = self._embed_body(scope, messages)
        done = await served(scope, body, "embed", **embed_fields(body))
        rows, out = done.result.outputs, self.m("tei.v1.EmbedResponse")  # (lists: 6x faster into a message)
        texts = [m.inputs for m in messages]
        return [
            out(
                embeddings=rows.item(i).astype(np.float32).reshape(-1).tolist(),
                metadata=self.metadata(scope, done, texts, i),
            )
            for i in range(len(messages))
        ]

    async def embed_sparse(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        done = await served(scope, self._all_body(scope, messages), None, sparse=True)
        rows, value = done.result.outputs, self.m("tei.v1.SparseValue")
        texts, out = [m.inputs for m in messages], self.m("tei.v1.EmbedSparseResponse")
        answers = []
        for i in range(len(messages)):
            vector = sparse_vector(rows, i)
            values = [value(index=int(k), value=float(v)) for k, v in zip(vector.indices, vector.values, strict=True)]
            answers.append(out(sparse_embeddings=values, metadata=self.metadata(scope, done, texts, i)))
        return answers

    async def embed_all(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        done = await served(scope, self._all_body(scope, messages), "token_embed", use_activation=False)
        rows, token = done.result.outputs, self.m("tei.v1.TokenEmbedding")
        texts, out = [m.inputs for m in messages], self.m("tei.v1.EmbedAllResponse")
        return [
            out(
                token_embeddings=[token(embeddings=row) for row in rows.item(i).astype(np.float32).tolist()],
                metadata=self.metadata(scope, done, texts, i),
            )
            for i in range(len(messages))
        ]

    async def _predict(self, scope: CallScope, messages: list[Any], inputs: list[list[str]]) -> list[Any]:
        first = messages[0]
        body = {
            "model": _model(scope),
            "inputs": inputs,
            "truncate": first.truncate or None,
            "truncation_direction": _direction(first),
            "raw_scores": first.raw_scores,
        }
        answers, done = await tei_scores.predicted(scope, validated(body, tei_scores.PredictRequest))
        prediction, out = self.m("tei.v1.Prediction"), self.m("tei.v1.PredictResponse")
        texts = [" ".join(x) for x in inputs]
        return [
            out(predictions=[prediction(**p) for p in answer], metadata=self.metadata(scope, done, texts, i))
            for i, answer in enumerate(answers)
        ]

    async def predict(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        return await self._predict(scope, messages, [[m.inputs] for m in messages])

    async def predict_pair(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        return await self._predict(scope, messages, [list(m.inputs) for m in messages])

    async def rerank(self, scope: CallScope, message: Any) -> Any:
        body = {
            "model": _model(scope),
            "query": message.query,
            "texts": list(message.texts),
            "truncate": message.truncate or None,
            "truncation_direction": _direction(message),
            "raw_scores": message.raw_scores,
            "return_text": message.return_text,
        }
        ranks, done = await tei_scores.ranked(scope, validated(body, tei_scores.RerankTextsRequest))
        rank = self.m("tei.v1.Rank")
        return self.m("tei.v1.RerankResponse")(
            ranks=[rank(**r) for r in ranks], metadata=self.metadata(scope, done, [body["query"], *body["texts"]], None)
        )

    async def rerank_stream(self, scope: CallScope, messages: list[Any]) -> Any:
        if not messages:
            raise InvalidRequest("A RerankStream needs at least one message (a query and a text).")
        first = messages[0]
        if any(m.query != first.query for m in messages[1:]):
            raise InvalidRequest("Every message of one RerankStream carries the same query.", param="query")
        joined = self.m("tei.v1.RerankRequest")(
            query=first.query,
            texts=[m.text for m in messages],
            truncate=first.truncate,
            raw_scores=first.raw_scores,
            return_text=first.return_text,
            truncation_direction=first.truncation_direction,
        )
        return await self.rerank(scope, joined)

    async def tokenize(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        first = messages[0]
        body = {
            "model": _model(scope),
            "inputs": [m.inputs for m in messages],
            "add_special_tokens": first.add_special_tokens,
            "prompt_name": _optional(first, "prompt_name"),
        }
        answers = await tei_tokens.tokenized(scope, validated(body, tei_tokens.TokenizeInputsRequest))
        token, out = self.m("tei.v1.SimpleToken"), self.m("tei.v1.EncodeResponse")
        return [out(tokens=[token(**{k: v for k, v in t.items() if v is not None}) for t in a]) for a in answers]

    async def decode(self, scope: CallScope, messages: list[Any]) -> list[Any]:
        body = {
            "model": _model(scope),
            "ids": [list(m.ids) for m in messages],
            "skip_special_tokens": messages[0].skip_special_tokens,
        }
        texts = await tei_tokens.decoded(scope, validated(body, tei_tokens.DecodeRequest))
        return [self.m("tei.v1.DecodeResponse")(text=text) for text in texts]

    async def info(self, scope: CallScope, _message: Any) -> Any:
        info, config = self.app[ROUTER].lookup(_model(scope)).info, self.app[CONFIG]
        kind = tei.model_type(info)  # TEI's kind: a one-label classifier is a reranker
        model_type = 2 if "reranker" in kind else 1 if "classifier" in kind else 0
        return self.m("tei.v1.InfoResponse")(
            version=VERSION,
            model_id=info.served_model_name,
            model_dtype=info.dtype,
            model_type=model_type,
            max_concurrent_requests=config.max_in_flight_per_worker or 0,
            max_input_length=info.max_model_len,
            max_client_batch_size=config.max_inputs_per_request,
        )

    # -- registration ---------------------------------------------------------------------------------------

    def handlers(self) -> dict[str, dict[str, tuple[str, Any, str, str]]]:
        """service -> method -> (kind, handler, request message, response message); kind is ``unary``,
        ``stream`` (stream to stream) or ``collect`` (stream to one)."""
        app, config = self.app, self.app[CONFIG]

        def one(fn: Callable[[CallScope, list[Any]], Any]) -> Callable[[CallScope, Any], Any]:
            async def single(scope: CallScope, message: Any) -> Any:
                return (await fn(scope, [message]))[0]

            return single

        def both(service: str, name: str, fn: Any, request: str, response: str, key: Callable[[Any], Hashable]) -> dict:
            method = f"/tei.v1.{service}/{name}"
            return {
                name: ("unary", unary(app, method, request, one(fn)), request, response),
                f"{name}Stream": (
                    "stream",
                    streaming(app, f"{method}Stream", request, key, fn, config),
                    request,
                    response,
                ),
            }

        def options(*names: str) -> Callable[[Any], Hashable]:
            return lambda m: tuple((m.HasField(n), getattr(m, n)) if n in _OPTIONAL else getattr(m, n) for n in names)

        embed_key = options("truncate", "normalize", "truncation_direction", "prompt_name", "dimensions")
        all_key = options("truncate", "truncation_direction", "prompt_name")
        predict_key = options("truncate", "raw_scores", "truncation_direction")
        most_docs = config.max_documents_per_rerank or config.max_inputs_per_request
        return {
            "tei.v1.Info": {
                "Info": (
                    "unary",
                    unary(app, "/tei.v1.Info/Info", "InfoRequest", self.info),
                    "InfoRequest",
                    "InfoResponse",
                )
            },
            "tei.v1.Embed": {
                **both("Embed", "Embed", self.embed, "EmbedRequest", "EmbedResponse", embed_key),
                **both("Embed", "EmbedSparse", self.embed_sparse, "EmbedSparseRequest", "EmbedSparseResponse", all_key),
                **both("Embed", "EmbedAll", self.embed_all, "EmbedAllRequest", "EmbedAllResponse", all_key),
            },
            "tei.v1.Predict": {
                **both("Predict", "Predict", self.predict, "PredictRequest", "PredictResponse", predict_key),
                **both(
                    "Predict", "PredictPair", self.predict_pair, "PredictPairRequest", "PredictResponse", predict_key
                ),
            },
            "tei.v1.Rerank": {
                "Rerank": (
                    "unary",
                    unary(app, "/tei.v1.Rerank/Rerank", "RerankRequest", self.rerank),
                    "RerankRequest",
                    "RerankResponse",
                ),
                "RerankStream": (
                    "collect",
                    collecting(
                        app, "/tei.v1.Rerank/RerankStream", "RerankStreamRequest", self.rerank_stream, most_docs
                    ),
                    "RerankStreamRequest",
                    "RerankResponse",
                ),
            },
            "tei.v1.Tokenize": {
                **both(
                    "Tokenize",
                    "Tokenize",
                    self.tokenize,
                    "EncodeRequest",
                    "EncodeResponse",
                    options("add_special_tokens", "prompt_name"),
                ),
                **both(
                    "Tokenize", "Decode", self.decode, "DecodeRequest", "DecodeResponse", options("skip_special_tokens")
                ),
            },
        }


_OPTIONAL = frozenset({"normalize", "prompt_name", "dimensions"})  # proto3 optional fields (presence matters)
