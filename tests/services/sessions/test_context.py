"""The context builder (services/sessions/context.py): every layer within its cl100k budget (tags
and source note included) with long Turkish text, the layers read from a real FalkorDB and the
recall layer from the real recall service over NATS, a failing or slow source leaves only its
layer out (degraded), and ``engram.context`` round trips over NATS."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import nats
import pytest
from prometheus_client import REGISTRY
from hypothesis import given, settings as hsettings
from hypothesis import strategies as st

from engram.graph.drivers import GraphDrivers
from engram.publishing.promote import Promotion, promotion_episode
from engram.runtime.service import ServiceApp, make_broker
from engram.settings import ContextSettings, EngramSettings
from engram.text.tokens import token_counter
from engram.schemas import Episode, EpisodeMessage, subjects
from engram.schemas.memory import ContextBudgets, ContextRequest, ContextResponse, MemoryScopes, SessionRecord
from engram.services.extractor.pipeline import build_episodic_node
from engram.services.recall import app as rc_app
from engram.services.sessions import requests
from engram.services.sessions.context import StoredSources, build_context, fit_section
from engram.services.sessions.store import MemoryStore

COUNT = token_counter()
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
TURKISH = ("Kullanıcı İstanbul'da yaşıyor, Django projesinde çalışıyor ve öğle yemeğinde çiğ köfte yemeyi "
           "seviyor; ağaçların gölgesinde şöyle güzel bir gün geçirdiğini söyledi. ")


def turkish(n: int, label: str = "") -> str:
    return label + TURKISH * n


@dataclass
class Stack:
    settings: EngramSettings
    graphs: GraphDrivers
    store: MemoryStore
    nc: nats.NATS


@pytest.fixture
async def stack(clean_nats, falkordb_server, tmp_path) -> AsyncIterator[Stack]:  # noqa: ANN001
    """The recall service and the sessions service's request side on real NATS + FalkorDB."""
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                              group_prefix=f"c{uuid.uuid4().hex[:8]}")
    graphs = GraphDrivers(settings)
    store = MemoryStore(graphs)
    broker = make_broker(settings, service="sessions")
    requests.subscribe(broker, store, settings)
    apps = [rc_app.build(settings), ServiceApp(name="sessions", broker=broker)]
    for app in apps:
        await app.start()
    nc = await nats.connect(clean_nats)
    try:
        yield Stack(settings, graphs, store, nc)
    finally:
        await nc.close()
        for app in reversed(apps):
            await app.stop()
        await graphs.close()


async def ask(nc: nats.NATS, request: ContextRequest | bytes, timeout: float = 15.0) -> ContextResponse:
    body = request if isinstance(request, bytes) else request.model_dump_json().encode()
    reply = await nc.request(subjects.CONTEXT, body, timeout=timeout)
    return ContextResponse.model_validate_json(reply.data)


async def save_episode(graphs: GraphDrivers, episode: Episode) -> None:
    """Write an episode's node as the extractor does (build_episodic_node), without extraction."""
    node = build_episodic_node(episode, datetime.now(timezone.utc))
    await node.save(await graphs.driver(episode.group_id))


def chat_episode(group: str, i: int, text: str) -> Episode:
    at = T0 + timedelta(minutes=i)
    return Episode(episode_id=f"ep-{group}-{i}", group_id=group, scope="user", turn_id=f"s-{i}", session_id="s",
                   reference_time=at, content=f"user: {text}",
                   messages=[EpisodeMessage(message_id=f"m-{group}-{i}", role="user", timestamp=at)])


async def fill(s: Stack, user: str, workspace: str, *, size: int) -> None:
    """Preferences, notes, a closed session, promotions and past turns, each ``size`` times Turkish text."""
    prefix = s.settings.group_prefix
    user_g = subjects.user_group(prefix, user)
    for i in range(8):
        await s.store.set_preference(user_g, f"tercih_{i}", turkish(size, f"değer {i}: "), source="conversation")
    for i in range(30):
        await s.store.add_note(user_g, turkish(size, f"not {i}: "), source="extraction",
                               at=T0 + timedelta(minutes=i))
    await s.store.save_session(user_g, SessionRecord(
        session_id="s", segment=0, segment_id="s-0-0", summary=turkish(size * 10, "Özet: "), summary_source="llm",
        close_reason="token_limit", token_count=30_000, message_count=60, closed_at=T0))
    for i in range(20):
        episode = promotion_episode(Promotion(kind="decision", text=turkish(size, f"karar {i}: "), scope="workspace",
                                              key=workspace, at=T0 + timedelta(hours=i)), prefix)
        await save_episode(s.graphs, episode)
    for i in range(40):
        await save_episode(s.graphs, chat_episode(user_g, i, turkish(1, f"İstanbul çiğ köfte {i}: ")))


