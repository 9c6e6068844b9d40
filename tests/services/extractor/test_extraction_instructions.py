"""Extraction instructions end to end, against real NATS JetStream and FalkorDB with the pipeline
in-process (turn-detector -> extractor, recall) and a recording LLM (the offline rules model that
keeps every prompt it is sent): ENGRAM_EXTRACTION_PREPROCESSING_MODE places the text before or
after the extraction instructions (the combined prompt's are engram's own), and a per-turn override sent through REST ``POST /messages``, a
ChatMessage on NATS or MCP ``add_memory`` reaches the model's prompt -- scrubbed, never logged."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import nats
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from engram.stack.embedded import free_port
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import ExtractionOverride, subjects
from engram.services.extractor import app as ex_app
from engram.services.extractor.extraction_prompt import INSTRUCTIONS
from engram.services.mcp.settings import McpSettings
from engram.services.recall import app as recall_app
from engram.services.turn_detector import app as td_app
from tests.services.gateway.test_gateway import serve_gateway
from tests.services.mcp.test_mcp import call, serve_mcp
from tests.services.turn_detector.helpers import close, episodes, msg, publish, read_all, wait_for
from tests.support.llm import RecordingLLMClient

# A secret the scrubber knows (an OpenAI-style key): it must reach neither the Episode nor the prompt.
SECRET = "sk-" + "Zq8wN3vR5tY7uI9oP1aS2dF4gH6jK8lX"
# the first line of the combined extraction instructions (engram's own prompt: services/extractor/extraction_prompt.py)
GRAPHITI_GOAL = INSTRUCTIONS.split("\n", 1)[0]
CONFIGURED = "Reading this chat turn"  # the first line of the default template (templates/default-session-turn.md)


@pytest.fixture(autouse=True)
def _extraction_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.upper().startswith("ENGRAM_EXTRACTION_"):
            monkeypatch.delenv(key)


def settings_for(nats_url: str, graph_url: str, tmp_path: Path) -> EngramSettings:
    return EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                          turn=TurnDetectorSettings(idle_timeout_s=1))


@contextlib.asynccontextmanager
async def pipeline(settings: EngramSettings) -> AsyncIterator[RecordingLLMClient]:
    llm = RecordingLLMClient()
    services = [td_app.build(settings), ex_app.build(settings, llm=llm), recall_app.build(settings)]
    started = []
    try:
        for service in services:
            await service.start()
            started.append(service)
        yield llm
    finally:
        for service in reversed(started):
            await service.stop()


async def prompt_with(llm: RecordingLLMClient, marker: str, timeout_s: float = 30) -> str:
    """The first extraction prompt (its user message) holding ``marker``."""
    async def found() -> str | None:
        return next((p for p in llm.extraction_prompts() if marker in p), None)

    prompt = await wait_for(found, timeout_s)
    assert prompt, f"no extraction prompt held {marker!r}; {len(llm.prompts)} prompts seen"
    return prompt


@pytest.mark.parametrize("mode", ["prepend", "append"])
async def test_preprocessing_mode_puts_the_text_before_or_after_graphitis_instructions(
    mode: str, clean_nats, falkordb_server, tmp_path, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
) -> None:
    marker = f"PREPROCESSING-{mode.upper()}-7f3"
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREPROCESSING_PROMPT", f"{marker}: keep every version number.")
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREPROCESSING_MODE", mode)
    async with pipeline(settings_for(clean_nats, falkordb_server.url, tmp_path)) as llm:
        nc = await nats.connect(clean_nats)
        js = nc.jetstream()
        session = f"mode-{mode}-{free_port()}"  # FalkorDB outlives the test: a stored episode is not extracted again
        await publish(js, msg(session, "u1", "user", "We pinned FastAPI 0.115 in pyproject.toml.", 0, name="Ada"))
        await publish(js, msg(session, "a1", "assistant", "Noted: FastAPI 0.115 is pinned.", 1))
        await close(js, session)
        prompt = await prompt_with(llm, marker)
        await nc.close()
    at, goal = prompt.index(marker), prompt.index(GRAPHITI_GOAL)
    if mode == "prepend":
        assert prompt.startswith(f"<PREPROCESSING INSTRUCTIONS>\n{marker}")
        assert at < goal
        assert "<CUSTOM INSTRUCTIONS>" not in prompt
    else:
        assert goal < prompt.index("<CUSTOM INSTRUCTIONS>") < at  # the custom-instructions section, after the rules
        assert "<PREPROCESSING INSTRUCTIONS>" not in prompt
    # every extraction prompt of the episode got it, and only those: dedupe and summaries did not
    assert all(marker in p for p in llm.extraction_prompts())
    assert not any(marker in c for name, contents in llm.prompts for c in contents if not name.startswith("extract_"))


async def test_rest_custom_extraction_instructions_reach_the_prompt_scrubbed_and_unlogged(
    clean_nats, falkordb_server, tmp_path, caplog: pytest.LogCaptureFixture,  # noqa: ANN001
) -> None:
    marker = "REST-OVERRIDE-41c"
    instructions = f"{marker}: record only the framework decisions. Our key {SECRET} is not a fact."
    settings = settings_for(clean_nats, falkordb_server.url, tmp_path)
    group = f"rest-o-{free_port()}"
    caplog.set_level(logging.DEBUG)
    async with pipeline(settings) as llm, serve_gateway(settings) as http:
        turn = [
            {"role_type": "user", "role": "Ada", "content": "We chose FastAPI over Flask for the API.",
             "timestamp": "2026-03-01T09:00:00Z", "custom_extraction_instructions": instructions},
            {"role_type": "assistant", "role": "Bot", "content": "FastAPI it is.", "timestamp": "2026-03-01T09:00:01Z"},
        ]
        answer = await http.post("/messages", json={"group_id": group, "messages": turn})
        assert answer.status_code == 202, answer.text
        prompt = await prompt_with(llm, marker)
        nc = await nats.connect(clean_nats)
        (episode,) = [e for e in await episodes(nc.jetstream()) if e.session_id == group]
        await nc.close()
        too_long = [{**turn[0], "custom_extraction_instructions": "x" * 8001}]
        refused = await http.post("/messages", json={"group_id": group, "messages": too_long})
    assert SECRET not in prompt and CONFIGURED not in prompt  # scrubbed; it replaced the configured template
    assert episode.extraction is not None and marker in str(episode.extraction.preprocessing_prompt)
    assert SECRET not in episode.model_dump_json()
    assert not any(marker in r.getMessage() for r in caplog.records)
    assert refused.status_code == 422 and "custom_extraction_instructions" in refused.text


async def test_chat_message_override_reaches_the_prompt_and_the_turns_first_one_wins(
    clean_nats, falkordb_server, tmp_path,  # noqa: ANN001
) -> None:
    first, later = "NATS-OVERRIDE-FIRST-9d2", "NATS-OVERRIDE-LATER-9d2"
    session = f"nats-o-{free_port()}"
    async with pipeline(settings_for(clean_nats, falkordb_server.url, tmp_path)) as llm:
        nc = await nats.connect(clean_nats)
        js = nc.jetstream()
        await publish(js, msg(session, "u1", "user", "Ada moved the CI from Travis to GitHub Actions.", 0, name="Ada",
                              extraction=ExtractionOverride(preprocessing_prompt=f"{first} {SECRET}",
                                                            preprocessing_mode="prepend")))
        await publish(js, msg(session, "a1", "assistant", "GitHub Actions is set up.", 1,
                              extraction=ExtractionOverride(preprocessing_prompt=later)))
        await close(js, session)
        prompt = await prompt_with(llm, first)
        stored = [e for e in await episodes(js) if e.session_id == session]
        await nc.close()
    assert prompt.startswith(f"<PREPROCESSING INSTRUCTIONS>\n{first}")  # the override's own mode
    assert SECRET not in prompt and CONFIGURED not in prompt
    assert not any(later in p for p in llm.extraction_prompts())
    assert [e.extraction.preprocessing_prompt.startswith(first) for e in stored if e.extraction] == [True]


async def test_mcp_add_memory_custom_extraction_instructions_reach_the_prompt(
    clean_nats, falkordb_server, tmp_path,  # noqa: ANN001
) -> None:
    text_marker, message_marker = "MCP-TEXT-OVERRIDE-5e8", "MCP-MESSAGE-OVERRIDE-5e8"
    settings = settings_for(clean_nats, falkordb_server.url, tmp_path)
    group = f"mcp-o-{free_port()}"
    async with pipeline(settings) as llm, serve_mcp(settings, McpSettings(api_key="k", idle_timeout_s=1)) as base:
        client = httpx2.AsyncClient(headers={"x-api-key": "k"}, timeout=60)
        async with client, streamable_http_client(f"{base}/mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            await call(session, "add_memory", name="stack", group_id=group,
                       episode_body="user (Ada): We deploy with Helm 3.14 on the staging cluster.",
                       custom_extraction_instructions=f"{text_marker} {SECRET}")
            await call(session, "add_memory", name="m", group_id=group, source="message", role="user",
                       episode_body="Ada switched the database to Postgres 16.",
                       custom_extraction_instructions=message_marker)
            text_prompt = await prompt_with(llm, text_marker)
            message_prompt = await prompt_with(llm, message_marker)
    assert SECRET not in text_prompt
    assert CONFIGURED not in text_prompt and CONFIGURED not in message_prompt


async def test_episode_with_an_unusable_override_is_dead_lettered_at_once_without_quoting_it(
    clean_nats, falkordb_server, tmp_path,  # noqa: ANN001
) -> None:
    session = f"bad-o-{free_port()}"
    async with pipeline(settings_for(clean_nats, falkordb_server.url, tmp_path)) as llm:
        nc = await nats.connect(clean_nats)
        js = nc.jetstream()
        await publish(js, msg(session, "u1", "user", "Ada likes tea.", 0,
                              extraction=ExtractionOverride(preprocessing_prompt="../../secret-dir/x.md")))
        await close(js, session)
        async def letters():  # noqa: ANN202
            return [m for m in await read_all(js, subjects.STREAM_DLQ)
                    if m.headers.get(subjects.HDR_DLQ_STAGE) == "extractor"] or None

        (letter,) = await wait_for(letters, 30)
        await nc.close()
    assert letter.headers[subjects.HDR_DLQ_REASON] == "extraction_override"
    assert "secret-dir" not in json.dumps(dict(letter.headers))
    assert not llm.extraction_prompts()
