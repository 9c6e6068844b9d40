"""One test per private-API hook in engram/compat.py, against the installed (pinned) library.

Each test exercises what engram relies on, with real NATS / FalkorDB where the hook touches
them, so a library upgrade that renames, moves or changes a hook fails here, by name, rather
than in a service. Controls (the same call without the hook) show each test can fail.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import urllib.parse
from typing import Any

import nats
import numpy as np
import pytest
from falkordb.asyncio import FalkorDB
from faststream.asgi import AsgiFastStream
from faststream.nats import JStream, NatsBroker, PullSub
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.driver.neo4j_driver import Neo4jDriver
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import ModelSize
from graphiti_core.prompts.models import Message
from pydantic import BaseModel

from engram import compat
from engram.models.delegating import DelegatingLLMClient
from engram.runtime.nats_client import server_version

# ------------------------------------------------------------------ FastStream: _create_subscription


async def _pull_subscriber(url: str, stream: str, fetching: bool) -> tuple[NatsBroker, Any, list[str]]:
    broker = NatsBroker(url)
    seen: list[str] = []
    subscriber = broker.subscriber(f"{stream.lower()}.in", stream=JStream(stream, subjects=[f"{stream.lower()}.>"]),
                                   durable="d", pull_sub=PullSub(batch_size=1, timeout=0.2))

    @subscriber
    async def handle(body: str) -> None:
        seen.append(body)

    if not fetching:
        compat.stop_fetching(subscriber)
    await broker.start()
    return broker, subscriber, seen


async def _publish(url: str, subject: str, body: bytes) -> None:
    nc = await nats.connect(url)
    await nc.jetstream().publish(subject, body)
    await nc.close()


async def _eventually(check: Any, timeout: float = 5.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if check():
            return True
        await asyncio.sleep(0.05)
    return check()


async def test_stop_fetching_leaves_consume_but_no_fetch_loop(clean_nats: str) -> None:
    # Control: an ordinary pull subscriber fetches and handles the message by itself.
    broker, _, seen = await _pull_subscriber(clean_nats, "COMPATA", fetching=True)
    try:
        await _publish(clean_nats, "compata.in", b"one")
        assert await _eventually(lambda: seen == ["one"])
    finally:
        await broker.stop()

    broker, subscriber, seen = await _pull_subscriber(clean_nats, "COMPATB", fetching=False)
    try:
        await _publish(clean_nats, "compatb.in", b"two")
        await asyncio.sleep(1.0)  # a fetch loop (batch timeout 0.2 s) would have handled it by now
        assert seen == [], "FastStream fetched although _create_subscription was replaced"
        assert subscriber.running
        # What CapacityPuller does instead: pull it, hand it to the public subscriber.consume.
        nc = await nats.connect(clean_nats)
        try:
            pull = await nc.jetstream().pull_subscribe("compatb.in", durable="d", stream="COMPATB")
            [msg] = await pull.fetch(1, timeout=2)
            await subscriber.consume(msg)
        finally:
            await nc.close()
        assert seen == ["two"]
    finally:
        await broker.stop()


def test_stop_fetching_refuses_a_subscriber_without_the_hook() -> None:
    with pytest.raises(RuntimeError, match="_create_subscription"):
        compat.stop_fetching(object())


# ------------------------------------------------------------------ FastStream: AsgiFastStream.not_found


class _Recorder:
    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)


async def _teapot(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 418, "headers": []})
    await send({"type": "http.response.body", "body": b"rest"})


async def _own(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"own"})


def _http(path: str) -> dict[str, Any]:
    return {"type": "http", "method": "GET", "path": path, "raw_path": path.encode(), "query_string": b"",
            "headers": [], "scheme": "http", "server": ("127.0.0.1", 80), "root_path": "", "http_version": "1.1"}


async def test_route_unmatched_http_sends_other_paths_to_the_rest_app() -> None:
    plain = AsgiFastStream(NatsBroker(), asgi_routes=[("/own", _own)])
    control = _Recorder()
    await plain(_http("/elsewhere"), control.receive, control.send)
    assert control.status() == 404  # FastStream's own answer, through not_found

    app = AsgiFastStream(NatsBroker(), asgi_routes=[("/own", _own)])
    compat.route_unmatched_http(app, _teapot)
    own, other = _Recorder(), _Recorder()
    await app(_http("/own"), own.receive, own.send)
    await app(_http("/elsewhere"), other.receive, other.send)
    assert (own.status(), other.status()) == (200, 418)
    ws = _Recorder()
    await app({"type": "websocket", "path": "/elsewhere", "headers": []}, ws.receive, ws.send)
    assert ws.sent and ws.sent[0]["type"] == "websocket.close"  # FastStream's fallback, not the REST app


# ------------------------------------------------------------------ graphiti: FalkorDriver internals


def _falkor(url: str) -> FalkorDB:
    parsed = urllib.parse.urlparse(url)
    return FalkorDB(host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379)


async def test_falkor_graph_and_index_build(falkordb_server: Any) -> None:
    client = _falkor(falkordb_server.url)
    driver = FalkorDriver(falkor_db=client, database="compat_graph")
    task = compat.take_index_build(driver)
    assert isinstance(task, asyncio.Task), "FalkorDriver no longer schedules its index build as _init_task"
    await task
    assert compat.take_index_build(driver) is None  # handed over: the driver forgot it
    graph = compat.falkor_graph(driver)
    assert graph.name == "compat_graph"
    result = await graph.query("RETURN 41 + 1")
    assert result.result_set == [[42]]
    indices = await graph.query("CALL db.indexes()")
    assert indices.result_set, "the awaited index build created no index"
    await graph.delete()
    await driver.close()


async def test_driver_database_reads_where_graphiti_writes_it(falkordb_server: Any) -> None:
    driver = FalkorDriver(falkor_db=_falkor(falkordb_server.url), database="g1")
    compat.take_index_build(driver).cancel()  # not started yet: nothing was sent
    assert compat.driver_database(driver) == "g1"
    assert compat.driver_database(driver.with_database("g2")) == "g2"
    assert compat.driver_database(object()) is None


async def test_take_index_build_on_neo4j() -> None:
    driver = Neo4jDriver(uri="bolt://127.0.0.1:1", user="neo4j", password="x")
    task = compat.take_index_build(driver)
    assert isinstance(task, asyncio.Task), "Neo4jDriver no longer schedules its index build as _init_task"
    task.cancel()
    assert compat.take_index_build(driver) is None
    await driver.close()


def test_normalize_name_exact_is_graphitis_key() -> None:
    assert compat.normalize_name_exact("  Alice \n\t SMITH ") == "alice smith"
    from graphiti_core.utils.maintenance import dedup_helpers

    assert "_normalize_string_exact" in inspect.getsource(dedup_helpers._build_candidate_indexes)


def test_wrap_temporal_invalidation_replaces_the_rule_resolve_extracted_edges_calls() -> None:
    from graphiti_core.utils.maintenance import edge_operations

    import engram.services.extractor.told_later  # noqa: F401 - installs engram's wrapper

    wrapper = edge_operations._apply_temporal_invalidation
    original = wrapper.__engram_wraps__
    assert list(inspect.signature(original).parameters) == ["resolved_edge", "invalidation_candidates"]
    # looked up in the module's globals at the call, by name: replacing the attribute takes effect
    assert "_apply_temporal_invalidation(resolved_edge, candidates)" in inspect.getsource(
        edge_operations.resolve_extracted_edges)
    compat.wrap_temporal_invalidation(lambda rule: rule)  # a second wrap is a no-op
    assert edge_operations._apply_temporal_invalidation is wrapper


# ------------------------------------------------------------------ bm25s: scorer selection


def test_bm25_scorers_reproduce_bm25s_scores() -> None:
    import bm25s

    corpus = [["cat", "sat", "mat"], ["dog", "sat"], ["cat", "cat", "bird", "tree", "sky"]]
    model = bm25s.BM25(method="lucene", k1=1.2, b=0.75)
    model.index(bm25s.tokenization.Tokenized(
        ids=[[{"cat": 0, "sat": 1, "mat": 2, "dog": 3, "bird": 4, "tree": 5, "sky": 6}[t] for t in d] for d in corpus],
        vocab={"cat": 0, "sat": 1, "mat": 2, "dog": 3, "bird": 4, "tree": 5, "sky": 6}), show_progress=False)
    expected = model.get_scores(["cat"])

    idf = compat.bm25_idf_scorer("lucene")(2, N=3)  # "cat" is in 2 of 3 documents
    assert math.isclose(idf, math.log(1 + (3 - 2 + 0.5) / (2 + 0.5)), rel_tol=1e-6)
    lengths = np.array([len(d) for d in corpus], dtype=np.float32)
    tf = np.array([d.count("cat") for d in corpus], dtype=np.float32)
    tfc = compat.bm25_tfc_scorer("lucene")(tf_array=tf, l_d=lengths, l_avg=lengths.mean(), k1=1.2, b=0.75, delta=0.5)
    np.testing.assert_allclose(idf * tfc, expected, rtol=1e-5)


# ------------------------------------------------------------------ graphiti: the LLMClient contract


class _Answer(BaseModel):
    answer: str


def test_generate_response_is_graphitis_abstract_subclass_hook() -> None:
    assert "_generate_response" in LLMClient.__abstractmethods__
    params = inspect.signature(LLMClient._generate_response).parameters
    assert list(params) == ["self", "messages", "response_model", "max_tokens", "model_size", "model"]
    assert params["model"].kind is inspect.Parameter.KEYWORD_ONLY  # splatted only when set


async def test_generate_response_reaches_the_subclass_and_the_delegating_wrapper_forwards() -> None:
    calls: list[tuple[Any, ...]] = []

    class Fixed(LLMClient):
        async def _generate_response(self, messages: list[Message], response_model: Any = None,
                                     max_tokens: int = 0, model_size: ModelSize = ModelSize.medium) -> dict[str, Any]:
            calls.append((len(messages), response_model, model_size))
            return {"answer": "42"}

    inner = Fixed(None, cache=False)
    messages = [Message(role="system", content="s"), Message(role="user", content="q")]
    assert await inner.generate_response(messages, _Answer) == {"answer": "42"}
    assert calls == [(2, _Answer, ModelSize.medium)]
    wrapper = DelegatingLLMClient(inner)
    assert await wrapper._generate_response([Message(role="user", content="q")], _Answer) == {"answer": "42"}
    assert len(calls) == 2


async def test_generate_with_retry_keeps_graphitis_retry_policy() -> None:
    import json

    from tenacity import wait_none

    policy = LLMClient._generate_response_with_retry.retry  # type: ignore[attr-defined]
    assert policy.stop.max_attempt_number == 4
    answers: list[Any] = [json.JSONDecodeError("cut", "", 0), {"answer": "ok"}]

    class Flaky(LLMClient):
        async def _generate_response(self, messages: Any, response_model: Any = None, max_tokens: int = 0,
                                     model_size: ModelSize = ModelSize.medium, *, model: str | None = None) -> Any:
            answer = answers.pop(0)
            if isinstance(answer, Exception):
                raise answer
            return {**answer, "model": model, "max_tokens": max_tokens}

    client = Flaky(None, cache=False)
    fast = LLMClient._generate_response_with_retry.retry_with(wait=wait_none())  # type: ignore[attr-defined]
    client._generate_response_with_retry = fast.__get__(client)  # the same policy without the 5 s+ waits
    result = await compat.generate_with_retry(client, [Message(role="user", content="q")], _Answer,
                                              max_tokens=7, model_size=ModelSize.small, model="m")
    assert result == {"answer": "ok", "model": "m", "max_tokens": 7} and answers == []


def test_graphiti_llm_input_helpers() -> None:
    from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient

    client = OpenAIGenericClient(client=object())  # no request is made
    assert compat.clean_llm_input(client, "a\u200bb\x00c\nd\te") == "abc\nd\te"
    assert compat.strip_code_fences(client, '```json\n{"a": 1}\n```') == '{"a": 1}'
    assert compat.strip_code_fences(client, '{"a": 1}') == '{"a": 1}'
    plain = [Message(role="system", content="sys"), Message(role="user", content="u")]
    compat.apply_attribute_extraction_preamble(client, plain, False)
    assert plain[0].content == "sys"
    framed = [Message(role="system", content="sys"), Message(role="user", content="u")]
    compat.apply_attribute_extraction_preamble(client, framed, True)
    assert framed[0].content != "sys" and "sys" in framed[0].content and framed[1].content == "u"


# ------------------------------------------------------------------ nats-py: public server version


async def test_server_version_uses_public_api(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        version = server_version(nc)
        assert version == nc._server_info["version"]  # the private field it replaced agrees
        assert version.count(".") >= 2 and version.split(".")[0].isdigit()
    finally:
        await nc.close()


# ------------------------------------------------------------------ nats-py: a JetStreamContext's connection


async def test_jetstream_connection_is_the_client_it_came_from(nats_url: str) -> None:
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        assert compat.jetstream_connection(js) is nc
        # what engram/runtime/dlq.py reads from it: the server's limit, as the server announced it
        assert compat.jetstream_connection(js).max_payload == nc._server_info["max_payload"] > 0
    finally:
        await nc.close()


def test_jetstream_connection_refuses_a_context_without_the_hook() -> None:
    with pytest.raises(RuntimeError, match="_nc"):
        compat.jetstream_connection(object())


def test_only_compat_reads_a_jetstream_contexts_connection() -> None:
    """nats-py's private ``_nc`` is read in engram/compat.py only (engram/runtime/dlq.py used to read it)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    private = re.compile(r"(?<!self)\._nc\b|[\"']_nc[\"']")
    readers = [str(path.relative_to(root)) for top in ("engram", "services", "schemas")
               for path in sorted((root / top).rglob("*.py"))
               if path.name != "compat.py" and private.search(path.read_text(encoding="utf-8"))]
    assert readers == []
