"""The hostile inputs the fuzz tests (test_subjects.py) found breaking a service, one by one,
against the real services on real NATS JetStream and FalkorDB.

Each of these held its partition's only ack slot before its fix (the handler raised on every
delivery, or the dead letter could not be stored, so the message was never acked: every later
message of those sessions or groups waited behind it), leaked content into the log, or let a
message into a group it was not sent to.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from engram.runtime import dlq
from engram.stack.embedded import start_nats
from engram.schemas import subjects
from tests.fuzz.stack import LogCapture, Stack
from tests.services.turn_detector.helpers import read_all

DEEP = 100_000
NESTED = b"[" * DEEP + b"]" * DEEP


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, falkordb_server: Any) -> Iterator[Stack]:
    nats_proc = start_nats(tmp_path_factory.mktemp("regress-nats"))
    s = Stack(nats_proc.url, falkordb_server.url, tmp_path_factory.mktemp("regress-data")).start()
    try:
        yield s
    finally:
        s.stop()
        nats_proc.stop()


def token() -> str:
    return f"rg{uuid.uuid4().hex[:10]}"


async def letter_of(js: Any, stream: str, seq: int, timeout: float = 30.0) -> dict[str, str] | None:
    """The dead letter of ``stream``'s message ``seq`` (its headers), waiting up to ``timeout``."""
    wanted = f"{stream}:{seq}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for msg in await read_all(js, subjects.STREAM_DLQ, settle=0.2):
            headers = dict(msg.headers or {})
            if headers.get(subjects.HDR_MSG_ID, "").endswith(":" + wanted):
                return {**headers, "_size": str(len(msg.data))}
        await asyncio.sleep(0.3)
    return None


async def publish_and_wait(stack: Stack, subject: str, payload: bytes, headers: dict[str, str] | None = None,
                           timeout: float = 30.0) -> dict[str, str] | None:
    js = stack.nc.jetstream()
    ack = await js.publish(subject, payload, headers=headers)
    return await letter_of(js, ack.stream, ack.seq, timeout)


@pytest.mark.parametrize(("door", "stage", "reason"), [
    ("engram.in.message", "turn_detector", "malformed_json"),
    ("engram.episode", "extractor", "schema"),
    ("engram.delta", "summary_gate", "schema"),
    ("engram.session.closed", "sessions", "schema"),
])
def test_deeply_nested_json_is_dead_lettered(stack: Stack, door: str, stage: str, reason: str) -> None:
    """100,000 nested arrays: json.loads raises RecursionError (not ValueError) in the
    turn-detector's classifier, the summary-gate's type sniff and the dead-letter scrubber."""
    letter = stack.run(publish_and_wait(stack, f"{door}.{token()}", NESTED))
    assert letter is not None, f"{door}: not dead-lettered"
    assert letter[subjects.HDR_DLQ_STAGE] == stage
    assert letter[subjects.HDR_DLQ_REASON] == reason
    assert letter[subjects.HDR_DLQ_DETAIL]


@pytest.mark.parametrize("version", [{}, [1], "zqxcanary-version"])
def test_an_unhashable_or_text_schema_version_is_dead_lettered_without_its_value(stack: Stack, version: Any) -> None:
    """``{"schema_version": {}}``: the classifier's ``version in {1}`` raised TypeError on every
    delivery (found by the full fuzz run: both input partitions stopped); a text version was
    echoed into the dead letter's detail."""
    import json

    session = token()
    body = json.dumps({"schema_version": version, "session_id": session, "closed_at": "2026-01-01T00:00:00Z"})
    letter = stack.run(publish_and_wait(stack, f"engram.in.close.{session}", body.encode()))
    assert letter is not None and letter[subjects.HDR_DLQ_REASON] == "unsupported_version"
    assert "zqxcanary" not in letter[subjects.HDR_DLQ_DETAIL]


