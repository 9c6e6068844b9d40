"""Issue 23, item 1: a secret told through any door that stores or prompts text rests in no file
under the data dir, at default settings (raw input retention 60 s included), once the pipeline
is idle. Item 6: the words told through every door appear in no log line of any service at DEBUG
and in no label value of any service's /metrics.

The doors are read from the contract, not listed by hand: every subject in schemas/subjects.py,
every route and method of the gateway's OpenAPI document and every tool of the MCP server must be
classified below, either planted by the end-to-end test or said to store no text with the reason.
A new door fails :func:`test_every_door_is_classified` until it is covered.

The end-to-end test runs `engram up` (the real supervisor, every service as its own process and
NATS user, default settings), plants "use this key: AKIA... with secret wJalr..." through every
planted door, each with a marker word of its own, waits until the pipeline is idle, stops the
stack and greps every file under the data dir: no secret anywhere, and every stored door's marker
somewhere (so the door really stored the text the secret travelled with).
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from engram.cli.support import nats_connection
from engram.settings import EngramSettings
from engram.schemas import ChatMessage, ScopeKeys, SessionClosed, subjects
from engram.schemas.memory import (
    AddFavoriteRequest,
    ContextRequest,
    LogActivityRequest,
    MemoryScopes,
    RemoveUserPreferenceRequest,
    SaveUserNoteRequest,
    SetUserPreferenceRequest,
)
from engram.schemas.messages import RecallRequest, RecallScopes, TripletAddRequest, TripletFact
from tests.engram.cli.test_cli_up import Up
from tests.services.mcp.test_mcp import call

# AWS's own documentation example pair (not a credential): the shape the issue found kept.
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
TOLD = f"use this key: {KEY_ID} with secret {SECRET}"
NEEDLES = (KEY_ID, SECRET)

PLANTED = "planted"
# Every door engram has, from the contract. PLANTED: the end-to-end test sends the secret through
# it; anything else says why no text of the request is stored or prompted.
NATS_DOORS: dict[str, str] = {
    "IN_MESSAGE": PLANTED,
    "IN_CLOSE": PLANTED,
    "IN_IDLE": "internal: the idle tick of a schedule the turn-detector stores; no text",
    "SCHED_IDLE": "internal: written by the turn-detector only (NATS permissions); no text",
    "SCHED_IDLE_FIRED": "internal: the server fires the stored schedule; no text",
    "EPISODE": PLANTED,  # through its publishers: POST /promote, MCP promote and add_memory (text)
    "DELTA": "internal: the extractor's deltas of already scrubbed facts",
    "SUMMARY": "internal: the summary-gate's decisions (names of scrubbed entities)",
    "SUMMARY_AUDIT": "internal: the summary-gate's audits of scrubbed summaries",
    "SCHED_SUMMARY": "internal: the summary-gate's flush schedules; no text",
    "SCHED_SUMMARY_FIRED": "internal: the server fires the stored schedule; no text",
    "RECALL": PLANTED,  # the query reaches the graph, which logs queries with their parameters
    "CTL_FORGET_SESSIONS": "internal: session ids, core NATS (not stored)",
    "DLQ": "internal: dead letters are scrubbed by engram/runtime/dlq.py (tests/engram/test_no_silent_loss.py)",
    "SESSION_CLOSED": "internal: the turn-detector's scrubbed transcript tails",
    "MEMORY_NOTE_SAVE": PLANTED,
    "MEMORY_NOTE_DELETE": "a uuid; no text",
    "MEMORY_NOTES_LIST": "a read; no text",
    "MEMORY_PREFERENCE_SET": PLANTED,
    "MEMORY_PREFERENCE_GET": "a read; no text",
    "MEMORY_PREFERENCE_REMOVE": PLANTED,  # its key is a graph query parameter
    "MEMORY_SESSIONS_LIST": "a read; no text",
    "MEMORY_ACTIVITY_LOG": PLANTED,
    "MEMORY_ACTIVITIES_LIST": "a read; no text",
    "MEMORY_ACTIVITY_DELETE": "a uuid; no text",
    "MEMORY_FAVORITE_ADD": PLANTED,
    "MEMORY_FAVORITES_LIST": "a read; no text",
    "MEMORY_FAVORITE_REMOVE": "a uuid; no text",
    "CONTEXT": PLANTED,
    "GRAPH_EPISODES": "a read; no text",
    "GRAPH_EDGE_GET": "a uuid; no text",
    "GRAPH_EDGE_DELETE": "a uuid; no text",
    "GRAPH_EPISODE_DELETE": "a uuid; no text",
    "GRAPH_GROUP_DELETE": "a group id; no text",
    "GRAPH_GROUPS": "a read; no text",
    "GRAPH_ENTITY_SAVE": PLANTED,  # through POST /entity-node (the CLI's NATS user may not save entities)
    "GRAPH_ENTITIES": "a read; no text",
    "GRAPH_EPISODE_ENTITIES": "uuids; no text",
    "TRIPLET_ADD": PLANTED,
}
REST_DOORS: dict[str, str] = {
    "GET /healthcheck": "no body",
    "POST /messages": PLANTED,
    "POST /promote": PLANTED,
    "POST /entity-node": PLANTED,
    "POST /triplets": PLANTED,
    "POST /episodes": PLANTED,
    "POST /search": PLANTED,
    "POST /get-memory": PLANTED,
    "GET /episodes/{group_id}": "a read; no text",
    "GET /entity-edge/{uuid}": "a uuid; no text",
    "DELETE /entity-edge/{uuid}": "a uuid; no text",
    "DELETE /group/{group_id}": "a group id; no text",
    "DELETE /episode/{uuid}": "a uuid; no text",
    "POST /clear": "group ids; no text",
    "POST /context": PLANTED,
    "GET /memory/notes": "a read; no text",
    "POST /memory/notes": PLANTED,
    "DELETE /memory/notes/{uuid}": "a uuid; no text",
    "PUT /memory/preferences/{key}": PLANTED,
    "DELETE /memory/preferences/{key}": PLANTED,
    "GET /memory/preferences": "a read; no text",
    "GET /memory/sessions": "a read; no text",
    "POST /memory/activities": PLANTED,
    "GET /memory/activities": "a read; no text",
    "DELETE /memory/activities/{uuid}": "a uuid; no text",
    "POST /memory/favorites": PLANTED,
    "GET /memory/favorites": "a read; no text",
    "DELETE /memory/favorites/{uuid}": "a uuid; no text",
    "GET /groups": "a read; no text",
    "GET /entities/{group_id}": "a read; no text",
    "GET /facts/{group_id}": "a read; no text",
    "GET /summary-log/{group_id}": "a read; no text",
}
MCP_DOORS: dict[str, str] = {
    "add_memory": PLANTED,
    "search_memory_facts": PLANTED,
    "search_nodes": PLANTED,
    "get_episodes": "a read; no text",
    "delete_episode": "a uuid; no text",
    "delete_entity_edge": "a uuid; no text",
    "get_entity_edge": "a uuid; no text",
    "clear_graph": "a group id; no text",
    "get_status": "no arguments",
    "get_context": PLANTED,
    "promote": PLANTED,
    "save_user_note": PLANTED,
    "set_user_preference": PLANTED,
    "get_user_preferences": "a read; no text",
    "remove_user_preference": PLANTED,
    "log_activity": PLANTED,
    "list_activities": "a read; no text",
    "remove_activity": "a uuid; no text",
    "add_favorite": PLANTED,
    "list_favorites": "a read; no text",
    "remove_favorite": "a uuid; no text",
    "add_triplet": PLANTED,
    "get_episode_entities": "uuids; no text",
    "build_communities": "answered as not supported: stores nothing",
    "summarize_saga": "answered as not supported: stores nothing",
}


def nats_doors() -> set[str]:
    return {name for name, value in vars(subjects).items()
            if name.isupper() and isinstance(value, str) and value.startswith("engram.")}


def rest_doors() -> set[str]:
    from engram.runtime.service import make_broker
    from engram.services.gateway.app import create_rest_app
    from engram.services.gateway.bus import Bus
    from engram.services.gateway.settings import GatewaySettings

    settings = EngramSettings(nats_url="nats://127.0.0.1:1")  # never connected
    bus = Bus(settings, make_broker(settings, service="gateway"), publish_timeout_s=5.0)
    document = create_rest_app(bus, settings, GatewaySettings()).openapi()
    return {f"{method.upper()} {path}" for path, ops in document["paths"].items() for method in ops}


def mcp_doors() -> set[str]:
    from engram.services.mcp import app as mcp_app
    from engram.services.mcp.settings import McpSettings

    service = mcp_app.build(EngramSettings(nats_url="nats://127.0.0.1:1"), McpSettings())
    return {tool.name for tool in asyncio.run(service.server.list_tools())}


@pytest.mark.parametrize(("listed", "found"), [(NATS_DOORS, nats_doors), (REST_DOORS, rest_doors), (MCP_DOORS, mcp_doors)],
                         ids=["nats", "rest", "mcp"])
def test_every_door_is_classified(listed: dict[str, str], found: Any) -> None:
    doors = found()
    assert set(listed) == doors, (f"new doors, plant a secret through them below or say why they store no text: "
                                  f"{sorted(doors - set(listed))}; gone: {sorted(set(listed) - doors)}")


def files_containing(root: Path, needle: str) -> list[str]:
    hits = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and needle.encode() in path.read_bytes():
                hits.append(str(path.relative_to(root)))
        except OSError:
            continue
    return hits


def _marker(door: str) -> str:
    """A word of the door's own, stored with the secret (Zq + letters only: no rule touches it)."""
    return "Zq" + "".join(c for c in door.title() if c.isalpha())[:24] + "Marker"