def test_fit_section_never_overflows_with_turkish_text() -> None:
    @hsettings(max_examples=60, deadline=None)
    @given(st.integers(min_value=0, max_value=3000), st.integers(min_value=1, max_value=40),
           st.booleans(), st.sampled_from(["request", 'group x: "3" <notes>', "ğüşıöç İĞÜŞÖÇ"]))
    def check(budget: int, lines: int, whole_lines: bool, source: str) -> None:
        body = "\n".join(f"- {i}. " + TURKISH * (1 + i % 4) for i in range(lines))
        text, tokens, truncated = fit_section("user_context", source, body, budget, COUNT, whole_lines=whole_lines)
        assert tokens == COUNT(text) <= budget
        full = f'<user_context source="{source}">\n{body}\n</user_context>'
        if text and not truncated:
            assert text.endswith(f"\n{body}\n</user_context>")  # all of it, untouched
        if truncated:
            assert text.startswith("<user_context source=") and text.endswith("…\n</user_context>")
            assert COUNT(full) > budget
        if not text:
            assert budget < COUNT(full)  # left out only when it does not fit whole
    check()


def test_fit_section_keeps_whole_lines_and_leaves_out_what_cannot_fit() -> None:
    body = "\n".join(f"- satır {i}: " + TURKISH for i in range(10))
    text, tokens, truncated = fit_section("agent_memory", "src", body, 120, COUNT)
    kept = text.split("\n")[1:-1]
    assert truncated and kept and all(line.startswith("- satır") for line in kept)
    assert kept[-1].endswith(TURKISH.strip() + "…")  # whole lines, marked as cut
    assert fit_section("agent_memory", "src", body, 5, COUNT) == ("", 0, False)  # the tags alone do not fit
    assert fit_section("agent_memory", "src", "", 500, COUNT) == ("", 0, False)
    small = fit_section("identity", "request", "Ben bir asistanım.", 500, COUNT)
    assert small == ('<identity source="request">\nBen bir asistanım.\n</identity>', small[1], False)


async def test_every_layer_within_its_budget_with_long_turkish_memory(stack: Stack) -> None:
    await fill(stack, "ayse@example.org", "/repo/django", size=6)
    budgets = ContextBudgets(identity=60, agent_memory=200, user_context=300, session_summary=100, skills=50, recall=1000)
    request = ContextRequest(scopes=MemoryScopes(user="ayse@example.org", workspace="/repo/django"),
                             query="İstanbul çiğ köfte", identity=turkish(50, "Kimlik: "), skills=turkish(80, "Beceri: "),
                             budgets=budgets, timeout_ms=10_000)
    response = await ask(stack.nc, request)
    assert response.status == "ok" and not response.degraded, response.reason
    by_layer = {s.layer: s for s in response.sections}
    assert list(by_layer) == ["identity", "agent_memory", "user_context", "session_summary", "skills", "recall"]
    for section in response.sections:
        assert section.tokens == COUNT(section.text) <= section.budget == getattr(budgets, section.layer)
        assert section.truncated or section.layer == "recall", section.layer  # more than its budget
        # (recall fits its answer to the budget itself: whole past turns, not cut ones)
        assert section.text.startswith(f'<{section.tag} source="') and section.text.endswith(f"</{section.tag}>")
    assert by_layer["recall"].tag == "graphiti_memory" and "çiğ köfte" in by_layer["recall"].text
    assert by_layer["identity"].source == by_layer["skills"].source == "request"
    user_g = subjects.user_group(stack.settings.group_prefix, "ayse@example.org")
    assert by_layer["user_context"].source == f"group {user_g}: 8 preferences, 30 notes"
    assert "Preferences:\n- tercih_0: değer 0:" in by_layer["user_context"].text
    # newest promotion first, with its kind and day; chat turns of the group are not promotions
    assert "- [decision, 2026-03-02] karar 19:" in by_layer["agent_memory"].text
    assert "20 promoted memories" in by_layer["agent_memory"].source
    assert "Özet:" in by_layer["session_summary"].text and "token_limit" in by_layer["session_summary"].source
    assert response.prompt == "\n\n".join(s.text for s in response.sections)
    assert response.tokens == COUNT(response.prompt)

    # the defaults (ENGRAM_CONTEXT_BUDGET_*) with a larger memory: still within every budget
    defaults = ContextSettings()
    response = await ask(stack.nc, request.model_copy(update={"budgets": ContextBudgets()}))
    for section in response.sections:
        assert section.tokens == COUNT(section.text) <= section.budget == getattr(defaults, section.layer)
    # a budget of 0 leaves the layer out; so does a layer with no content (no workspace given)
    response = await ask(stack.nc, ContextRequest(scopes=MemoryScopes(user="ayse@example.org"), query="köfte",
                                                  budgets=ContextBudgets(recall=0, session_summary=0),
                                                  timeout_ms=10_000))
    assert [s.layer for s in response.sections] == ["user_context"]


