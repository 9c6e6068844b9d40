"""recall service against real NATS and FalkorDB: facts written by the real turn-detector and
extractor come back over ``engram.recall`` with provenance, never across groups, within the
token budget, and fail-open when the graph stalls or the request is bad."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram.models.factory import EmbedderSettings, build_embedder
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.text.tokens import token_counter
from engram.schemas import RecallRequest, RecallResponse, RecallScopes, ScopeKeys, subjects
from engram.services.extractor import app as ex_app
from engram.services.recall import app as rc_app
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import close, msg, publish, wait_for

CONVERSATION_A = [
    ("user", "I moved the billing API from Flask to FastAPI and pinned pydantic==2.14 in pyproject.toml.", "Ada"),
    ("assistant", "FastAPI uses pydantic for validation, so the models carry over.", None),
    ("user", "The deploy to staging failed with `ModuleNotFoundError: No module named httpx`.", "Ada"),
    ("assistant", "Add httpx==0.28.1 to pyproject.toml; graphiti-core imports it without declaring it.", None),
]
CONVERSATION_B = [
    ("user", "Caroline went to the LGBTQ support group in Boston and adopted a dog named Max.", "Caroline"),
    ("assistant", "That sounds powerful, Caroline! Max is a great name for a dog.", "Melanie"),
    ("user", "Melanie painted a lake sunrise and pinned it in her studio in Boston.", "Caroline"),
    ("assistant", "Melanie loves painting; the lake sunrise was her favourite.", "Melanie"),
]


async def ask(nc: nats.NATS, request: RecallRequest | bytes, timeout: float = 10.0) -> RecallResponse:
    """Ask recall over NATS. A request that sets no ``timeout_ms`` gets 5 s instead of the 500 ms
    default: these tests check what recall answers, not how fast (bench/recall.py does), and a
    group's first recall on a loaded 2-core CI machine can take longer than 500 ms."""
    if isinstance(request, RecallRequest) and "timeout_ms" not in request.model_fields_set:
        request = request.model_copy(update={"timeout_ms": 5000})
    body = request if isinstance(request, bytes) else request.model_dump_json().encode()
    reply = await nc.request(subjects.RECALL, body, timeout=timeout)
    return RecallResponse.model_validate_json(reply.data)


async def _idle(js, stream: str) -> bool:  # noqa: ANN001
    infos = [c for c in await js.consumers_info(stream) if c.config.durable_name]
    return bool(infos) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos)


@contextlib.asynccontextmanager
async def stack(nats_url: str, graph_url: str, tmp_path: Path,
                embedder: EmbedderSettings | None = None) -> AsyncIterator[tuple]:
    """turn-detector, extractor (rules model) and recall; ``embedder`` for both extractor and
    recall when given, else the configured one (the suite's: hashing)."""
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                              group_prefix=f"t{uuid.uuid4().hex[:8]}", turn=TurnDetectorSettings(idle_timeout_s=3600))
    apps = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient(), embedder_settings=embedder),
            rc_app.build(settings, embedder=build_embedder(embedder) if embedder else None)]
    for app in apps:
        await app.start()
    nc = await nats.connect(nats_url)
    try:
        yield nc, settings
    finally:
        await nc.close()
        for app in reversed(apps):
            await app.stop()


async def ingest(nc: nats.NATS, session: str, conversation: list, scopes: ScopeKeys | None = None) -> list[str]:
    js = nc.jetstream()
    ids = []
    for i, (role, text, name) in enumerate(conversation):
        m = msg(session, f"{session}-m{i}", role, text, i, name=name, scopes=scopes or ScopeKeys())
        ids.append(m.message_id)
        await publish(js, m)
    await close(js, session)
    assert await wait_for(lambda: _idle(js, subjects.STREAM_IN), 30)
    assert await wait_for(lambda: _idle(js, subjects.STREAM_EPISODES), 60)
    return ids


