"""bench/llm_simulator.py as a plain ``openai`` client sees it: each fault on the wire, faults
aimed at one response model, the seeded random mix, embeddings and models, counts."""

from __future__ import annotations

import json
import time

import openai
import pytest

from bench.llm_simulator import (
    LLMSimulator,
    empty,
    hang,
    invalid_json,
    rate_limit,
    schema_violation,
    server_error,
    slow,
    truncated,
)

ENTITIES = {"type": "json_schema", "json_schema": {"name": "ExtractedEntities", "schema": {}}}
PROMPT = [{"role": "user", "content": "<CURRENT MESSAGE>\nuser(Ada): I moved the API from Flask to FastAPI.\n</CURRENT MESSAGE>"}]


def sdk(sim: LLMSimulator, **kw) -> openai.AsyncOpenAI:  # noqa: ANN003
    return openai.AsyncOpenAI(base_url=sim.base_url, api_key="x", **{"max_retries": 0, "timeout": 2.0, **kw})


async def ask(client: openai.AsyncOpenAI, response_format: dict | None = ENTITIES):  # noqa: ANN201
    extra = {"response_format": response_format} if response_format else {}
    return await client.chat.completions.create(model="sim", messages=PROMPT, max_tokens=64, **extra)  # type: ignore[arg-type]


async def test_the_answer_is_the_rules_models_and_deterministic(sim: LLMSimulator) -> None:
    first, second = await ask(sdk(sim)), await ask(sdk(sim))
    answer = json.loads(first.choices[0].message.content or "")
    assert {"FastAPI", "Flask"} <= {e["name"] for e in answer["extracted_entities"]}
    assert first.choices[0].message.content == second.choices[0].message.content
    assert first.choices[0].finish_reason == "stop"


async def test_each_fault_on_the_wire(sim: LLMSimulator) -> None:
    client = sdk(sim)
    sim.schedule(rate_limit(retry_after_s=7), server_error(502), invalid_json(), truncated(), schema_violation(), empty())
    with pytest.raises(openai.RateLimitError) as limited:
        await ask(client)
    assert limited.value.response.headers["retry-after"] == "7"
    with pytest.raises(openai.InternalServerError) as failed:
        await ask(client)
    assert failed.value.status_code == 502
    not_json = (await ask(client)).choices[0]
    with pytest.raises(ValueError):
        json.loads(not_json.message.content or "")
    cut = (await ask(client)).choices[0]
    assert cut.finish_reason == "length" and cut.message.content and not cut.message.content.endswith("}")
    wrong = json.loads((await ask(client)).choices[0].message.content or "")
    assert wrong == {"extracted_entities": "not a list"}
    assert (await ask(client)).choices[0].message.content == ""
    assert [s.kind for s in sim.served] == ["rate_limit", "server_error", "invalid_json", "truncated", "schema", "empty"]
    assert [s.status for s in sim.served] == [429, 502, 200, 200, 200, 200]
    assert sim.pending == 0 and sim.count() == 6 and sim.count("truncated") == 1


async def test_hang_outlasts_the_client_timeout_and_slow_does_not(sim: LLMSimulator) -> None:
    sim.schedule(hang(30.0), slow(0.5))
    with pytest.raises(openai.APITimeoutError):
        await ask(sdk(sim, timeout=0.5))
    started = time.monotonic()
    assert (await ask(sdk(sim, timeout=5.0))).choices[0].finish_reason == "stop"
    assert time.monotonic() - started >= 0.5


async def test_a_fault_aimed_at_one_response_model_waits_for_it(sim: LLMSimulator) -> None:
    sim.schedule(server_error(503, prompt="ExtractedEdges"))
    assert (await ask(sdk(sim))).choices[0].finish_reason == "stop"  # ExtractedEntities: not aimed at
    assert sim.pending == 1
    edges = {"type": "json_schema", "json_schema": {"name": "ExtractedEdges", "schema": {}}}
    with pytest.raises(openai.InternalServerError):
        await ask(sdk(sim), edges)
    assert sim.pending == 0 and sim.count("server_error", prompt="ExtractedEdges") == 1


async def test_the_random_mix_is_seeded(sim: LLMSimulator) -> None:
    def run(seed: int) -> list[str]:
        sim.clear()
        sim.mix(0.5, [server_error(503), truncated()], seed=seed)
        return [sim._next_fault("ExtractedEntities").kind for _ in range(40)]

    first = run(3)
    assert first == run(3) and first != run(4)
    assert 5 < sum(kind != "ok" for kind in first) < 35


async def test_embeddings_and_models(sim: LLMSimulator) -> None:
    client = sdk(sim)
    assert [m.id for m in (await client.models.list()).data] == ["sim"]
    vectors = await client.embeddings.create(model="e", input=["Ada moved to FastAPI", "Ada moved to FastAPI"], dimensions=32)
    assert len(vectors.data) == 2 and len(vectors.data[0].embedding) == 32
    assert vectors.data[0].embedding == vectors.data[1].embedding
    assert sim.count(path="/v1/embeddings") == 1


async def test_http_faults_on_the_embeddings_endpoint(sim: LLMSimulator) -> None:
    from bench.llm_simulator import EMBEDDINGS

    sim.schedule(server_error(503, path=EMBEDDINGS), rate_limit(2, path=EMBEDDINGS))
    assert (await ask(sdk(sim))).choices[0].finish_reason == "stop"  # chat: not aimed at
    with pytest.raises(openai.InternalServerError):
        await sdk(sim).embeddings.create(model="e", input=["x"])
    with pytest.raises(openai.RateLimitError):
        await sdk(sim).embeddings.create(model="e", input=["x"])
    assert len((await sdk(sim).embeddings.create(model="e", input=["x"])).data) == 1
    assert [(s.path, s.kind) for s in sim.served] == [
        ("/v1/chat/completions", "ok"), (EMBEDDINGS, "server_error"), (EMBEDDINGS, "rate_limit"), (EMBEDDINGS, "ok")]
