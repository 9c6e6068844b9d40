"""One turn is one trace, end to end, and no span carries message content (issue 14 item 1).

The real publisher (engram.publishing.ingest.publish_events, what ``engram ingest`` runs), turn-detector,
extractor (rules LLM) and summary-gate run in-process against real NATS JetStream and FalkorDB;
every service's TracerProvider exports to an in-memory exporter instead of OTLP/HTTP.
The turn is closed by a SessionClosed published in a *different* trace (as a close from another
process would be): the turn's episode must still continue the trace of the turn's messages.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engram.observability import graphiti_tracing, tracing
from engram.publishing.ingest import publish_events
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import SessionClosed, subjects
from engram.services.extractor import app as ex_app
from engram.services.summary_gate import app as sg_app
from engram.services.turn_detector import app as td_app
from tests.services.summary_gate.helpers import STAGES, new_session
from tests.services.turn_detector.helpers import T0, msg, wait_for

USER_TEXT = "Ada adopted a quokka named Zanzibar in Reykjavik."
BOT_TEXT = "Zanzibar the quokka sounds delightful, Ada."
SECRET_WORDS = ("quokka", "zanzibar", "reykjavik", "adopted", "delightful")
OTHER_TRACE = "0af7651916cd43dd8448eb211c80319c"


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    monkeypatch.setattr(tracing, "_exporter", lambda endpoint: memory)
    tracing.shutdown()  # no provider left over from another test
    yield memory
    tracing.shutdown()


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return [str(value)]


def _all_text(span: Any) -> list[str]:
    """Every string a span exports: name, attributes, events, links, status, resource."""
    out = [span.name, span.status.description or ""]
    for attrs in [span.attributes or {}, span.resource.attributes,
                  *[e.attributes or {} for e in span.events], *[link.attributes or {} for link in span.links]]:
        for key, value in attrs.items():
            out += [key, *_strings(value)]
    out += [e.name for e in span.events]
    return out


async def test_one_turn_is_one_trace_with_llm_spans_and_no_content(
    clean_nats: str, falkordb_server: Any, tmp_path: Path, exporter: InMemorySpanExporter,
) -> None:
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(max_deliveries=2), otel_endpoint="http://127.0.0.1:9")
    session = new_session("trace")
    services = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient()),
                sg_app.build(settings, llm=RulesExtractorClient())]
    for service in services:
        await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        tracing.provider_for(settings.otel_endpoint, "ingest")
        await publish_events(js, [msg(session, "u1", "user", USER_TEXT, 0), msg(session, "a1", "assistant", BOT_TEXT, 1)])
        # the close comes from elsewhere, in its own trace
        await js.publish(subjects.in_close(session), SessionClosed(session_id=session, closed_at=T0).model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: f"close-{session}", "traceparent": f"00-{OTHER_TRACE}-00f067aa0ba902b7-01"})

        async def settled() -> bool:
            for stream, prefix in STAGES:
                mine = [c for c in await js.consumers_info(stream) if c.name.startswith(prefix)]
                if not mine or any(c.num_pending or c.num_ack_pending for c in mine):
                    return False
            return any(s.resource.attributes.get("service.name") == "engram-summary-gate"
                       for s in _flushed(exporter))

        assert await wait_for(settled, 60, 0.2), "the turn did not reach the summary-gate"
        spans = _flushed(exporter)
    finally:
        await nc.close()
        for service in reversed(services):
            await service.stop()

    ingest = [s for s in spans if s.name == "engram.ingest.turn"]
    assert len(ingest) == 1, [s.name for s in spans]
    trace_id = ingest[0].context.trace_id
    in_turn = [s for s in spans if s.context.trace_id == trace_id]
    by_service: dict[str, list[Any]] = {}
    for s in in_turn:
        by_service.setdefault(s.resource.attributes["service.name"], []).append(s)
    assert {"engram-ingest", "engram-turn-detector", "engram-extractor", "engram-summary-gate"} <= set(by_service), \
        sorted(by_service)
    # the extractor and the summary-gate handled the turn in the turn's trace, not the close's
    assert not [s for s in spans if s.context.trace_id == int(OTHER_TRACE, 16)
                and s.resource.attributes["service.name"] in ("engram-extractor", "engram-summary-gate")]

    calls = [s for s in by_service["engram-extractor"] if s.name == "engram.llm.call"]
    assert calls, [s.name for s in by_service["engram-extractor"]]
    for call in calls:
        assert call.attributes["prompt.name"] and call.attributes["engram.stage"] == "extractor"
        assert call.attributes["llm.client"] == "RulesExtractorClient"
        assert call.attributes["llm.tokens.input"] > 0 and call.attributes["llm.tokens.output"] > 0
        assert call.parent is not None  # a child of the extractor's consume span
    generate = [s for s in by_service["engram-extractor"] if s.name == "graphiti.llm.generate"]
    assert generate, "graphiti's own LLM spans are missing (graphiti got no tracer)"
    call_ids = {c.context.span_id for c in calls}
    assert all(g.parent is not None and g.parent.span_id in call_ids for g in generate)
    assert all(g.attributes.get("prompt.name") for g in generate)

    for span in spans:
        text = " ".join(_all_text(span)).casefold()
        leaked = [w for w in SECRET_WORDS if w in text]
        assert not leaked, f"span {span.name} ({span.resource.attributes['service.name']}) holds {leaked}"


def _flushed(exporter: InMemorySpanExporter) -> list[Any]:
    for provider in list(tracing._PROVIDERS.values()):
        provider.force_flush()
    return list(exporter.get_finished_spans())


def test_graphiti_span_attributes_are_filtered() -> None:
    """ContentSafeTracer drops string attributes it does not know, exception text and status text."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = graphiti_tracing.ContentSafeTracer(provider.get_tracer("t"))
    with tracer.start_span("llm.generate") as span:
        span.add_attributes({"prompt.name": "extract_nodes", "max_tokens": 10, "query": "my quokka", "cache.hit": False})
        span.set_status("error", "ValueError: could not parse 'my quokka'")
        span.record_exception(ValueError("my quokka"))
    (done,) = memory.get_finished_spans()
    assert dict(done.attributes) == {"prompt.name": "extract_nodes", "max_tokens": 10, "cache.hit": False,
                                     "exception.type": "ValueError"}
    assert not done.events and not done.status.description