async def _plant_over_nats(settings: EngramSettings) -> list[str]:
    """The NATS doors, as a publisher or an agent's memory calls reach them. Returns the markers
    that must be stored."""
    session = "secret-door-nats"
    scopes = ScopeKeys(workspace="secrets-ws", user="secrets-user")
    memory = MemoryScopes(user="secrets-user")
    t0 = datetime.now(timezone.utc) - timedelta(minutes=5)
    chat, note, pref = _marker("nats chat"), _marker("nats note"), _marker("nats pref")
    activity, favorite, triplet = _marker("nats activity"), _marker("nats favorite"), _marker("nats triplet")
    async with nats_connection(settings, name="secret-doors") as nc:
        js = nc.jetstream()
        messages = [
            ChatMessage(message_id="m1", session_id=session, role="user", timestamp=t0, scopes=scopes,
                        content=f"{chat} runs the S3 export; {TOLD}", name=f"Ada {KEY_ID}",
                        source_description=f"vault dump, secret {SECRET}",
                        metadata={"aws_secret_access_key": SECRET, "told": TOLD}),
            ChatMessage(message_id="m2", session_id=session, role="assistant", timestamp=t0 + timedelta(seconds=1),
                        scopes=scopes, content=f"Noted: {chat} runs the S3 export."),
        ]
        for message in messages:
            await js.publish(subjects.in_message(session), message.model_dump_json().encode(),
                             headers={subjects.HDR_MSG_ID: subjects.message_dedupe_id(session, scopes, message.message_id)})
        close = SessionClosed(session_id=session, closed_at=t0 + timedelta(seconds=2), reason=f"done; {TOLD}")
        await js.publish(subjects.in_close(session), close.model_dump_json().encode())

        async def ask(subject: str, request: Any) -> dict:
            reply = await nc.request(subject, request.model_dump_json().encode(), timeout=30)
            return json.loads(reply.data)

        assert (await ask(subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(scopes=memory, text=f"{note}: {TOLD}")))[
            "status"] == "ok"
        for key, value in (("s3_export", f"{pref}: {TOLD}"), ("aws_secret_access_key", SECRET), (f"keyid_{pref}", KEY_ID)):
            answer = await ask(subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=memory, key=key, value=value))
            assert answer["status"] == "ok", answer
        await ask(subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=memory, key=f"x {TOLD}"[:128]))
        answer = await ask(subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(scopes=memory, text=f"{activity}: {TOLD}"))
        assert answer["status"] == "ok", answer
        answer = await ask(subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(scopes=memory, item=f"{favorite}: {TOLD}"))
        assert answer["status"] == "ok", answer
        answer = await ask(subjects.TRIPLET_ADD, TripletAddRequest(group_id="secret-door-nats", triplet=TripletFact(
            source=f"{triplet} vault", relation="USES", target=f"key {KEY_ID}", fact=f"{triplet} vault stores {TOLD}")))
        assert answer["status"] == "ok", answer
        await ask(subjects.RECALL, RecallRequest(query=f"what is the AWS secret? {TOLD}",
                                                 scopes=RecallScopes(session=session, workspace="secrets-ws")))
        await ask(subjects.CONTEXT, ContextRequest(scopes=memory, query=TOLD, identity=TOLD, skills=TOLD))
    return [chat, note, pref, activity, favorite, triplet]


