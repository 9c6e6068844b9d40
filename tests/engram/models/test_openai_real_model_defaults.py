"""Defaults for real models (issue 10, item 7), through a real ``openai`` client talking HTTP to a
scripted OpenAI-compatible server on a loopback port: per-prompt ``max_tokens`` caps in the
request body, ``finish_reason=length`` retried once with a tighter cap and then raised as a
distinct error, ``json_schema`` refused -> ``json_object`` -> prompt-only fallback, the timeout
for local servers, and the SDK's own retries kept."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.prompts.models import Message
from pydantic import BaseModel

from engram.models.delegating import innermost
from engram.models.factory import LLMSettings, build_llm
from engram.models.openai_compat import PROMPT_MAX_TOKENS, LLMOutputTruncated, is_local_url, llm_stats
from tests.engram.models.openai_fake import FakeOpenAI, running


class Verdict(BaseModel):
    answer: str
    tags: list[str]


async def verdict(body: dict) -> str:
    if (body.get("response_format") or {}).get("json_schema", {}).get("name") == "CombinedExtraction":
        return '{"extracted_entities": [], "edges": []}'  # answers are validated against the response model
    return '{"answer": "FastAPI", "tags": ["web"]}'


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with running(FakeOpenAI(answer=verdict)) as server:
        yield server


def client(fake: FakeOpenAI, **kw):  # noqa: ANN003, ANN201
    return build_llm(LLMSettings(provider="openai", base_url=fake.base_url, model="m", requests_per_second=1000, **kw))


def messages() -> list[Message]:
    return [Message(role="system", content="Answer in JSON."), Message(role="user", content="Which framework?")]


async def test_per_prompt_caps_are_sent_in_the_request_body(fake: FakeOpenAI) -> None:
    llm = client(fake, max_tokens=3000, max_tokens_by_prompt={"dedupe_nodes": 300})
    # graphiti asks 16,384 for edge extraction: the prompt's cap wins.
    await llm.generate_response(messages(), Verdict, 16384, prompt_name="extract_nodes_and_edges.extract_message")
    await llm.generate_response(messages(), Verdict, prompt_name="dedupe_edges.resolve_edge")  # by group
    await llm.generate_response(messages(), Verdict, prompt_name="dedupe_nodes.nodes")  # setting overrides the group
    await llm.generate_response(messages(), Verdict, 100, prompt_name="extract_edges.edge")  # a smaller ask is kept
    await llm.generate_response(messages(), CombinedExtraction)  # no prompt name: found from the response model
    await llm.generate_response(messages(), Verdict, prompt_name="somebody.else")  # no cap: ENGRAM_LLM_MAX_TOKENS
    sent = [b["max_tokens"] for b in fake.requests]
    assert sent == [4096, 512, 300, 100, PROMPT_MAX_TOKENS["extract_nodes_and_edges.extract_message"], 3000]


async def test_truncated_answer_is_retried_once_with_a_tighter_cap(fake: FakeOpenAI) -> None:
    fake.script = ["length"]
    llm = client(fake)
    out = await llm.generate_response(messages(), Verdict, prompt_name="extract_edges.edge")
    assert out == {"answer": "FastAPI", "tags": ["web"]}
    first, retry = fake.requests
    assert (first["max_tokens"], retry["max_tokens"]) == (2048, 1024)
    assert "cut off at 2048 tokens" in retry["messages"][0]["content"]
    assert "cut off" not in first["messages"][0]["content"]
    schema = retry["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["tags"]["maxItems"] == 25  # a loop over a list cannot outlast the schema
    assert "maxItems" not in first["response_format"]["json_schema"]["schema"]["properties"]["tags"]
    stats = llm_stats(llm)
    assert stats is not None
    assert (stats.calls, stats.truncated, stats.truncation_recovered, stats.retried, stats.failed) == (1, 1, 1, 1, 0)


async def test_truncated_twice_raises_a_distinct_error_without_more_retries(fake: FakeOpenAI) -> None:
    fake.script = ["length", "length", "ok"]
    llm = client(fake)
    with pytest.raises(LLMOutputTruncated) as caught:
        await llm.generate_response(messages(), Verdict, prompt_name="dedupe_edges.resolve_edge")
    assert caught.value.dead_letter_reason == "llm_output_truncated"
    assert (caught.value.prompt, caught.value.max_tokens, caught.value.attempts) == ("dedupe_edges.resolve_edge", 256, 2)
    assert len(fake.requests) == 2  # not graphiti's 4 JSON-decode retries of the same request
    stats = llm_stats(llm)
    assert stats is not None and (stats.truncated, stats.failed) == (2, 1)


async def test_json_schema_refused_falls_back_to_json_object_and_stays_there(fake: FakeOpenAI) -> None:
    fake.refuse = {"json_schema"}
    llm = client(fake)
    assert (await llm.generate_response(messages(), Verdict))["answer"] == "FastAPI"
    assert (await llm.generate_response(messages(), Verdict))["answer"] == "FastAPI"
    kinds = [b["response_format"]["type"] for b in fake.requests]
    assert kinds == ["json_schema", "json_object", "json_object"]  # detected once, then remembered
    assert '"title": "Verdict"' in fake.requests[1]["messages"][-1]["content"]  # schema in the prompt
    assert '"title": "Verdict"' not in fake.requests[0]["messages"][-1]["content"]
    stats = llm_stats(llm)
    assert stats is not None and stats.structured_fallbacks == 1


async def test_no_response_format_at_all_falls_back_to_the_prompt(fake: FakeOpenAI) -> None:
    fake.refuse = {"json_schema", "json_object"}
    llm = client(fake)
    assert (await llm.generate_response(messages(), Verdict))["answer"] == "FastAPI"
    assert [(b.get("response_format") or {}).get("type") for b in fake.requests] == ["json_schema", "json_object", None]


async def test_a_fixed_mode_does_not_fall_back(fake: FakeOpenAI) -> None:
    fake.refuse = {"json_schema"}
    llm = client(fake, structured_output="json_schema")
    with pytest.raises(openai.BadRequestError):
        await llm.generate_response(messages(), Verdict)
    assert len(fake.requests) == 1


async def test_sdk_retries_on_server_errors_are_kept_and_counted(fake: FakeOpenAI) -> None:
    fake.script = ["500"]
    llm = client(fake, max_retries=2)
    assert (await llm.generate_response(messages(), Verdict))["answer"] == "FastAPI"
    stats = llm_stats(llm)
    assert stats is not None and (len(fake.requests), stats.retried, stats.http_requests) == (2, 1, 2)


def test_timeout_fits_a_single_slot_local_server() -> None:
    for url in ("http://127.0.0.1:8080/v1", "http://localhost:11434/v1", "http://ollama:11434/v1",
                "http://10.0.0.7:8000/v1", "http://[::1]:8000/v1", "http://llm.svc.cluster.local/v1"):
        assert is_local_url(url), url
        assert LLMSettings(base_url=url).resolved_timeout_s() == 600
    for url in (None, "https://api.openai.com/v1", "https://api.together.xyz/v1"):
        assert not is_local_url(url), url
        assert LLMSettings(base_url=url).resolved_timeout_s() == 120
    assert LLMSettings(base_url="http://127.0.0.1:1/v1", timeout_s=30).resolved_timeout_s() == 30
    llm = build_llm(LLMSettings(provider="openai", base_url="http://127.0.0.1:1/v1"))
    assert innermost(llm).client.timeout == 600  # what the SDK client was built with
