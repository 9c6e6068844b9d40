"""Hostile input on every NATS door engram consumes (issue 16 item 3), against the real services
(turn-detector, extractor, summary-gate, recall with graph admin, sessions; the rules model as
LLM) on real NATS JetStream and FalkorDB.

Cases come from tests/fuzz/hostile.py (hypothesis; ``ENGRAM_FUZZ_EXAMPLES`` per door). The
JetStream doors get every case published, interleaved with valid chat sessions, and then:

* no hang: every durable of every stage drains (nothing pending, nothing unacknowledged): a
  message a handler could not finish would hold its partition's only ack slot;
* every stored message the door's schema rejects (or whose body names another session or group
  than its subject) is dead-lettered by its stage, with a reason from the stages' vocabulary and
  a detail; a message the server refused at publish (a forged expectation, a schedule header)
  never entered the stream; every dead letter carries a reason;
* all valid traffic is processed: the valid sessions' turns are episodes in the graph, recall
  finds them, the sessions service recorded their close; and traffic sent after the fuzz is
  processed too (the stages still run);
* no generated content in any log line (a canary string is put into every content field).

The request/reply doors get every case as a request: each is answered (no hang, no crash) with
a response its schema accepts, and a request its schema rejects is answered with an error whose
reason names the bad request.

``ENGRAM_FUZZ_REPORT=path.json`` writes the counts (inputs tried, outcomes, reasons) there.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import pytest

from engram.stack.embedded import start_nats
from engram.schemas import ChatMessage, Episode, SessionClosed, subjects
from engram.schemas.memory import ListSessionsRequest, MemoryResponse
from engram.schemas.messages import GraphEpisodesRequest, GraphEpisodesResponse, RecallRequest, RecallResponse
from tests.fuzz.hostile import (
    CANARY,
    CORE_DOORS,
    EXAMPLES,
    REQUEST_DOORS,
    STREAM_DOORS,
    Case,
    Door,
    generate_all,
)
from tests.fuzz.stack import LogCapture, Stack
from tests.services.turn_detector.helpers import read_all

STREAMS = (subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_DELTAS, subjects.STREAM_SESSIONS)
SOURCE_STREAM = {"engram.in": subjects.STREAM_IN, "engram.episode": subjects.STREAM_EPISODES,
                 "engram.delta": subjects.STREAM_DELTAS, "engram.session": subjects.STREAM_SESSIONS}
REASONS = {
    "turn_detector": {"malformed_json", "schema", "unsupported_version", "oversize", "invalid_id",
                      "session_mismatch", "unknown_subject", "processing_failed"},
    "extractor": {"schema", "group_mismatch", "processing_failed"},
    "summary_gate": {"schema", "group_mismatch", "processing_failed"},
    "sessions": {"schema", "session_mismatch", "processing_failed"},
}
T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
REPORT: dict[str, Any] = {"examples_per_door": EXAMPLES}


@pytest.fixture(scope="module")
def logs() -> Iterator[LogCapture]:
    """Every log record at the level engram's services run with (INFO; FastStream at WARNING)."""
    capture = LogCapture()
    root, faststream = logging.getLogger(), logging.getLogger("faststream")
    levels = root.level, faststream.level
    root.addHandler(capture)
    root.setLevel(logging.INFO)
    faststream.setLevel(logging.WARNING)
    yield capture
    root.removeHandler(capture)
    root.setLevel(levels[0])
    faststream.setLevel(levels[1])


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, falkordb_server: Any, logs: LogCapture) -> Iterator[Stack]:
    """A NATS server of its own (the fuzz leaves thousands of messages behind) and every service."""
    nats_proc = start_nats(tmp_path_factory.mktemp("fuzz-nats"))
    s = Stack(nats_proc.url, falkordb_server.url, tmp_path_factory.mktemp("fuzz-data")).start()
    try:
        yield s
    finally:
        s.stop()
        nats_proc.stop()
        path = os.environ.get("ENGRAM_FUZZ_REPORT")
        if path:
            Path(path).write_text(json.dumps(REPORT, indent=2, sort_keys=True))