async def _plant_over_rest(url: str) -> list[str]:
    group = "secret-door-rest"
    chat, entity, note, pref, promo, triplet, activity, favorite, episode = (
        _marker(f"rest {w}") for w in ("chat", "entity", "note", "pref", "promo", "triplet", "activity", "favorite",
                                       "episode"))
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def ok(response: httpx.Response) -> None:
            assert response.status_code < 300, (response.request.url, response.status_code, response.text[:300])

        await ok(await http.post("/messages", json={"group_id": group, "messages": [
            {"role_type": "user", "role": f"Ada {KEY_ID}", "content": f"{chat} owns the vault. {TOLD}",
             "source_description": f"pasted, secret {SECRET}"},
            {"role_type": "assistant", "role": "", "content": f"Noted, {chat} owns the vault."}]}))
        await ok(await http.post("/entity-node", json={"uuid": "5ec2e7a0-0000-4000-8000-000000000001",
                                                       "group_id": group, "name": f"{entity} {KEY_ID}",
                                                       "summary": f"{entity} keeps {TOLD}"}))
        user = {"user": "secrets-user"}
        await ok(await http.post("/memory/notes", params=user, json={"text": f"{note}: {TOLD}"}))
        await ok(await http.put("/memory/preferences/s3_export", params=user, json={"value": f"{pref}: {TOLD}"}))
        await ok(await http.put("/memory/preferences/aws_secret_access_key", params=user, json={"value": SECRET}))
        await http.delete(f"/memory/preferences/gone {KEY_ID}", params=user)  # 404: nothing to remove
        await ok(await http.post("/memory/activities", params=user, json={"text": f"{activity}: {TOLD}"}))
        await ok(await http.post("/memory/favorites", params=user, json={"item": f"{favorite}: {TOLD}"}))
        await ok(await http.post("/episodes", json={"group_id": group, "name": f"doc {KEY_ID}",
                                                    "episode_body": f"user (Ada): {episode} keeps {TOLD}",
                                                    "source_description": f"secret {SECRET}"}))
        await ok(await http.post("/promote", json={"kind": "decision", "text": f"{promo} decides: {TOLD}",
                                                   "key": "secrets-ws", "author": f"Ada {KEY_ID}"}))
        await ok(await http.post("/search", json={"query": f"AWS secret {TOLD}", "group_ids": [group]}))
        await ok(await http.post("/get-memory", json={"group_id": group, "messages": [
            {"role_type": "user", "role": "Ada", "content": f"what was {TOLD}?"}]}))
        await ok(await http.post("/context", json={"scopes": user, "query": TOLD, "identity": TOLD}))
        await ok(await http.post("/triplets", json={"group_id": group, "source_node_name": f"{triplet} vault",
                                                    "edge_name": "USES", "target_node_name": f"key {KEY_ID}",
                                                    "fact": f"{triplet} vault stores {TOLD}"}))
    return [chat, entity, note, pref, promo, triplet, activity, favorite, episode]