async def test_the_readme_publishing_example_sends_the_trace_context(clean_nats: str, tmp_path: Path) -> None:
    """The README's Python example, run with an OpenTelemetry SDK configured (as an agent that
    traces would be), puts its span's traceparent on the published message."""
    import os
    import subprocess
    import sys

    from engram.runtime.topology import Topology, ensure_topology
    from tests.services.turn_detector.helpers import read_all
    from tests.test_readme import ROOT, readme_blocks

    block = next(b for b in readme_blocks() if b.heading == "Publishing from your agent" and b.language == "python")
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        await ensure_topology(js, Topology.from_settings(EngramSettings(nats_url=clean_nats, data_dir=tmp_path)))
        script = tmp_path / "publish.py"
        script.write_text("from opentelemetry import trace\nfrom opentelemetry.sdk.trace import TracerProvider\n"
                          "trace.set_tracer_provider(TracerProvider())\n" + block.text)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")},
               "ENGRAM_NATS_URL": clean_nats, "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        stored = await read_all(js, subjects.STREAM_IN)
    finally:
        await nc.close()
    assert len(stored) == 2
    parents = [m.headers.get("traceparent", "") for m in stored]
    assert all(p.startswith("00-") and len(p) == 55 for p in parents), parents
    assert parents[0].split("-")[1] != parents[1].split("-")[1]  # one trace per turn (two sessions here)


