"""The gateway over a real socket (uvicorn on a free loopback port) with real NATS JetStream and
FalkorDB, and the pipeline in-process (turn-detector -> extractor, recall with graph admin).

The first test is seed 003's curl checks as HTTP calls, end to end; the others check the
contract's edges: create-with-uuid idempotency, validation, the API key, and that a 202 is
never given for a message the broker did not store."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest
from falkordb.asyncio import FalkorDB

from bench._serve import serve_asgi
from engram.stack.embedded import start_nats
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import ChatMessage, Episode, subjects
from engram.services.extractor import app as ex_app
from engram.services.gateway import app as gw_app
from engram.services.gateway.settings import GatewaySettings
from engram.services.recall import app as recall_app
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import read_all, wait_for

ADA = "I moved the API from Flask to FastAPI and pinned pydantic==2.14 in pyproject.toml."
BOT = "Good call: FastAPI uses pydantic for validation."


@contextlib.asynccontextmanager
async def serve_gateway(settings: EngramSettings, gateway: GatewaySettings | None = None) -> AsyncIterator[httpx.AsyncClient]:
    """`engram serve gateway` in-process: the service's ASGI app under uvicorn on a real socket."""
    async with serve_asgi(gw_app.build(settings, gateway or GatewaySettings()).asgi()) as url, \
            httpx.AsyncClient(base_url=url, timeout=30) as client:
        yield client


@contextlib.asynccontextmanager
async def pipeline(settings: EngramSettings) -> AsyncIterator[None]:
    services = [td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient()), recall_app.build(settings)]
    started = []
    try:
        for s in services:
            await s.start()
            started.append(s)
        yield
    finally:
        for s in reversed(started):
            await s.stop()


def settings_for(nats_url: str, tmp_path: Path, graph_url: str | None = None) -> EngramSettings:
    return EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                          turn=TurnDetectorSettings(idle_timeout_s=1))


def turn(user: str = ADA, bot: str = BOT, **extra: Any) -> list[dict[str, Any]]:
    return [
        {"role_type": "user", "role": "Ada", "content": user, "timestamp": "2026-03-01T09:00:00Z", **extra},
        {"role_type": "assistant", "role": "", "content": bot, "timestamp": "2026-03-01T09:00:05Z", **extra},
    ]


async def stored_messages(nats_url: str) -> list[ChatMessage]:
    nc = await nats.connect(nats_url)
    try:
        msgs = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
        return [ChatMessage.model_validate_json(m.data) for m in msgs]
    finally:
        await nc.close()


async def episode_groups(nats_url: str) -> list[str]:
    nc = await nats.connect(nats_url)
    try:
        return [Episode.model_validate_json(m.data).group_id for m in await read_all(nc.jetstream(), subjects.STREAM_EPISODES)]
    finally:
        await nc.close()


async def graph_count(graph_url: str, group: str, query: str) -> int:
    host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
    db = FalkorDB(host=host, port=int(port))
    try:
        return (await db.select_graph(group).ro_query(query)).result_set[0][0]
    finally:
        await db.aclose()


ORPHANS = "MATCH (n:Entity) WHERE NOT ()-[:MENTIONS]->(n) AND NOT (n)-[:RELATES_TO]-() RETURN count(n)"


async def episodes_of(client: httpx.AsyncClient, group: str, n: int, timeout: float = 40) -> list[dict]:
    async def got() -> list[dict] | None:
        r = await client.get(f"/episodes/{group}", params={"last_n": 10})
        assert r.status_code == 200, r.text
        # the extractor stores an episode's message ids just after the episode node: wait for both
        return r.json() if len(r.json()) >= n and all(e["message_ids"] for e in r.json()) else None

    return await wait_for(got, timeout, interval=0.25) or []