async def _plant_over_mcp(url: str) -> list[str]:
    group = "secret-door-mcp"
    text, message, note, pref, promo, triplet, activity, favorite = (
        _marker(f"mcp {w}") for w in ("text", "message", "note", "pref", "promo", "triplet", "activity", "favorite"))
    client = httpx2.AsyncClient(timeout=60)
    async with client, streamable_http_client(url + "/mcp", http_client=client) as (read, write), \
            ClientSession(read, write) as session:
        await session.initialize()
        await call(session, "add_memory", name=f"vault {KEY_ID}", episode_body=f"user (Ada): {text} keeps {TOLD}",
                   group_id=group, source_description=f"secret {SECRET}")
        await call(session, "add_memory", name=f"Ada {KEY_ID}", episode_body=f"{message} keeps {TOLD}",
                   group_id=group, source="message", source_description=f"secret {SECRET}")
        await call(session, "save_user_note", text=f"{note}: {TOLD}", user="secrets-user")
        await call(session, "set_user_preference", key="s3_export", value=f"{pref}: {TOLD}", user="secrets-user")
        await call(session, "set_user_preference", key="aws_secret_access_key", value=SECRET, user="secrets-user")
        await session.call_tool("remove_user_preference", {"key": f"gone {KEY_ID}", "user": "secrets-user"})
        await call(session, "log_activity", text=f"{activity}: {TOLD}", user="secrets-user")
        await call(session, "add_favorite", item=f"{favorite}: {TOLD}", user="secrets-user")
        await call(session, "promote", kind="decision", text=f"{promo} decides: {TOLD}", key="secrets-ws",
                   author=f"Ada {KEY_ID}")
        await call(session, "search_memory_facts", query=f"AWS secret {TOLD}", group_ids=[group])
        await call(session, "search_nodes", query=f"AWS secret {TOLD}", group_ids=[group])
        await call(session, "get_context", query=TOLD, user="secrets-user")
        await call(session, "add_triplet", source_node_name=f"{triplet} vault", edge_name="USES",
                   target_node_name=f"key {KEY_ID}", fact=f"{triplet} vault stores {TOLD}", group_id=group)
    return [text, message, note, pref, promo, triplet, activity, favorite]