def test_turn_spans_follow_the_turn_detectors_turn_boundaries(exporter: InMemorySpanExporter) -> None:
    """Publisher side (gateway, engram ingest): a user message after an assistant message starts a
    new trace; the assistant reply and a close stay in their turn's trace; sessions do not mix."""
    tracing.provider_for("http://127.0.0.1:9", "gateway")
    turns = tracing.TurnSpans("gateway", "engram.gateway.turn")
    trace_of = lambda session, role: turns.headers_for(session, role, {})["traceparent"].split("-")[1]  # noqa: E731
    u1, a1, s2 = trace_of("s", "user"), trace_of("s", "assistant"), trace_of("other", "user")
    u2, t2, close = trace_of("s", "user"), trace_of("s", "tool"), trace_of("s", None)
    assert u1 == a1 and u2 == t2 == close and len({u1, u2, s2}) == 3
    turns.end()
    tracing._PROVIDERS["gateway"].force_flush()
    assert len([s for s in exporter.get_finished_spans() if s.name == "engram.gateway.turn"]) == 3
    assert tracing.TurnSpans("recall", "x").headers_for("s", "user", {}) == {}  # tracing off for that service


async def test_recall_spans_hold_no_query_text(
    clean_nats: str, falkordb_server: Any, tmp_path: Path, exporter: InMemorySpanExporter,
) -> None:
    from engram.schemas import RecallRequest, RecallResponse, RecallScopes
    from engram.services.recall import app as rc_app
    from tests.services.recall.test_service import ingest

    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              otel_endpoint="http://127.0.0.1:9")
    session = new_session("rtrace")
    apps = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient()), rc_app.build(settings)]
    for app in apps:
        await app.start()
    nc = await nats.connect(clean_nats)
    try:
        await ingest(nc, session, [("user", USER_TEXT, "Ada"), ("assistant", BOT_TEXT, None)])
        request = RecallRequest(query="Where does the quokka Zanzibar live?", scopes=RecallScopes(session=session),
                                timeout_ms=5000)
        reply = await nc.request(subjects.RECALL, request.model_dump_json().encode(), timeout=10)
        assert RecallResponse.model_validate_json(reply.data).items
        spans = _flushed(exporter)
    finally:
        await nc.close()
        for app in reversed(apps):
            await app.stop()
    # recall's own hybrid search answers here; graphiti's search (and its spans) is its fallback
    recall = [s for s in spans if s.resource.attributes["service.name"] == "engram-recall"]
    assert any(s.name == "engram.recall process" for s in recall), sorted({s.name for s in recall})
    for span in spans:
        text = " ".join(_all_text(span)).casefold()
        assert not [w for w in (*SECRET_WORDS, "live?") if w in text], span.name


async def test_the_gateway_publishes_a_turns_messages_in_one_trace(
    clean_nats: str, tmp_path: Path, exporter: InMemorySpanExporter,
) -> None:
    """POST /messages with two turns: each turn's messages carry their turn's traceparent (from an
    ``engram.gateway.turn`` span), the two turns are two traces."""
    import uuid

    from tests.services.gateway.test_gateway import serve_gateway, turn
    from tests.services.turn_detector.helpers import read_all

    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=1, otel_endpoint="http://127.0.0.1:9")
    group = f"gwtrace-{uuid.uuid4().hex[:8]}"
    async with serve_gateway(settings) as http:
        r = await http.post("/messages", json={"group_id": group, "messages": turn() + turn("Second question?", "Yes.")})
        assert r.status_code == 202, r.text
    nc = await nats.connect(clean_nats)
    try:
        stored = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
    finally:
        await nc.close()
    traces = [m.headers.get("traceparent", "--").split("-")[1] for m in stored]
    assert len(traces) == 4 and traces[0] == traces[1] != traces[2] == traces[3], traces
    assert all(traces)
    spans = [s for s in exporter.get_finished_spans() if s.name == "engram.gateway.turn"]
    assert {format(s.context.trace_id, "032x") for s in spans} == set(traces)


