"""The engine's in-process tokenizer pool (the offline API): a huge input being tokenized does not hold up a small request's tokenizing,
and the real tokenizer gives the same ids when two threads use it at once."""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor


from poolgate.shared.config.models import bundled_model_path
from poolgate.shared.wire.messages import PoolingCall
from poolgate.workers.engine.engine import Engine
from tests.fakes import FakeEncoder, fake_model


class SlowHugeEncoder(FakeEncoder):
    """Tokenizes a text starting with "huge" only once ``release`` is set (a 30 MB text's long encode)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def encode(self, texts, max_tokens=None, **kwargs):
        if any(t.startswith("huge") for t in texts):
            self.entered.set()
            self.release.wait(10)
        return super().encode(texts, max_tokens, **kwargs)


def call(text: str) -> PoolingCall:
    return PoolingCall(request_id=text, model="fake-model", inputs=[text])


async def small_while_huge_tokenizes(tokenizer_threads: int) -> tuple[bool, bool]:
    """(the small call answered within 2 s, the huge call still tokenizing then)."""
    encoder = SlowHugeEncoder()
    engine = Engine(fake_model(encoder=encoder), tokenizer_threads)
    await engine.start()
    try:
        huge = asyncio.create_task(engine.submit(call("huge " + "word " * 20)))
        assert await asyncio.to_thread(encoder.entered.wait, 5)
        try:
            await asyncio.wait_for(engine.submit(call("small text")), 2)
            answered = True
        except TimeoutError:
            answered = False
        pending = not huge.done()
        encoder.release.set()
        assert (await asyncio.wait_for(huge, 5)).prompt_tokens == [23]
        return answered, pending
    finally:
        encoder.release.set()
        await engine.stop()


async def test_a_small_call_is_tokenized_while_a_huge_one_still_is():
    assert await small_while_huge_tokenizes(2) == (True, True)


async def test_with_one_tokenizer_thread_the_small_call_waits_for_the_huge_one():
    answered, _ = await small_while_huge_tokenizes(1)
    assert not answered  # what the second thread (the default) is for


def test_the_real_tokenizer_gives_the_same_ids_on_two_threads_at_once():
    from poolgate.workers.load.hf_tokenizer import load_encoder

    encoder = load_encoder(bundled_model_path())
    text = "the quick brown fox jumps over the lazy dog " * 40
    jobs = [(text, cap) for _ in range(100) for cap in (None, 7, 33)]
    alone = {cap: encoder.encode([text], cap) for cap in (None, 7, 33)}
    with ThreadPoolExecutor(2) as pool:
        got = list(pool.map(lambda job: (job[1], encoder.encode([job[0]], job[1])), jobs))
    assert all(ids == alone[cap] for cap, ids in got)
    assert len(alone[7][0]) == 7 and len(alone[33][0]) == 33