async def _plant_everywhere(up: Up, data: Path, *, until_no_secret: bool) -> list[str]:
    """Plant through every door, then wait (up to 2 min) until every door's marker is stored and,
    with ``until_no_secret``, no secret is left in any file (raw input erased once processed)."""
    markers = await _plant_over_nats(EngramSettings(data_dir=data))
    markers += await _plant_over_rest(up.runtime["services"]["gateway"]["url"])
    markers += await _plant_over_mcp(up.runtime["services"]["mcp"]["url"])
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        missing = [m for m in markers if not files_containing(data, m)]
        left = until_no_secret and any(files_containing(data, n) for n in NEEDLES)
        if not missing and not left:
            break
        await asyncio.sleep(2)
    return markers


@pytest.mark.slow
async def test_a_secret_told_through_every_door_rests_in_no_file(tmp_path: Path) -> None:
    data = tmp_path / "engram"
    up = Up(data)  # default settings: input retention 60 s, idle timeouts, the rules model
    try:
        markers = await _plant_everywhere(up, data, until_no_secret=True)
    finally:
        assert up.stop() == 0, up.log_tail()
    # Stopped: FalkorDB saved and NATS flushed; what is on disk now is what rests.
    for needle in NEEDLES:
        assert files_containing(data, needle) == [], f"{needle[:8]}... rests in these files"
    missing = [m for m in markers if not files_containing(data, m)]
    assert not missing, f"these doors stored nothing (the test proves nothing for them): {missing}"


def _metric_label_values(text: str) -> str:
    """Every label value of a Prometheus text exposition, one per line (sample values and help
    texts left out: only labels can carry what a request said)."""
    from prometheus_client.parser import text_string_to_metric_families

    return "\n".join(value for family in text_string_to_metric_families(text)
                     for sample in family.samples for value in sample.labels.values())


@pytest.mark.slow
async def test_words_told_through_every_door_reach_no_log_line_and_no_metric_label(tmp_path: Path) -> None:
    data = tmp_path / "engram"
    up = Up(data, env={"ENGRAM_LOG_LEVEL": "DEBUG"})
    try:
        markers = await _plant_everywhere(up, data, until_no_secret=False)  # the pipeline did its work on them
        labels = {}
        async with httpx.AsyncClient(timeout=30) as http:
            for name, service in up.runtime["services"].items():
                labels[name] = _metric_label_values((await http.get(service["url"] + "/metrics")).text)
    finally:
        assert up.stop() == 0, up.log_tail()
    logs = {path.name: path.read_text(errors="replace") for path in (data / "logs").glob("*.log")}
    assert {f"{name}.log" for name in up.runtime["services"]} <= set(logs), sorted(logs)
    assert sum(text.count(" DEBUG ") for text in logs.values()) > 0, "the services did not log at DEBUG"
    told = [*markers, KEY_ID, SECRET]
    for word in told:
        assert not [name for name, text in logs.items() if word in text], f"{word} in these logs"
        assert not [name for name, text in labels.items() if word in text], f"{word} in these services' labels"