async def test_llm_call_span_has_prompt_model_and_tokens_and_no_error_text() -> None:
    """engram.llm.call: stage, prompt, the configured model for the call's size, token counts; a
    failing call records only the exception type (its message may quote the conversation)."""
    from graphiti_core.llm_client.client import LLMClient
    from graphiti_core.llm_client.config import LLMConfig, ModelSize
    from graphiti_core.prompts.models import Message
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from engram.models.accounting import AccountingLLMClient

    class Scripted(LLMClient):
        async def _generate_response(self, messages, response_model=None, max_tokens=None,  # noqa: ANN001, ANN202
                                     model_size=ModelSize.medium, **kw):
            if "boom" in messages[-1].content:
                raise ValueError("could not parse: my quokka")
            return {"answer": "fine thanks"}

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    otel = provider.get_tracer("t")
    llm = AccountingLLMClient(Scripted(LLMConfig(model="big-model", small_model="small-model"), cache=False), stage="unit")
    llm.set_tracer(graphiti_tracing.ContentSafeTracer(otel))
    await llm.generate_response([Message(role="system", content="s"), Message(role="user", content="how are you " * 20)],
                                model_size=ModelSize.small, prompt_name="demo.ask")
    with pytest.raises(ValueError):
        await llm.generate_response([Message(role="system", content="s"), Message(role="user", content="boom")],
                                    prompt_name="demo.fail")
    calls = {s.attributes["prompt.name"]: s for s in memory.get_finished_spans() if s.name == "engram.llm.call"}
    ok, failed = calls["demo.ask"], calls["demo.fail"]
    assert ok.attributes["llm.model"] == "small-model" and ok.attributes["engram.stage"] == "unit"
    assert ok.attributes["llm.tokens.input"] >= 60 and ok.attributes["llm.tokens.output"] > 0
    assert failed.attributes["llm.model"] == "big-model" and failed.attributes["exception.type"] == "ValueError"
    assert not failed.status.description and not failed.events
    generate = [s for s in memory.get_finished_spans() if s.name == "graphiti.llm.generate"]
    assert len(generate) == 2 and all(g.parent.span_id in {ok.context.span_id, failed.context.span_id} for g in generate)
    for span in memory.get_finished_spans():
        assert "quokka" not in " ".join(_all_text(span)), span.name


async def test_the_gateway_continues_the_callers_trace(clean_nats: str, tmp_path: Path,
                                                       exporter: InMemorySpanExporter) -> None:
    """A ``traceparent`` header on POST /messages: the turns' spans are children of the caller's."""
    import uuid

    from tests.services.gateway.test_gateway import serve_gateway, turn
    from tests.services.turn_detector.helpers import read_all

    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=1, otel_endpoint="http://127.0.0.1:9")
    caller = "4bf92f3577b34da6a3ce929d0e0e4736"
    async with serve_gateway(settings) as http:
        r = await http.post("/messages", json={"group_id": f"gwcaller-{uuid.uuid4().hex[:8]}", "messages": turn()},
                            headers={"traceparent": f"00-{caller}-00f067aa0ba902b7-01"})
        assert r.status_code == 202, r.text
        operation = (await http.get("/openapi.json")).json()["paths"]["/messages"]["post"]
        # the trace header is no parameter of the contract (Idempotency-Key, issue 23, is the only one)
        assert [p["name"] for p in operation.get("parameters", [])] == ["Idempotency-Key"]
    nc = await nats.connect(clean_nats)
    try:
        stored = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
    finally:
        await nc.close()
    assert [m.headers["traceparent"].split("-")[1] for m in stored] == [caller, caller]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "engram.gateway.turn"]
    assert span.parent is not None and span.parent.span_id == 0x00F067AA0BA902B7
