"""Hostile inputs for every subject engram consumes, generated with hypothesis.

A *door* is one subject (family) a service consumes: the JetStream inputs (chat messages, closes,
idle ticks, episodes, NodeDeltas and summary ticks, closed session segments), the request/reply
subjects (recall, context, proactive memory, graph admin) and the core control subject. For each
door a case starts from a document its own schema accepts (generated from the pydantic model's
JSON schema by schemathesis's JSON-schema generator), then is kept valid or broken in one way:
a field dropped, an unknown field, a field of another type, another ``schema_version``, a bad or
forged id (the body naming another session/group than the subject), invalid UTF-8, truncated
JSON, deeply nested JSON, a top-level non-object, an empty or random body, a large body (up to
NATS's max payload); with missing, random or forged headers (a forged dead-letter reason, a
Nats-Msg-Id, expectations and schedules the server must refuse, a garbage traceparent).

Counts: ``ENGRAM_FUZZ_EXAMPLES`` generated cases per door (default 12: the CI run). Generation
is derandomized (the same cases every run for a given count), so a failure reproduces.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Literal

import jsonschema_rs
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from schemathesis.generation.jsonschema.builder import build as schema_strategy

from engram.schemas import messages as m
from engram.schemas import memory as mem
from engram.schemas import subjects
from engram.services.sessions import memory as memory_ops

EXAMPLES = int(os.environ.get("ENGRAM_FUZZ_EXAMPLES", "12"))
CANARY = "zqxcanary"
"""Put into every generated content field: it must never show up in a log line."""
NATS_MAX_PAYLOAD = 8 * 1024 * 1024  # max_payload of engram's embedded nats-server (engram/stack/embedded.py)
TD_MAX_BYTES = 2 * 1024 * 1024  # ENGRAM_TURN_MAX_MESSAGE_BYTES default: larger inputs are "oversize"
RUN = uuid.uuid4().hex[:6]
POOL_SESSIONS = [f"fz{RUN}s{i}" for i in range(3)]
POOL_GROUPS = [f"fz{RUN}g{i}" for i in range(3)]

_FORMATS = {"date-time": st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(2200, 1, 1),
                                      timezones=st.just(timezone.utc)).map(lambda d: d.isoformat())}
CONTENT_KEYS = frozenset({"content", "text", "query", "fact", "node_name", "value", "summary", "identity", "skills"})


@dataclass(frozen=True)
class Door:
    name: str
    kind: Literal["stream", "request", "core"]
    models: tuple[type[BaseModel], ...]
    stage: str = ""  # the dead-letter stage of a stream door
    token_field: str = ""  # body field the subject's last token names (stream doors)
    pool: tuple[str, ...] = ()

    def subject(self, token: str = "") -> str:
        return f"{self.name}.{token}" if self.kind == "stream" else self.name

    def model_for(self, document: Any) -> type[BaseModel]:
        if len(self.models) > 1 and isinstance(document, dict) and document.get("type") == "summary_tick":
            return self.models[1]
        return self.models[0]


STREAM_DOORS = [
    Door("engram.in.message", "stream", (m.ChatMessage,), "turn_detector", "session_id", tuple(POOL_SESSIONS)),
    Door("engram.in.close", "stream", (m.SessionClosed,), "turn_detector", "session_id", tuple(POOL_SESSIONS)),
    Door("engram.in.idle", "stream", (m.SessionIdle,), "turn_detector", "session_id", tuple(POOL_SESSIONS)),
    Door("engram.episode", "stream", (m.Episode,), "extractor", "group_id", tuple(POOL_GROUPS)),
    Door("engram.delta", "stream", (m.NodeDelta, m.SummaryTick), "summary_gate", "group_id", tuple(POOL_GROUPS)),
    Door("engram.session.closed", "stream", (mem.SessionSegmentClosed,), "sessions", "session_id",
         tuple(POOL_SESSIONS)),
]
REQUEST_DOORS = [
    Door(subjects.RECALL, "request", (m.RecallRequest,)),
    Door(subjects.CONTEXT, "request", (mem.ContextRequest,)),
    *(Door(subject, "request", (op.model,)) for subject, op in memory_ops.OPERATIONS.items()),
    Door(subjects.GRAPH_EPISODES, "request", (m.GraphEpisodesRequest,)),
    Door(subjects.GRAPH_EDGE_GET, "request", (m.GraphEdgeRequest,)),
    Door(subjects.GRAPH_EDGE_DELETE, "request", (m.GraphEdgeRequest,)),
    Door(subjects.GRAPH_EPISODE_DELETE, "request", (m.GraphEpisodeDeleteRequest,)),
    Door(subjects.GRAPH_GROUP_DELETE, "request", (m.GraphGroupDeleteRequest,)),
    Door(subjects.GRAPH_GROUPS, "request", (m.GraphGroupsRequest,)),
    Door(subjects.GRAPH_ENTITY_SAVE, "request", (m.GraphEntityNodeRequest,)),
    Door(subjects.GRAPH_ENTITIES, "request", (m.GraphEntitiesRequest,)),
]
CORE_DOORS = [Door(subjects.CTL_FORGET_SESSIONS, "core", ())]


@dataclass
class Case:
    door: str
    subject: str
    payload: bytes
    headers: dict[str, str] | None
    how: str  # which mutation made it
    valid: bool  # what the door's own schema (and subject rule) says; the oracle for its outcome
    outcome: str = ""
    reason: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --- building blocks ----------------------------------------------------------------------------
json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(json_leaves, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=10)
bad_ids = st.one_of(
    st.just(""), st.just("a.b"), st.just("*"), st.just(">"), st.just("a b"), st.just("../etc"),
    st.just("x" * 300), st.just("ünïcode"), st.just("a\u0000b"), st.text(min_size=1, max_size=30),
)
# subject tokens NATS accepts (no whitespace, '.', '*' or '>') that are not engram tokens
odd_tokens = st.text(st.characters(blacklist_categories=("Cs", "Zs", "Cc"), blacklist_characters=".*>"),
                     min_size=1, max_size=20)
header_text = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=40)
forged_headers = st.one_of(
    st.none(),
    st.just({}),
    st.fixed_dictionaries({subjects.HDR_MSG_ID: header_text.filter(lambda s: s.strip())}),
    st.just({subjects.HDR_DLQ_REASON: "forged", subjects.HDR_DLQ_STAGE: "forged", subjects.HDR_DLQ_SUBJECT: "engram.x"}),
    st.just({"Nats-Expected-Stream": "NOT_A_STREAM"}),
    st.just({"Nats-Expected-Last-Sequence": "not-a-number"}),
    st.just({"Nats-Schedule": "@at nonsense"}),
    st.just({"Nats-Schedule": "@at 2000-01-01T00:00:00Z", "Nats-Schedule-Target": "engram.in.close.x"}),
    # purged ENGRAM_IN (valid traffic included) while it allowed message schedules
    st.just({"Nats-Rollup": "all"}),
    st.just({"Nats-Rollup": "sub"}),
    st.fixed_dictionaries({"traceparent": header_text}),
    st.dictionaries(st.from_regex(r"\A[A-Za-z][A-Za-z0-9-]{0,20}\Z"), header_text, max_size=3),
)
HOW = ("valid", "valid", "drop", "unknown", "retype", "version", "bad_id", "forged_token", "utf8", "truncated",
       "nested", "not_object", "empty", "bytes", "large")


def valid_documents(model: type[BaseModel]) -> st.SearchStrategy[Any]:
    return schema_strategy(model.model_json_schema(), draft=jsonschema_rs.Draft202012, formats=_FORMATS)


def _with_canary(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: (f"{v} {CANARY}" if k in CONTENT_KEYS and isinstance(v, str) else _with_canary(v))
                for k, v in doc.items()}
    if isinstance(doc, list):
        return [_with_canary(v) for v in doc]
    return doc


def _nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"1" + b"}" * depth


@st.composite
def cases(draw: st.DrawFn, door: Door) -> Case:
    model = draw(st.sampled_from(door.models)) if door.models else None
    doc: Any = draw(valid_documents(model)) if model is not None else draw(st.lists(st.text(max_size=12), max_size=3))
    if door.kind == "stream" and isinstance(doc, dict):
        doc[door.token_field] = draw(st.sampled_from(door.pool))
        if door.token_field == "group_id" and "session_id" in doc:
            doc["session_id"] = draw(st.sampled_from(POOL_SESSIONS))
    doc = _with_canary(doc)
    token = doc.get(door.token_field, "") if isinstance(doc, dict) else ""
    how = draw(st.sampled_from(HOW))
    headers = draw(forged_headers)
    keys = list(doc) if isinstance(doc, dict) else []
    payload: bytes
    if how == "drop" and keys:
        doc.pop(draw(st.sampled_from(keys)))
    elif how == "unknown" and isinstance(doc, dict):
        doc[draw(st.text(min_size=1, max_size=12).filter(lambda k: k not in doc))] = draw(json_values)
    elif how == "retype" and keys:
        doc[draw(st.sampled_from(keys))] = draw(json_values)
    elif how == "version" and isinstance(doc, dict):
        doc["schema_version"] = draw(st.one_of(st.integers(), st.just("1"), st.floats(), st.none(), json_values)
                                     .filter(lambda v: v != 1))
    elif how == "bad_id" and door.token_field:
        doc[door.token_field] = draw(bad_ids)
    elif how == "forged_token" and door.kind == "stream":
        # the subject names another (maybe odd) session/group than the body
        token = draw(st.one_of(st.sampled_from(door.pool), odd_tokens).filter(lambda t: t != token))
    if how == "utf8":
        text = json.dumps(doc, ensure_ascii=False).encode()
        at = draw(st.integers(0, len(text)))
        payload = text[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80"])) + text[at:]
    elif how == "truncated":
        text = json.dumps(doc).encode()
        payload = text[: draw(st.integers(0, max(0, len(text) - 1)))]
    elif how == "nested":
        payload = _nested(draw(st.sampled_from([199, 201, 800, 999, 1000, 5000, 100_000])),
                          draw(st.sampled_from(["list", "object"])))
    elif how == "not_object":
        payload = json.dumps(draw(st.one_of(json_leaves, st.lists(json_values, max_size=3)))).encode()
    elif how == "empty":
        payload = b""
    elif how == "bytes":
        payload = draw(st.binary(max_size=64))
    elif how == "large":
        # a document whose content is large: just under and over the turn-detector's limit, and
        # up to what NATS carries at all (its max_payload, headers included: the last size is cut
        # to end right at the limit, so it is not JSON any more)
        room = NATS_MAX_PAYLOAD - 16 - sum(len(k.encode()) + len(v.encode()) + 4 for k, v in (headers or {}).items())
        size = draw(st.sampled_from([64 * 1024, TD_MAX_BYTES + 1, NATS_MAX_PAYLOAD - 4096, room]))
        key = next((k for k in keys if k in CONTENT_KEYS), "padding")
        if isinstance(doc, dict):
            doc[key] = CANARY + "x" * size
        payload = json.dumps(doc).encode()[:room]
    else:
        payload = json.dumps(doc, allow_nan=True).encode()
    subject = door.subject(token) if door.kind == "stream" else door.name
    return Case(door.name, subject, payload, headers, how, valid=is_valid(door, subject, payload))


def is_valid(door: Door, subject: str, payload: bytes) -> bool:
    """What the door's own contract says of this message: its schema, and for stream doors the
    rule that the body names the session/group of the subject (and the turn-detector's size limit)."""
    if door.kind == "core":
        try:
            value = json.loads(payload)
        except (ValueError, RecursionError):
            return False
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    try:
        document = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    model = door.model_for(document)
    try:
        parsed = model.model_validate_json(payload)
    except ValidationError:
        return False
    if door.kind == "stream":
        if getattr(parsed, door.token_field) != subject.rsplit(".", 1)[-1]:
            return False
        if door.stage == "turn_detector" and len(payload) > TD_MAX_BYTES:
            return False
    return True


def generate(door: Door, n: int = EXAMPLES) -> list[Case]:
    """``n`` cases for ``door`` (fewer when hypothesis runs out of distinct ones)."""
    out: list[Case] = []

    @settings(max_examples=n, database=None, deadline=None, derandomize=True, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(cases(door))
    def collect(case: Case) -> None:
        out.append(case)

    collect()
    return out


def generate_all(doors: list[Door], n: int = EXAMPLES) -> list[Case]:
    return [case for door in doors for case in generate(door, n)]


Check = Callable[[Case], None]