# --- valid traffic -----------------------------------------------------------------------------
def valid_session(tag: str) -> tuple[str, list[tuple[str, bytes, dict[str, str]]]]:
    """A chat session of two complete turns and a close: (session id, publishes)."""
    session = f"ok{tag}{uuid.uuid4().hex[:8]}"
    said = [("user", f"Alice moved to Lisbon in {tag} and works at Acme."), ("assistant", "Noted, Lisbon and Acme."),
            ("user", "Her sister Beth lives in Porto."), ("assistant", "Beth lives in Porto, noted.")]
    out = []
    for i, (role, text) in enumerate(said):
        msg = ChatMessage(message_id=f"m{i}", session_id=session, role=role, content=text,  # type: ignore[arg-type]
                          timestamp=T0 + timedelta(seconds=30 * i), name="Alice" if role == "user" else None)
        out.append((subjects.in_message(session), msg.model_dump_json().encode(),
                    {subjects.HDR_MSG_ID: subjects.message_dedupe_id(session, msg.scopes, msg.message_id)}))
    closed = SessionClosed(session_id=session, closed_at=T0 + timedelta(minutes=5))
    out.append((subjects.in_close(session), closed.model_dump_json().encode(),
                {subjects.HDR_MSG_ID: subjects.close_dedupe_id(session, closed.closed_at.isoformat())}))
    return session, out


def group_of(session: str) -> str:
    return subjects.session_group("engram", session)


# --- publishing and waiting ----------------------------------------------------------------------
async def publish_case(js: Any, nc: Any, case: Case) -> None:
    if case.door == subjects.CTL_FORGET_SESSIONS:
        await nc.publish(case.subject, case.payload, headers=case.headers)
        case.outcome = "published_core"
        return
    try:
        ack = await js.publish(case.subject, case.payload, headers=case.headers, timeout=10)
    except (nats.errors.Error, nats.js.errors.Error) as exc:
        case.outcome, case.reason = "refused", type(exc).__name__
        return
    except ValueError as exc:  # the client refuses what it cannot put on the wire (e.g. a bad header)
        case.outcome, case.reason = "refused_by_client", type(exc).__name__
        return
    if ack.duplicate:
        case.outcome = "duplicate"
        return
    case.outcome = "stored"
    case.extra["source"] = f"{ack.stream}:{ack.seq}"


async def quiet(js: Any) -> bool:
    for stream in STREAMS:
        for consumer in await js.consumers_info(stream):
            if consumer.num_pending or consumer.num_ack_pending:
                return False
    return True


async def settle(js: Any, timeout: float) -> float:
    started = time.monotonic()
    in_a_row = 0
    while time.monotonic() - started < timeout:
        in_a_row = in_a_row + 1 if await quiet(js) else 0
        if in_a_row >= 3:  # upstream stages may publish to the next one between two looks
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    busy = []
    for stream in STREAMS:
        busy += [(c.name, c.num_pending, c.num_ack_pending) for c in await js.consumers_info(stream)
                 if c.num_pending or c.num_ack_pending]
    raise AssertionError(f"stages not idle after {timeout:.0f} s (a hung or looping message?): {busy}")


async def dead_letters(js: Any) -> dict[str, dict[str, str]]:
    """Dead letters by the source they name (``<stream>:<seq>``), with their headers."""
    out = {}
    for dl in await read_all(js, subjects.STREAM_DLQ, settle=1.0):
        headers = dict(dl.headers or {})
        msg_id = headers.get(subjects.HDR_MSG_ID, "")
        _, stage, source = msg_id.split(":", 2) if msg_id.count(":") >= 2 else ("", "?", msg_id)
        out[source] = {"stage": stage, **headers}
    return out


def _episode(msg: Any) -> Episode | None:
    """An episode of the stream (the fuzzed ones among them may be anything)."""
    try:
        return Episode.model_validate_json(msg.data)
    except ValueError:
        return None


async def request(nc: Any, subject: str, payload: bytes, timeout: float = 30.0) -> Any:
    reply = await nc.request(subject, payload, timeout=timeout)
    return json.loads(reply.data)