async def test_a_failing_source_leaves_only_its_layer_out(stack: Stack) -> None:
    await fill(stack, "ali", "/repo", size=1)
    request = ContextRequest(scopes=MemoryScopes(user="ali", workspace="/repo"), query="köfte", identity="Ben asistanım.",
                             timeout_ms=2000)
    class SlowSummary(StoredSources):
        async def session_summary(self, request):  # noqa: ANN001, ANN202
            await asyncio.sleep(30)

    async def no_recall(request, timeout_s):  # noqa: ANN001, ANN202 - as when no recall service answers
        raise nats.errors.NoRespondersError

    slow = SlowSummary(stack.store, stack.settings.group_prefix, no_recall)
    started = asyncio.get_running_loop().time()
    response = await build_context(request, defaults=ContextSettings(), sources=slow, count=COUNT)
    assert asyncio.get_running_loop().time() - started < 5
    assert response.degraded and response.status == "ok"
    assert response.reason == "degraded: session_summary: timeout, recall: NoRespondersError"
    assert [s.layer for s in response.sections] == ["identity", "agent_memory", "user_context"]

    # over NATS: the graph is gone for the stored layers (FalkorDB unreachable) -> those layers
    # are left out, the request's own layers are still served
    broken = EngramSettings(nats_url=stack.settings.nats_url, graph_url="falkor://127.0.0.1:1", data_dir=stack.settings.data_dir,
                            group_prefix=stack.settings.group_prefix)
    graphs = GraphDrivers(broken)
    context = requests.ContextService(StoredSources(MemoryStore(graphs), broken.group_prefix, no_recall))
    response = await context.handle(request.model_dump_json().encode())
    assert response.degraded and [s.layer for s in response.sections] == ["identity"]
    assert {r.split(":")[0] for r in response.reason.removeprefix("degraded: ").split(", ")} == {
        "agent_memory", "user_context", "session_summary", "recall"}
    await graphs.close()


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


async def test_context_round_trip_and_bad_requests(stack: Stack) -> None:
    ok, bad_requests = sample("engram_context_requests_total", {"outcome": "ok"}), sample(
        "engram_context_requests_total", {"outcome": "bad_request"})
    identity_seen = sample("engram_context_layer_tokens_count", {"layer": "identity"})
    timed = sample("engram_context_seconds_count")
    response = await ask(stack.nc, ContextRequest(identity="Ben asistanım.", skills="- arama"))
    assert response.status == "ok" and not response.degraded
    assert [s.layer for s in response.sections] == ["identity", "skills"]
    assert response.took_ms > 0
    assert sample("engram_context_requests_total", {"outcome": "ok"}) == ok + 1
    assert sample("engram_context_layer_tokens_count", {"layer": "identity"}) == identity_seen + 1
    assert sample("engram_context_layer_tokens_sum", {"layer": "skills"}) >= response.sections[1].tokens
    bad = await ask(stack.nc, '{"budgets": {"recall": -1}, "query": "gizli içerik"}'.encode())
    assert bad.status == "error" and bad.reason.startswith("bad_request: budgets.recall")
    assert "gizli" not in bad.reason  # the request's content is never echoed
    junk = await ask(stack.nc, b"not json")
    assert junk.status == "error" and junk.reason.startswith("bad_request")
    # no scope and no query: the stored layers and recall are left out, not an error
    empty = await ask(stack.nc, ContextRequest())
    assert empty.status == "ok" and empty.sections == [] and empty.prompt == "" and empty.tokens == 0
    assert sample("engram_context_requests_total", {"outcome": "bad_request"}) == bad_requests + 2
    assert sample("engram_context_seconds_count") == timed + 4


async def test_the_session_summary_layer_chains_the_last_sessions_newest_first(stack: Stack) -> None:
    """Seed 004's next step (issue 26, item 6): the last ENGRAM_SESSION_CONTEXT_SUMMARIES (3)
    sessions' summaries, newest first, within the layer's budget: the oldest are cut first."""
    user_g = subjects.user_group(stack.settings.group_prefix, "chain@example.org")
    for day in range(4):
        await stack.store.save_session(user_g, SessionRecord(
            session_id=f"s{day}", segment=0, segment_id=f"s{day}-0-0", summary=f"Day {day}: worked on billing step {day}.",
            summary_source="llm", close_reason="idle", closed_at=T0 + timedelta(days=day)))
    request = ContextRequest(scopes=MemoryScopes(user="chain@example.org"), timeout_ms=10_000,
                             budgets=ContextBudgets(recall=0))
    layer = {s.layer: s for s in (await ask(stack.nc, request)).sections}["session_summary"]
    text = layer.text
    assert "Day 3" in text and "Day 2" in text and "Day 1" in text and "Day 0" not in text, text  # the last 3
    assert text.index("Day 3") < text.index("Day 2") < text.index("Day 1")  # newest first
    assert "[session s3 segment 0, closed 2026-03-04, idle] Day 3" in text and "last 3 sessions" in layer.source
    tight = request.model_copy(update={"budgets": ContextBudgets(recall=0, session_summary=80)})
    cut = {s.layer: s for s in (await ask(stack.nc, tight)).sections}["session_summary"]
    assert "Day 3" in cut.text and "Day 1" not in cut.text and cut.truncated and cut.tokens <= 80, cut.text