def test_a_server_directive_header_does_not_stop_the_dead_letter(stack: Stack) -> None:
    """A bad message carrying a server directive is stored (``Nats-Expected-Last-Subject-Sequence:
    0`` holds for a new session; so did ``Nats-Rollup: sub`` while ENGRAM_IN allowed rollups); the
    dead letter copied the header and the DLQ stream refused it (the dead-letter subject has
    messages; 'rollup not permitted')."""
    directive = "Nats-Expected-Last-Subject-Sequence"
    letter = stack.run(publish_and_wait(stack, f"engram.in.message.{token()}", b"not json",
                                        headers={directive: "0", "traceparent": "garbage"}))
    assert letter is not None and letter[subjects.HDR_DLQ_REASON] == "malformed_json"
    assert directive not in letter and letter["traceparent"] == "garbage"


@pytest.mark.parametrize(("door", "stage", "field", "reason"), [
    ("engram.episode", "extractor", "group_id", "group_mismatch"),
    ("engram.delta", "summary_gate", "group_id", "group_mismatch"),
    ("engram.session.closed", "sessions", "session_id", "session_mismatch"),
])
def test_a_body_naming_another_group_than_its_subject_is_dead_lettered(
    stack: Stack, door: str, stage: str, field: str, reason: str,
) -> None:
    """The subject's group (or session) chose the partition; a body naming another group was
    written into that other group, outside its order."""
    from tests.fuzz.hostile import STREAM_DOORS, valid_documents
    from hypothesis import HealthCheck, given, settings

    model = next(d for d in STREAM_DOORS if d.name == door).models[0]
    documents: list[dict[str, Any]] = []

    @settings(max_examples=1, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(valid_documents(model))
    def one(doc: dict[str, Any]) -> None:
        documents.append(doc)

    one()
    import json

    doc = {**documents[0], field: token()}
    letter = stack.run(publish_and_wait(stack, f"{door}.{token()}", json.dumps(doc).encode()))
    assert letter is not None, "written into the body's group"
    assert letter[subjects.HDR_DLQ_STAGE] == stage and letter[subjects.HDR_DLQ_REASON] == reason


def test_a_malformed_forget_message_leaves_no_content_in_the_log(stack: Stack) -> None:
    """``engram.ctl.sessions.forget`` was validated by FastStream, whose error log quotes the body."""
    capture = LogCapture()
    root = logging.getLogger()
    root.addHandler(capture)
    try:
        async def send() -> None:
            await stack.nc.publish(subjects.CTL_FORGET_SESSIONS, b'{"secret": "zqxcanary-forget"}')
            await stack.nc.publish(subjects.CTL_FORGET_SESSIONS, b"zqxcanary-forget")
            await stack.nc.flush()
            await asyncio.sleep(1.0)

        stack.run(send())
    finally:
        root.removeHandler(capture)
    assert "forget" in capture.text()  # it was logged (as ignored), ...
    assert "zqxcanary" not in capture.text()  # ... without its content


def test_an_entity_lookup_listing_a_stopword_does_not_crash_the_graph_database(stack: Stack) -> None:
    """``engram.graph.entities`` with uuids ``["a", "0"]`` in a group holding a node: FalkorDB
    4.16.3 died of SIGSEGV in Index_BuildQueryTree (found by the full fuzz run), and every
    service lost its graph."""
    import json

    group = token()

    async def run() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        saved = json.loads((await stack.nc.request(subjects.GRAPH_ENTITY_SAVE, json.dumps(
            {"group_id": group, "name": "Lisbon", "uuid": "0"}).encode(), timeout=30)).data)
        found = json.loads((await stack.nc.request(subjects.GRAPH_ENTITIES, json.dumps(
            {"group_id": group, "uuids": ["a", "is", "0", "0"]}).encode(), timeout=30)).data)
        after = json.loads((await stack.nc.request(subjects.GRAPH_GROUPS, b"{}", timeout=30)).data)
        return saved, found, after

    saved, found, after = stack.run(run())
    assert saved["status"] == "ok", saved
    assert found["status"] == "ok" and [e["uuid"] for e in found["entities"]] == ["0"], found
    assert after["status"] == "ok" and group in after["group_ids"], after  # the database is still up


def test_a_deeply_nested_message_in_a_stream_does_not_stop_group_deletes(stack: Stack) -> None:
    """A group delete erases the group's messages from the streams, reading each as JSON: one
    deeply nested message left there (dead-lettered, kept in ENGRAM_IN and ENGRAM_DLQ) made every
    later delete answer ``backend_error: RecursionError`` (found by the full fuzz run)."""
    import json

    assert stack.run(publish_and_wait(stack, f"engram.in.message.{token()}", NESTED)) is not None

    async def delete() -> dict[str, Any]:
        reply = await stack.nc.request(subjects.GRAPH_GROUP_DELETE, json.dumps({"group_id": token()}).encode(),
                                       timeout=60)
        return json.loads(reply.data)

    answer = stack.run(delete())
    assert answer["status"] == "ok", answer


def test_a_dead_letter_with_a_non_ascii_subject_does_not_stop_group_deletes(stack: Stack) -> None:
    """A bad episode published on ``engram.episode.ünï``: its dead letter's Engram-Dlq-Subject is
    not ASCII, nats-py hands such a header back as an email.header.Header, and every later group
    delete failed with ``backend_error: AttributeError`` (found by the fuzz run)."""
    import json

    assert stack.run(publish_and_wait(stack, "engram.episode.ünï", b"{}")) is not None

    async def delete() -> dict[str, Any]:
        reply = await stack.nc.request(subjects.GRAPH_GROUP_DELETE, json.dumps({"group_id": token()}).encode(),
                                       timeout=60)
        return json.loads(reply.data)

    answer = stack.run(delete())
    assert answer["status"] == "ok", answer


@pytest.mark.parametrize(("subject", "stream"), [
    ("engram.in.message.{}", subjects.STREAM_IN),
    ("engram.delta.{}", subjects.STREAM_DELTAS),
])
def test_a_forged_rollup_header_cannot_purge_a_stream(stack: Stack, subject: str, stream: str) -> None:
    """ENGRAM_IN and ENGRAM_DELTAS allowed message schedules, so nats-server let any publisher's
    ``Nats-Rollup: all`` purge them (every session's unprocessed messages). The schedules now live
    in ENGRAM_SCHED; the server refuses the header here."""
    import nats.js.errors

    async def victim_survives() -> bool:
        js = stack.nc.jetstream()
        victim = token()
        ack = await js.publish(f"engram.in.close.{victim}" if stream == subjects.STREAM_IN else
                               f"engram.summary.{victim}", b"{}")
        with pytest.raises(nats.js.errors.Error, match="rollup not permitted"):
            await js.publish(subject.format(token()), b"x", headers={"Nats-Rollup": "all"})
        try:
            await js.get_msg(ack.stream, ack.seq)
        except nats.js.errors.NotFoundError:
            return False
        return True

    assert stack.run(victim_survives()), "one publisher's Nats-Rollup: all purged every stored message"


def test_a_field_name_with_a_line_break_does_not_break_the_dead_letter(stack: Stack) -> None:
    """Validation details name the failing fields; an unknown field named ``"a\\r\\nb"`` would
    put a line break into the detail header."""
    import json

    group = token()
    body = json.dumps({"group_id": group, "x\r\nNats-Rollup: all\r\n": 1}).encode()
    letter = stack.run(publish_and_wait(stack, f"engram.episode.{group}", body))
    assert letter is not None and letter[subjects.HDR_DLQ_REASON] == "schema"
    assert "Nats-Rollup" not in letter


def test_a_nul_in_any_string_of_a_valid_request_is_answered_not_a_backend_error(stack: Stack) -> None:
    """FalkorDB reads a query's parameters as a C string: a NUL in one ends the query ("Invalid
    input at end of input"), so a valid ``engram.graph.edge.get`` or ``episode.delete`` whose uuid
    held one answered ``backend_error: ResponseError`` (found by the full fuzz run). Every request
    door, with a NUL in each identifier and text field, is answered with a result, ``not_found``
    or a ``bad_request``, never a backend error, and the database still answers."""
    import json

    group, user = token(), f"{token()}@example.com"
    nul = "a\x00b"
    scopes = {"user": user}
    requests = [
        (subjects.GRAPH_ENTITY_SAVE, {"group_id": group, "name": "Lisbon", "uuid": "lisbon-1"}),
        (subjects.GRAPH_EDGE_GET, {"uuid": nul}),
        (subjects.GRAPH_EDGE_GET, {"uuid": nul, "group_id": group}),
        (subjects.GRAPH_EDGE_DELETE, {"uuid": nul}),
        (subjects.GRAPH_EDGE_DELETE, {"uuid": nul, "group_id": group}),
        (subjects.GRAPH_EPISODE_DELETE, {"uuid": nul}),
        (subjects.GRAPH_ENTITIES, {"group_id": group, "uuids": [nul, "lisbon-1"]}),
        (subjects.GRAPH_ENTITY_SAVE, {"group_id": group, "name": "Lis\x00bon", "uuid": "lisbon-2", "summary": nul}),
        (subjects.GRAPH_ENTITY_SAVE, {"group_id": group, "name": "Porto", "uuid": nul}),
        (subjects.RECALL, {"query": "Where is Lis\x00bon?", "group_ids": [group]}),
        (subjects.CONTEXT, {"scopes": scopes, "query": "Lis\x00bon"}),
        (subjects.MEMORY_NOTE_SAVE, {"scopes": scopes, "text": "Lives in Lis\x00bon."}),
        (subjects.MEMORY_NOTE_DELETE, {"scopes": scopes, "uuid": nul}),
        (subjects.MEMORY_PREFERENCE_SET, {"scopes": scopes, "key": "ci\x00ty", "value": "Lis\x00bon"}),
        (subjects.MEMORY_PREFERENCE_GET, {"scopes": scopes, "key": "ci\x00ty"}),
        (subjects.MEMORY_PREFERENCE_REMOVE, {"scopes": scopes, "key": "ci\x00ty"}),
        (subjects.MEMORY_NOTES_LIST, {"scopes": scopes}),
    ]

    async def ask_all() -> list[dict[str, Any]]:
        out = []
        for subject, body in requests:
            reply = await stack.nc.request(subject, json.dumps(body).encode(), timeout=30)
            out.append(json.loads(reply.data))
        out.append(json.loads((await stack.nc.request(subjects.GRAPH_GROUPS, b"{}", timeout=30)).data))
        return out

    answers = stack.run(ask_all())
    failed = [(subject, a.get("reason")) for (subject, _), a in zip(requests, answers)
              if str(a.get("reason") or "").startswith("backend_error") or a.get("degraded")]
    assert not failed, failed
    assert answers[0]["status"] == "ok", answers[0]
    found = answers[6]
    assert found["status"] == "ok" and [e["uuid"] for e in found["entities"]] == ["lisbon-1"], found
    assert answers[-1]["status"] == "ok" and group in answers[-1]["group_ids"], answers[-1]


# Last in the module: when it fails, its message stays at the head of the extractor's durable and
# every later extractor test of this module's stack would fail with it.
@pytest.mark.xfail(strict=False, reason=(
    "found 2026-11-28 on a new machine, at b4c39f6 too (CI passed on the previous one): an episode of "
    "7-8 MB is never delivered to the extractor's pull consumer (consumer info: pending 1, delivered 0); "
    "up to 6 MB is delivered and dead-lettered, and a plain nats-py pull consumer on the same server "
    "receives 8.3 MB. Cause not found; while it stands such a message blocks the extractor's durable. "
    "Not reproduced on 2026-11-29's machine: passed in this place and in its old place (before the "
    "group-mismatch tests), 7 module runs, 3 of them with both cores busy."))
def test_a_bad_message_at_the_size_limit_is_dead_lettered_with_its_head(stack: Stack) -> None:
    """A body that fills NATS's max_payload: with the dead letter's headers added it no longer
    fits, the server refused the publish and dropped the service's connection."""
    limit = stack.nc.max_payload
    payload = b"{" + b"x" * (limit - 200)
    letter = stack.run(publish_and_wait(stack, f"engram.episode.{token()}", payload, headers={"a": "b"}))
    assert letter is not None and letter[subjects.HDR_DLQ_REASON] == "schema"
    assert letter[dlq.HDR_TRUNCATED] == str(len(payload))
    assert int(letter["_size"]) < len(payload)
