"""shared.inputs.window_cuts through the input stage with the bundled WordPiece tokenizer: windows that fit,
spans that match."""
from __future__ import annotations

from dataclasses import replace

import pytest

from poolgate.shared.domain.errors import InvalidRequest
from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.domain.params import PoolingParams
from poolgate.shared.wire.messages import PoolingCall, WindowedText
from poolgate.shared.inputs.stage import InputStage
from poolgate.workers.load.hf_tokenizer import load_encoder, read_tokenizer
from tests.fakes import fake_model

# Words WordPiece splits into many pieces: a window cut between two pieces re-tokenizes longer.
TEXT = " ".join(["antidisestablishmentarianism photosynthesizing zzzqxv unbelievably çàéè 東京タワー"] * 20)


@pytest.fixture(scope="module")
def encoder():
    return load_encoder(bundled_model_path())


@pytest.mark.parametrize("cap", [17, 31, 40])
def test_every_window_fits_and_its_span_is_what_was_read(encoder, cap):
    stage = InputStage(replace(fake_model().info, max_model_len=cap), encoder)
    call = PoolingCall("r", "m", ["a query", WindowedText(TEXT, 50, 3)], PoolingParams(task="embed"))
    encoded = stage.encode(call)
    assert encoded.windows.counts[0] == 1 and len(encoded.ids) == 1 + encoded.windows.counts[1]
    spans = encoded.windows.spans[1:]
    assert all(len(ids) <= cap for ids in encoded.ids)
    assert [encoder.encode([TEXT[a:b]])[0] for a, b in spans] == encoded.ids[1:]  # each span re-reads as sent
    assert spans[0][0] == 0 and spans[-1][1] == len(TEXT)  # 50 windows are enough to reach the end
    assert all(a1 < a2 < b1 for (a1, b1), (a2, _) in zip(spans, spans[1:]))  # in order, overlapping
    assert encoded.prompt_tokens() == [len(encoded.ids[0]), sum(len(x) for x in encoded.ids[1:])]


def test_max_windows_stops_early_and_max_tokens_cuts_first(encoder):
    stage = InputStage(replace(fake_model().info, max_model_len=20), encoder)
    cut = stage.encode(PoolingCall("r", "m", [WindowedText(TEXT, 2)], PoolingParams(task="embed")))
    assert cut.windows.counts == (2,) and cut.windows.spans[1][1] < len(TEXT)
    capped = stage.encode(PoolingCall("r", "m", [WindowedText(TEXT, 9, max_tokens=5)], PoolingParams(task="embed")))
    assert capped.windows.counts == (1,) and len(capped.ids[0]) == 5 + 2


def test_a_query_that_leaves_no_room_is_a_400(encoder):
    stage = InputStage(replace(fake_model().info, max_model_len=8, tasks=("classify",)), encoder)
    doc = WindowedText(TEXT, 3, query="one two three four five six")
    with pytest.raises(InvalidRequest, match="leaves no room for a document window"):
        stage.encode(PoolingCall("r", "m", [doc], PoolingParams(task="classify")))


def test_a_score_templates_prompt_leaves_room_for_each_window():
    encoder = load_encoder(bundled_model_path(), score_template="bge_reranker_gemma")
    stage = InputStage(replace(fake_model().info, max_model_len=96, tasks=("classify",)), encoder)
    query = "which words are long?"
    room = encoder.room(query, None, 0)
    hf = read_tokenizer(bundled_model_path())  # transformers' own tokenizer is the reference
    assert room == len(hf(encoder.score_template(query, "", None))["input_ids"])
    encoded = stage.encode(PoolingCall("r", "m", [WindowedText(TEXT, 20, 4, query=query)], PoolingParams(task="classify")))
    assert encoded.windows.counts[0] > 2 and all(len(ids) <= 96 for ids in encoded.ids)
    for (a, b), ids in zip(encoded.windows.spans, encoded.ids):  # each window read as the template's prompt
        assert ids == hf(encoder.score_template(query, TEXT[a:b], None))["input_ids"]