@pytest.mark.slow
async def test_seed_003_curl_checks_end_to_end(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group = f"copilot-chat-smoke-{uuid.uuid4().hex[:8]}"
    async with pipeline(settings), serve_gateway(settings) as http:
        # curl -fsS http://graph:8000/healthcheck ; /openapi.json ; engram's own endpoints too
        r = await http.get("/healthcheck")
        assert r.status_code == 200 and r.json() == {"status": "healthy"}
        spec = (await http.get("/openapi.json")).json()
        assert {"/messages", "/search", "/get-memory", "/episodes/{group_id}", "/entity-edge/{uuid}",
                "/group/{group_id}", "/episode/{uuid}", "/healthcheck"} <= set(spec["paths"])
        assert (await http.get("/docs")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).status_code in (200, 204)

        # an unknown edge is a 404 with a JSON detail, never a 500
        r = await http.get("/entity-edge/not_a_real_uuid")
        assert r.status_code == 404 and "not found" in r.json()["detail"]

        # write: 202 once JetStream stored both messages
        ids = [str(uuid.uuid4()), str(uuid.uuid4())]
        msgs = turn()
        for m, i in zip(msgs, ids):
            m["uuid"] = i
        r = await http.post("/messages", json={"group_id": group, "messages": msgs})
        assert r.status_code == 202, r.text
        assert r.json() == {"message": "Messages added to processing queue", "success": True}

        # the turn completes on idle (1 s) into an episode of exactly this group ...
        written_to = await wait_for(lambda: episode_groups(clean_nats), 20)
        assert set(written_to) == {group}, f"the turn went to {written_to}, not to the client's group {group}"
        # ... and the extractor writes it: the episode appears
        episodes = await episodes_of(http, group, 1)
        assert len(episodes) == 1, episodes
        episode = episodes[0]
        assert episode["group_id"] == group and ADA in episode["content"] and BOT in episode["content"]
        assert episode["message_ids"] == ids, "provenance names the client's message uuids"
        assert episode["entity_edges"]

        # search and get-memory return facts
        r = await http.post("/search", json={"group_ids": [group], "query": "FastAPI pydantic", "max_facts": 3})
        assert r.status_code == 200, r.text
        facts = r.json()["facts"]
        assert 1 <= len(facts) <= 3 and all({"uuid", "name", "fact", "valid_at", "invalid_at", "created_at",
                                              "expired_at"} <= set(f) for f in facts)
        assert any("FastAPI" in f["fact"] for f in facts)
        # as of a time before it was said, none of it was true yet; ranges and relations narrow it
        r = await http.post("/search", json={"group_ids": [group], "query": "FastAPI pydantic", "as_of": "2001-01-01T00:00:00Z"})
        assert r.status_code == 200 and r.json()["facts"] == [], r.text
        r = await http.post("/search", json={"group_ids": [group], "query": "FastAPI pydantic",
                                             "valid_at": {"after": "2001-01-01T00:00:00Z"}})
        assert any("FastAPI" in f["fact"] for f in r.json()["facts"]), r.text
        r = await http.post("/search", json={"group_ids": [group], "query": "FastAPI pydantic", "edge_types": ["NO_SUCH"]})
        assert r.status_code == 200 and r.json()["facts"] == [], r.text
        r = await http.post("/get-memory", json={"group_id": group, "max_facts": 5, "center_node_uuid": None,
                                                 "messages": [{"role_type": "user", "role": "Ada",
                                                               "content": "pydantic in pyproject.toml"}]})
        assert r.status_code == 200 and r.json()["facts"], (r.text, r.headers, facts)

        # get and delete an existing edge
        edge = facts[0]
        r = await http.get(f"/entity-edge/{edge['uuid']}")
        assert r.status_code == 200 and r.json()["fact"] == edge["fact"] and r.json()["group_id"] == group
        r = await http.delete(f"/entity-edge/{edge['uuid']}")
        assert r.status_code == 200 and r.json() == {"message": "Entity Edge deleted", "success": True}
        assert (await http.get(f"/entity-edge/{edge['uuid']}")).status_code == 404
        assert (await http.delete(f"/entity-edge/{edge['uuid']}")).status_code == 404

        # delete the episode: no entity is left without edges
        assert await graph_count(falkordb_server.url, group, "MATCH (n:Entity) RETURN count(n)") > 0
        r = await http.delete(f"/episode/{episode['uuid']}")
        assert r.status_code == 200 and r.json()["success"] is True
        assert await graph_count(falkordb_server.url, group, ORPHANS) == 0
        assert await graph_count(falkordb_server.url, group, "MATCH (n:Entity) RETURN count(n)") == 0
        assert (await http.get(f"/episodes/{group}")).json() == []
        assert (await http.delete(f"/episode/{episode['uuid']}")).status_code == 404

        # another turn, then delete the group: no episodes left
        r = await http.post("/messages", json={"group_id": group, "messages": turn(
            "We deploy FastAPI with Docker and run pytest in CI.", "Docker keeps the image reproducible.")})
        assert r.status_code == 202
        assert len(await episodes_of(http, group, 1)) == 1
        r = await http.delete(f"/group/{group}")
        assert r.status_code == 200 and r.json() == {"message": "Group deleted", "success": True}
        assert (await http.get(f"/episodes/{group}", params={"last_n": 5})).json() == []
        r = await http.post("/search", json={"group_ids": [group], "query": "Docker", "max_facts": 3})
        assert r.status_code == 200 and r.json() == {"facts": []}

        metrics = (await http.get("/metrics")).text
        assert 'engram_gateway_messages_total{outcome="stored"}' in metrics
        assert 'route="/episodes/{group_id}"' in metrics, "HTTP metrics use route templates, not group ids"


async def test_client_uuid_is_create_with_uuid_and_idempotent(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    async with serve_gateway(settings) as http:
        mid = str(uuid.uuid4())
        body = {"group_id": "g_idem", "messages": [{"uuid": mid, "role_type": "user", "role": "Ada",
                                                      "content": "hello", "name": "copilotchat.turn.1.user"}]}
        for _ in range(2):
            r = await http.post("/messages", json=body)
            assert r.status_code == 202, r.text
        # the same uuid in another group is another message (scoped dedupe), not a duplicate
        assert (await http.post("/messages", json={**body, "group_id": "g_idem_ws"})).status_code == 202
        # no uuid: a retried POST with the same timestamp is recognised as well
        retry = {"group_id": "g_idem", "messages": [{"role_type": "assistant", "role": None, "content": "hi Ada",
                                                       "timestamp": "2026-03-01T09:00:05+00:00"}]}
        for _ in range(2):
            assert (await http.post("/messages", json=retry)).status_code == 202
        # two equal messages without timestamps in one request are two messages
        twice = {"group_id": "g_idem", "messages": [{"role_type": "user", "content": "ok"}] * 2}
        assert (await http.post("/messages", json=twice)).status_code == 202
        metrics = (await http.get("/metrics")).text

    stored = await stored_messages(clean_nats)
    assert [(m.session_id, m.message_id) for m in stored][:3] == [("g_idem", mid), ("g_idem_ws", mid),
                                                                  ("g_idem", stored[2].message_id)]
    assert len(stored) == 5, [(m.session_id, m.message_id, m.content) for m in stored]
    first = stored[0]
    assert first.scopes.group == "g_idem" and first.scopes.session is True
    assert first.role == "user" and first.name == "Ada" and first.metadata == {"name": "copilotchat.turn.1.user"}
    assert stored[2].role == "assistant" and stored[2].name is None
    assert stored[2].timestamp == datetime(2026, 3, 1, 9, 0, 5, tzinfo=timezone.utc)
    assert stored[3].content == stored[4].content == "ok" and stored[3].timestamp < stored[4].timestamp
    assert 'engram_gateway_messages_total{outcome="duplicate"}' in metrics


async def test_validation_errors_are_clear_422s(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    async with serve_gateway(settings) as http:
        r = await http.post("/messages", json={"group_id": "bad.group/id", "messages": turn()})
        assert r.status_code == 422
        (err,) = r.json()["detail"]
        assert err["loc"] == ["body", "group_id"] and "ASCII letters, digits, '_' and '-'" in err["msg"]
        r = await http.get("/episodes/bad.group")
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["path", "group_id"]
        assert "ASCII letters" in r.json()["detail"][0]["msg"]
        r = await http.post("/search", json={"group_ids": ["ok", "no way"], "query": "x"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "group_ids", 1]
        r = await http.post("/messages", json={"group_id": "g", "messages": [{"role_type": "tool", "content": "secret"}]})
        assert r.status_code == 422 and "role_type" in r.json()["detail"][0]["loc"]
        assert "secret" not in r.text, "message content is not echoed back"
        r = await http.post("/messages", json={"group_id": "g" * 129, "messages": turn()})
        assert r.status_code == 422
        r = await http.post("/messages", json={"group_id": "g", "messages": [{"role_type": "user", "content": "x",
                                                                             "uuid": "has space"}]})
        assert r.status_code == 422
        r = await http.post("/search", json={"group_ids": ["g"] * 51, "query": "x"})  # none = all groups (test_graphiti_gaps)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "group_ids"]
        assert (await http.post("/search", json={"group_ids": ["g"], "query": "x", "max_facts": 0})).status_code == 422
        r = await http.post("/search", json={"group_ids": ["g"], "query": "x", "as_of": "2026-09-15T00:00:00"})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "as_of"]  # a time needs its zone
        r = await http.post("/search", json={"group_ids": ["g"], "query": "x", "valid_at": {
            "after": "2026-10-01T00:00:00Z", "before": "2026-09-01T00:00:00Z"}})
        assert r.status_code == 422 and "before is earlier than after" in r.text
        r = await http.post("/search", json={"group_ids": ["g"], "query": "x", "min_similarity": 1.5})
        assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "min_similarity"]
    assert await stored_messages(clean_nats) == []


async def test_api_key(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    body = {"group_id": "g_key", "messages": turn()}
    async with serve_gateway(settings, GatewaySettings(api_key="s3cret")) as http:
        assert (await http.get("/healthcheck")).status_code == 200
        assert (await http.get("/openapi.json")).status_code == 200
        r = await http.post("/messages", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert (await http.post("/messages", json=body, headers={"x-api-key": "wrong"})).status_code == 401
        assert (await http.get("/episodes/g_key", headers={"Authorization": "Bearer wrong"})).status_code == 401
        assert (await http.delete("/group/g_key")).status_code == 401
        assert (await http.post("/messages", json=body, headers={"x-api-key": "s3cret"})).status_code == 202
        r = await http.post("/messages", json=body, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 202
    assert len(await stored_messages(clean_nats)) == 2, "only the authorised POSTs stored (the second deduplicated)"


async def test_no_202_for_a_message_the_broker_did_not_store(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    async with serve_gateway(settings, GatewaySettings(publish_timeout_s=1)) as http:
        assert (await http.post("/messages", json={"group_id": "g_503", "messages": turn()})).status_code == 202
        nc = await nats.connect(clean_nats)
        try:
            await nc.jetstream().delete_stream(subjects.STREAM_IN)  # nothing takes engram.in.* any more
        finally:
            await nc.close()
        r = await http.post("/messages", json={"group_id": "g_503", "messages": turn("something new", "noted")})
        assert r.status_code == 503, r.text
        assert "did not confirm message 1 of 2" in r.json()["detail"] and r.headers["retry-after"] == "1"
        assert "something new" not in r.text
        # no recall service runs here: reads are 503 too, never a 200 that pretends
        assert (await http.post("/search", json={"group_ids": ["g_503"], "query": "x"})).status_code == 503
        assert (await http.get("/episodes/g_503")).status_code == 503
        assert (await http.get("/entity-edge/x")).status_code == 503
        metrics = (await http.get("/metrics")).text
    assert 'engram_gateway_messages_total{outcome="failed"}' in metrics


async def test_no_202_when_nats_is_down(tmp_path) -> None:  # noqa: ANN001
    server = start_nats(tmp_path / "own-nats")
    try:
        settings = settings_for(server.url, tmp_path)
        async with serve_gateway(settings, GatewaySettings(publish_timeout_s=1)) as http:
            assert (await http.post("/messages", json={"group_id": "g_down", "messages": turn()})).status_code == 202
            server.stop()
            r = await http.post("/messages", json={"group_id": "g_down", "messages": turn("after the crash", "ok")})
            assert r.status_code == 503, r.text
            assert (await http.get("/healthcheck")).status_code == 200, "liveness is not readiness"
    finally:
        if server.alive():
            server.stop()


async def test_promote_stores_a_durable_memory_once(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    body = {"kind": "decision", "text": "We pin every direct dependency in pyproject.toml.", "scope": "workspace",
            "key": "billing-repo", "rationale": "CI must match laptops"}
    async with serve_gateway(settings) as http:
        first = await http.post("/promote", json=body)
        again = await http.post("/promote", json=body)
        assert first.status_code == again.status_code == 202, first.text
        assert first.json() == again.json()
        assert first.json()["group_id"] == subjects.workspace_group(settings.group_prefix, "billing-repo")
        bad = await http.post("/promote", json={**body, "kind": "gossip"})
        assert bad.status_code == 422
    nc = await nats.connect(clean_nats)
    try:
        stored = await read_all(nc.jetstream(), subjects.STREAM_EPISODES)
    finally:
        await nc.close()
    assert len(stored) == 1
    episode = Episode.model_validate_json(stored[0].data)
    assert episode.kind == "decision" and episode.completed_by == "promotion" and episode.scope == "workspace"
