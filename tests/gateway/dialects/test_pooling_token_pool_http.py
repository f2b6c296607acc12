"""/pooling's pool_factor: token_embed vectors pooled server-side (shared.domain.token_pooling), other tasks refused."""
import numpy as np

from poolgate.shared.domain.token_pooling import pool_tokens
from tests.fakes import expected_output, fake_model

TEXT = " ".join(f"w{i}" for i in range(13))


async def test_token_vectors_are_pooled_by_the_factor(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    resp = await client.post("/pooling", json={"input": [TEXT, "a"], "task": "token_embed", "pool_factor": 2})
    assert resp.status == 200, await resp.text()
    data = [np.float32(d["data"]) for d in (await resp.json())["data"]]
    full = expected_output(TEXT, "token_embed")  # (15, dim): CLS, 13 words, SEP
    assert data[0].shape == (1 + 14 // 2, full.shape[1])
    np.testing.assert_allclose(data[0], pool_tokens(full, 2), atol=1e-6)
    short = expected_output("a", "token_embed")  # CLS, a, SEP: CLS kept, the two others one cluster
    np.testing.assert_allclose(data[1], np.stack([short[0], short[1:].mean(0)]), atol=1e-6)


async def test_pool_factor_on_another_task_is_a_400(gateway):
    client = await gateway(models=[fake_model(tasks=("embed", "token_embed"))])
    resp = await client.post("/pooling", json={"input": "a b", "task": "embed", "pool_factor": 2})
    assert resp.status == 400
    assert (await resp.json())["error"]["message"] == "pool_factor pools token_embed vectors; the task is 'embed'"
    bad = await client.post("/pooling", json={"input": "a b", "task": "token_embed", "pool_factor": 0})
    assert bad.status == 400 and "greater_than_equal" in (await bad.json())["error"]["message"]