async def test_recall_returns_session_facts_with_provenance(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        ids = await ingest(nc, "recall-a", CONVERSATION_A, ScopeKeys(user="ada@example.org"))
        # 12 items: facts rank before the turns they came from (episode weight 0.8), 5 would be all facts
        response = await ask(nc, RecallRequest(query="Which web framework does the billing API use?",
                                                scopes=RecallScopes(session="recall-a"), max_facts=12))
        assert not response.degraded and response.items, response.reason
        assert any("FastAPI" in i.fact for i in response.items)
        assert all(i.scope == "session" and i.group_id == subjects.session_group(settings.group_prefix, "recall-a")
                   for i in response.items)
        assert response.prompt_section.startswith("<graphiti_memory>") and "FastAPI" in response.prompt_section
        for item in response.items:
            assert item.provenance and all(set(p.message_ids) <= set(ids) and p.message_ids for p in item.provenance)
        # past turns come back too (kind=episode), unless only facts are asked for; a fact whose
        # turns are all shown above it is left out (drop_covered_facts)
        assert "episode" in {i.kind for i in response.items}
        for at, item in enumerate(response.items):
            above = {i.uuid for i in response.items[:at] if i.kind == "episode"}
            assert item.kind == "episode" or not {p.episode_id for p in item.provenance} <= above
        facts_only = await ask(nc, RecallRequest(query="Which web framework does the billing API use?",
                                                 scopes=RecallScopes(session="recall-a"), include_episodes=False))
        assert facts_only.items and all(i.kind == "fact" for i in facts_only.items)
        # the user scope holds the same turns: asking only by user key finds them too
        by_user = await ask(nc, RecallRequest(query="httpx deploy error", scopes=RecallScopes(user="ada@example.org")))
        assert by_user.items and all(i.scope == "user" for i in by_user.items)
        # both scopes: the session copy wins and the user copy of the same fact is dropped
        both = await ask(nc, RecallRequest(query="httpx deploy error",
                                            scopes=RecallScopes(session="recall-a", user="ada@example.org")))
        facts = [i.fact for i in both.items]
        assert len(facts) == len(set(facts)) and both.items[0].scope == "session"


async def test_recall_never_crosses_groups_and_respects_the_budget(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await ingest(nc, "grp-a", CONVERSATION_A + CONVERSATION_B[:2])
        await ingest(nc, "grp-b", CONVERSATION_B + CONVERSATION_A[:2])
        group_a = subjects.session_group(settings.group_prefix, "grp-a")
        group_b = subjects.session_group(settings.group_prefix, "grp-b")
        facts_a = {i.uuid for i in (await ask(nc, RecallRequest(query="FastAPI Caroline httpx Boston", group_ids=[group_a],
                                                                 max_facts=200, token_budget=100_000))).items}
        assert facts_a
        count = token_counter()
        loop = asyncio.get_running_loop()
        words = ["FastAPI", "Caroline", "httpx", "Boston", "painted", "pydantic", "dog", "staging", "Max", "the"]

        @settings_(max_examples=25)
        @given(st.lists(st.sampled_from(words), min_size=1, max_size=5), st.integers(min_value=16, max_value=400))
        def check(query_words: list[str], budget: int) -> None:
            request = RecallRequest(query=" ".join(query_words), scopes=RecallScopes(session="grp-b"),
                                    max_facts=20, token_budget=budget)
            response = asyncio.run_coroutine_threadsafe(ask(nc, request), loop).result(15)
            assert not response.degraded, response.reason
            assert all(i.group_id == group_b and i.uuid not in facts_a for i in response.items)
            assert count(response.prompt_section) <= budget

        await asyncio.to_thread(check)


def settings_(**kw):  # noqa: ANN003, ANN201 - hypothesis settings for a test body run in a thread
    return settings(deadline=None, suppress_health_check=list(HealthCheck), **kw)


@pytest.fixture
def stalled_graph() -> AsyncIterator[str]:
    """A TCP port that accepts connections and never answers: a stalled graph database."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    yield f"falkor://127.0.0.1:{srv.getsockname()[1]}"
    srv.close()


async def test_recall_fails_open_on_a_stalled_graph_and_bad_requests(clean_nats, stalled_graph, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=stalled_graph, data_dir=tmp_path)
    app = rc_app.build(settings)
    await app.start()
    nc = await nats.connect(clean_nats)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await ask(nc, RecallRequest(query="anything", scopes=RecallScopes(session="s1"), timeout_ms=300))
        took = loop.time() - started
        assert response.degraded and response.items == [] and "timeout" in (response.reason or "")
        assert took < 2.0, f"fail-open took {took:.2f}s for a 300 ms budget"
        bad = await ask(nc, b'{"query": 5, "max_facts": -1}')
        assert bad.degraded and bad.reason and bad.reason.startswith("bad_request")
        nothing = await ask(nc, RecallRequest(query="x"))
        assert not nothing.degraded and nothing.items == [] and nothing.reason
    finally:
        await nc.close()
        await app.stop()


async def test_recall_without_facts_returns_past_turns_only(clean_nats, falkordb_server, tmp_path,  # noqa: ANN001
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """ENGRAM_RECALL_FACTS=false: the ablation bench/recall_quality.py measures the graph's facts with."""
    monkeypatch.setenv("ENGRAM_RECALL_FACTS", "false")
    monkeypatch.setenv("ENGRAM_RECALL_DROP_COVERED_FACTS", "false")  # else facts would rarely be shown anyway
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, _):
        await ingest(nc, "recall-nf", CONVERSATION_A)
        response = await ask(nc, RecallRequest(query="Which web framework does the billing API use?",
                                                scopes=RecallScopes(session="recall-nf"), max_facts=10))
        assert response.items and {i.kind for i in response.items} == {"episode"}, response.reason
        assert any("FastAPI" in i.fact for i in response.items)