# --- the JetStream doors -------------------------------------------------------------------------
def test_stream_doors_dead_letter_every_bad_message_and_process_the_valid_ones(stack: Stack, logs: LogCapture) -> None:
    cases = generate_all(STREAM_DOORS + CORE_DOORS)
    before = [valid_session(f"a{i}") for i in range(2)]
    during = [valid_session(f"b{i}") for i in range(2)]

    async def run() -> dict[str, Any]:
        js = stack.nc.jetstream()
        for _, publishes in before:
            for subject, payload, headers in publishes:
                await js.publish(subject, payload, headers=headers)
        # the valid sessions' messages interleaved with the hostile ones
        pending = [p for _, publishes in during for p in publishes]
        every = max(1, len(cases) // (len(pending) + 1))
        for i, case in enumerate(cases):
            await publish_case(js, stack.nc, case)
            if pending and i % every == 0:
                subject, payload, headers = pending.pop(0)
                await js.publish(subject, payload, headers=headers)
        for subject, payload, headers in pending:
            await js.publish(subject, payload, headers=headers)
        took = await settle(js, timeout=120 + 0.5 * len(cases))
        # afterwards: the stages still run
        after_session, publishes = valid_session("c")
        for subject, payload, headers in publishes:
            await js.publish(subject, payload, headers=headers)
        await settle(js, timeout=120)
        return {"settle_s": took, "dlq": await dead_letters(js), "after": after_session,
                "episodes": [e for e in map(_episode, await read_all(js, subjects.STREAM_EPISODES)) if e]}

    started = time.monotonic()
    got = stack.run(run(), timeout=600 + 2 * len(cases))
    dlq = got["dlq"]

    # every dead letter names its reason
    no_reason = [(src, h.get(subjects.HDR_DLQ_STAGE)) for src, h in dlq.items()
                 if not h.get(subjects.HDR_DLQ_REASON) or not h.get(subjects.HDR_DLQ_DETAIL)]
    assert not no_reason, f"dead letters without a reason or detail: {no_reason[:10]}"

    problems = []
    for case in cases:
        if case.outcome != "stored":
            continue
        door = next(d for d in STREAM_DOORS if case.door == d.name)
        letter = dlq.get(case.extra["source"])
        if letter is not None:
            case.reason = letter.get(subjects.HDR_DLQ_REASON, "")
            case.outcome = "dead_lettered" if letter["stage"] == door.stage else f"dead_lettered_by_{letter['stage']}"
        else:
            case.outcome = "processed"
        if not case.valid and case.outcome != "dead_lettered":
            problems.append(f"{case.how} on {case.door} ({len(case.payload)} bytes, {case.extra['source']}, "
                            f"headers {case.headers}): {case.outcome}")
        elif case.outcome == "dead_lettered" and case.reason not in REASONS[door.stage]:
            problems.append(f"{case.how} on {case.door}: unknown reason {case.reason!r}")
        elif case.valid and case.outcome == "dead_lettered" and case.reason != "processing_failed":
            problems.append(f"valid {case.how} on {case.door} rejected as {case.reason}")
    assert not problems, "\n".join(problems[:30]) + f"\nDLQ: {sorted(dlq)}"

    # all valid traffic processed: every message of every valid session is in exactly one episode
    # (how the turns were cut may vary with timing: a turn left open past the idle timeout is
    # completed without its late reply, which then makes a turn of its own)
    sessions = [s for s, _ in before + during] + [got["after"]]
    by_session = collections.Counter(e.session_id for e in got["episodes"])
    covered = {s: sorted(m.message_id for e in got["episodes"] if e.session_id == s for m in e.messages)
               for s in sessions}
    assert all(ids == ["m0", "m1", "m2", "m3"] for ids in covered.values()), covered

    async def answers() -> list[Any]:
        out = []
        for session in sessions:
            episodes = GraphEpisodesResponse.model_validate(await request(
                stack.nc, subjects.GRAPH_EPISODES,
                GraphEpisodesRequest(group_id=group_of(session), last_n=10).model_dump_json().encode()))
            recall = RecallResponse.model_validate(await request(
                stack.nc, subjects.RECALL,
                RecallRequest(query="Where does Beth live?", group_ids=[group_of(session)],
                              timeout_ms=10_000).model_dump_json().encode()))
            closed = MemoryResponse.model_validate(await request(
                stack.nc, subjects.MEMORY_SESSIONS_LIST,
                ListSessionsRequest(scopes={"session": session}).model_dump_json().encode()))  # type: ignore[arg-type]
            out.append((session, len(episodes.episodes), recall, len(closed.sessions)))
        return out

    for session, n_episodes, recall, n_closed in stack.run(answers()):
        assert n_episodes == by_session[session], (session, n_episodes, by_session[session])
        assert not recall.degraded and any("Porto" in item.fact for item in recall.items), (session, recall)
        assert n_closed == 1, (session, n_closed)

    leaked = [line for line in logs.text().splitlines() if CANARY in line]
    assert not leaked, f"generated content in logs: {leaked[:3]}"

    tally = collections.Counter(f"{c.door} {c.outcome}{' ' + c.reason if c.reason else ''}" for c in cases)
    REPORT["stream"] = {
        "inputs": len(cases), "valid_sessions": len(sessions), "seconds": round(time.monotonic() - started, 1),
        "settle_s": round(got["settle_s"], 1), "invalid": sum(not c.valid for c in cases),
        "dead_lettered_with_reason": sum(c.outcome == "dead_lettered" for c in cases),
        "refused_at_publish": sum(c.outcome.startswith("refused") for c in cases),
        "dead_letters_without_reason": len(no_reason), "outcomes": dict(sorted(tally.items())),
    }


# --- the request/reply doors ---------------------------------------------------------------------
def test_request_doors_answer_every_request_with_a_reason_for_the_bad_ones(stack: Stack, logs: LogCapture) -> None:
    cases = generate_all(REQUEST_DOORS)
    by_name = {d.name: d for d in REQUEST_DOORS}

    async def ask(case: Case) -> None:
        try:
            reply = await stack.nc.request(case.subject, case.payload, headers=case.headers, timeout=90)
        except nats.errors.TimeoutError:
            case.outcome = "no_answer"
            return
        except nats.errors.MaxPayloadError:
            case.outcome = "refused_by_client"
            return
        case.extra["reply"] = reply.data
        try:
            body = json.loads(reply.data)
        except ValueError:
            case.outcome = "unparsable_reply"
            return
        failed = body.get("status") == "error" or body.get("degraded") is True
        case.outcome = "error" if failed else "ok"
        case.reason = body.get("reason") or ""

    async def run() -> None:
        for i in range(0, len(cases), 8):
            await asyncio.gather(*(ask(c) for c in cases[i:i + 8]))

    async def still_answering() -> tuple[RecallResponse, dict[str, Any]]:
        recall = RecallResponse.model_validate(await request(
            stack.nc, subjects.RECALL, RecallRequest(query="Where does Beth live?", group_ids=["nobody"]).model_dump_json().encode()))
        groups = await request(stack.nc, subjects.GRAPH_GROUPS, b"{}")
        return recall, groups

    started = time.monotonic()
    stack.run(run(), timeout=600 + 5 * len(cases))
    # a structured error for every request is not enough: the backends must have survived them
    recall, groups = stack.run(still_answering())
    assert not recall.degraded, recall
    assert groups.get("status") == "ok", groups

    problems = []
    for case in cases:
        door: Door = by_name[case.door]
        if case.outcome in ("no_answer", "unparsable_reply"):
            problems.append(f"{case.how} on {case.door}: {case.outcome}")
            continue
        if case.outcome == "refused_by_client":
            continue
        response_model = _response_model(door)
        try:
            response_model.model_validate_json(case.extra["reply"])
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{case.how} on {case.door}: reply does not match {response_model.__name__}: {exc}")
        if not case.valid and not (case.outcome == "error" and case.reason.startswith("bad_request")):
            problems.append(f"{case.how} on {case.door}: {case.outcome} {case.reason!r} for a request its schema rejects")
        if case.outcome == "error" and not case.reason:
            problems.append(f"{case.how} on {case.door}: an error without a reason")
        if case.valid and case.reason.startswith("backend_error"):
            problems.append(f"{case.how} on {case.door}: a valid request failed in the backend ({case.reason})")
    assert not problems, "\n".join(problems[:30])

    leaked = [line for line in logs.text().splitlines() if CANARY in line]
    assert not leaked, f"generated content in logs: {leaked[:3]}"

    # the reason's kind (bad_request details name fields; a backend_error names its exception type)
    tally = collections.Counter(
        f"{c.door} {c.outcome} {c.reason if c.reason.startswith('backend_error') else c.reason.split(':')[0]}".strip()
        for c in cases)
    REPORT["request"] = {
        "inputs": len(cases), "seconds": round(time.monotonic() - started, 1),
        "invalid": sum(not c.valid for c in cases),
        "answered_bad_request": sum(c.reason.startswith("bad_request") for c in cases),
        "errors_without_reason": sum(c.outcome == "error" and not c.reason for c in cases),
        "no_answer": sum(c.outcome == "no_answer" for c in cases),
        "outcomes": dict(sorted(tally.items())),
    }


def _response_model(door: Door) -> Any:
    from engram.schemas import messages as m
    from engram.schemas.memory import ContextResponse

    if door.name == subjects.RECALL:
        return RecallResponse
    if door.name == subjects.CONTEXT:
        return ContextResponse
    if door.name.startswith("engram.memory."):
        return MemoryResponse
    return {
        subjects.GRAPH_EPISODES: m.GraphEpisodesResponse, subjects.GRAPH_EDGE_GET: m.GraphEdgeResponse,
        subjects.GRAPH_EDGE_DELETE: m.GraphDeleteResponse, subjects.GRAPH_EPISODE_DELETE: m.GraphDeleteResponse,
        subjects.GRAPH_GROUP_DELETE: m.GraphDeleteResponse, subjects.GRAPH_GROUPS: m.GraphGroupsResponse,
        subjects.GRAPH_ENTITY_SAVE: m.GraphEntityNodeResponse, subjects.GRAPH_ENTITIES: m.GraphEntitiesResponse,
    }[door.name]


# --- bodies larger than NATS carries ---------------------------------------------------------------
def test_ten_megabyte_bodies_are_refused_cleanly(stack: Stack) -> None:
    """10 MB on an input subject: the client refuses it before sending; a raw client that sends it
    anyway is refused by the server (which closes that connection only); the services go on."""
    body = b"x" * (10 * 1024 * 1024)

    async def client_side() -> str:
        try:
            await stack.nc.jetstream().publish(subjects.in_message("big"), body)
        except nats.errors.MaxPayloadError:
            return "refused"
        return "published"

    assert stack.run(client_side()) == "refused"

    host, port = stack.settings.nats_url.split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as raw:
        raw.recv(4096)  # INFO
        raw.sendall(b'CONNECT {"verbose":false,"pedantic":false}\r\n')
        raw.sendall(f"PUB engram.in.message.big {len(body)}\r\n".encode())
        try:
            raw.sendall(body + b"\r\n")
        except OSError:
            pass  # the server may close the socket before all of it is sent
        answer = b""
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and b"-ERR" not in answer:
            try:
                chunk = raw.recv(4096)
            except OSError:
                break
            if not chunk:
                break
            answer += chunk
    assert b"Maximum Payload" in answer, answer[:200]

    # recall still answers
    async def after() -> RecallResponse:
        return RecallResponse.model_validate(await request(
            stack.nc, subjects.RECALL, RecallRequest(query="anything", group_ids=["nobody"]).model_dump_json().encode()))

    reply = stack.run(after())
    assert not reply.degraded, reply
    REPORT["ten_megabytes"] = {"client": "refused (MaxPayloadError)", "server": "-ERR Maximum Payload Violation"}
