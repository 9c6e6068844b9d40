"""Generate schemas/json/*.schema.json and schemas/asyncapi.yaml from the pydantic models.

Run ``python -m engram.schemas.export`` after changing a model; ``--check`` exits 1 when the files on
disk differ from what the models generate (the drift test calls the same function).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from . import subjects
from . import ALL_MODELS
from . import memory
from .messages import ChatMessage, Episode, NodeDelta, RecallRequest, RecallResponse
from .messages import SessionClosed, SessionIdle, SummaryAudit, SummaryEvent, SummaryTick
from .messages import TripletAddRequest
from .messages import (
    GraphDeleteResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEpisodeDeleteRequest,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphGroupDeleteRequest,
    GraphGroupsRequest,
    GraphGroupsResponse,
    GraphEntityNodeRequest,
    GraphEntitiesRequest,
    GraphEpisodeEntitiesRequest,
    GraphEntitiesResponse,
    GraphEntityNodeResponse,
)

HERE = Path(__file__).parent
JSON_DIR = HERE / "json"
ASYNCAPI_FILE = HERE / "asyncapi.yaml"

# A channel's payload: a pydantic model, several (one subject carries more than one kind), an
# inline JSON schema (name, schema) for a payload without a model, or None for raw bytes.
Payload = type[BaseModel] | tuple[type[BaseModel], ...] | tuple[str, dict[str, Any]] | None

# channel id -> (address, payload, description). Every subject constant of schemas/subjects.py
# must be the address of one channel: asyncapi_document() refuses to export otherwise.
CHANNELS: dict[str, tuple[str, Payload, str]] = {
    "inMessage": (subjects.IN_MESSAGE, ChatMessage, "Chat messages from agents (set Nats-Msg-Id = message_id)."),
    "inClose": (subjects.IN_CLOSE, SessionClosed, "A chat session ended: its open turn is flushed."),
    "inIdle": (subjects.IN_IDLE, SessionIdle,
               "Idle tick fired by a NATS message schedule, sourced from ENGRAM_SCHED (internal; publishers must not "
               "send it)."),
    "schedIdle": (subjects.SCHED_IDLE, SessionIdle,
                  "The turn-detector's idle schedule of a session in ENGRAM_SCHED (Nats-Schedule header; one pending "
                  "per session): the server fires it into engram.sched.fired.idle.<session> (internal)."),
    "schedIdleFired": (subjects.SCHED_IDLE_FIRED, SessionIdle,
                       "A fired idle schedule (ENGRAM_SCHED); ENGRAM_IN sources it as engram.in.<p>.idle.<session> "
                       "(internal)."),
    "episode": (subjects.EPISODE, Episode, "Completed turns, one per enabled scope group."),
    "delta": (subjects.DELTA, (NodeDelta, SummaryTick),
              "What one episode changed on one entity; also the summary-gate's fired SummaryTicks."),
    "summaryTick": (
        subjects.SCHED_SUMMARY,
        SummaryTick,
        "Deferred summary refresh: a NATS message schedule in ENGRAM_SCHED, fired into "
        "engram.sched.fired.summary.<group> (internal).",
    ),
    "summaryTickFired": (
        subjects.SCHED_SUMMARY_FIRED,
        SummaryTick,
        "A fired summary schedule (ENGRAM_SCHED); ENGRAM_DELTAS sources it into the group's delta subject (internal).",
    ),
    "summary": (subjects.SUMMARY, SummaryEvent, "Every summary-gate decision."),
    "summaryAudit": (subjects.SUMMARY_AUDIT, SummaryAudit, "Sample of skipped summaries with facts and kept summary."),
    "recall": (subjects.RECALL, RecallRequest, "Recall request; the reply is a RecallResponse."),
    "ctlForgetSessions": (
        subjects.CTL_FORGET_SESSIONS,
        ("ForgetSessions", {"type": "array", "items": {"type": "string", "pattern": subjects.SESSION_ID_PATTERN}}),
        "Core NATS (no stream), published by recall after a delete: session ids whose state was erased; "
        "every turn-detector replica drops them from its cache.",
    ),
    "graphEpisodes": (subjects.GRAPH_EPISODES, GraphEpisodesRequest, "A group's latest episodes (graph admin, served by recall)."),
    "graphEdgeGet": (subjects.GRAPH_EDGE_GET, GraphEdgeRequest, "One fact by uuid (graph admin)."),
    "graphEdgeDelete": (subjects.GRAPH_EDGE_DELETE, GraphEdgeRequest, "Delete one fact by uuid (graph admin)."),
    "graphEpisodeDelete": (subjects.GRAPH_EPISODE_DELETE, GraphEpisodeDeleteRequest,
                           "Delete an episode and what only it supported, leaving no orphans (graph admin)."),
    "graphGroupDelete": (subjects.GRAPH_GROUP_DELETE, GraphGroupDeleteRequest, "Delete a whole group (graph admin)."),
    "graphGroups": (subjects.GRAPH_GROUPS, GraphGroupsRequest, "Every group that holds a node (graph admin)."),
    "graphEntitySave": (subjects.GRAPH_ENTITY_SAVE, GraphEntityNodeRequest,
                        "Create or update one entity node with a name and summary (graph admin)."),
    "graphEntities": (subjects.GRAPH_ENTITIES, GraphEntitiesRequest,
                      "A group's entity nodes with their summaries, by uuid or newest first (graph admin)."),
    "graphEpisodeEntities": (subjects.GRAPH_EPISODE_ENTITIES, GraphEpisodeEntitiesRequest,
                             "The entities and facts some episodes produced, whatever their groups (graph admin)."),
    "sessionClosed": (subjects.SESSION_CLOSED, memory.SessionSegmentClosed,
                      "One segment of a publisher session ended (token limit, idle, explicit): its transcript "
                      "tail for the session close stage."),
    "memoryNoteSave": (subjects.MEMORY_NOTE_SAVE, memory.SaveUserNoteRequest, "Save a note about the user (request/reply)."),
    "memoryNoteDelete": (subjects.MEMORY_NOTE_DELETE, memory.DeleteUserNoteRequest, "Delete one note (request/reply)."),
    "memoryNotesList": (subjects.MEMORY_NOTES_LIST, memory.ListUserNotesRequest, "The user's notes, newest first."),
    "memoryPreferenceSet": (subjects.MEMORY_PREFERENCE_SET, memory.SetUserPreferenceRequest,
                            "Set a preference key -> value (the latest wins, history kept)."),
    "memoryPreferenceGet": (subjects.MEMORY_PREFERENCE_GET, memory.GetUserPreferencesRequest,
                            "The user's current preferences (optionally with history)."),
    "memoryPreferenceRemove": (subjects.MEMORY_PREFERENCE_REMOVE, memory.RemoveUserPreferenceRequest,
                               "End a preference's current value."),
    "memorySessionsList": (subjects.MEMORY_SESSIONS_LIST, memory.ListSessionsRequest,
                           "Closed session segments with their hybrid summaries, newest first."),
    "tripletAdd": (subjects.TRIPLET_ADD, TripletAddRequest,
                   "Store a fact given whole, with no extraction pass (request/reply, served by the gateway)."),
    "memoryActivityLog": (subjects.MEMORY_ACTIVITY_LOG, memory.LogActivityRequest,
                          "Log an activity done for the user (request/reply; the oldest past the kept count go)."),
    "memoryActivitiesList": (subjects.MEMORY_ACTIVITIES_LIST, memory.ListActivitiesRequest,
                             "The user's activity log, newest first."),
    "memoryActivityDelete": (subjects.MEMORY_ACTIVITY_DELETE, memory.DeleteActivityRequest,
                             "Delete one activity log entry (request/reply)."),
    "memoryFavoriteAdd": (subjects.MEMORY_FAVORITE_ADD, memory.AddFavoriteRequest,
                          "Mark an item as the user's favorite (request/reply; an equal one is stored once)."),
    "memoryFavoritesList": (subjects.MEMORY_FAVORITES_LIST, memory.ListFavoritesRequest,
                            "The user's favorites, newest first."),
    "memoryFavoriteRemove": (subjects.MEMORY_FAVORITE_REMOVE, memory.RemoveFavoriteRequest,
                             "Remove one favorite (request/reply)."),
    "context": (subjects.CONTEXT, memory.ContextRequest,
                "The agent's layered context (identity, agent memory, user context, last session summary, "
                "skills, recall), each layer within its token budget."),
    "deadLetter": (
        subjects.DLQ,
        None,
        "Dead letters: the original bytes with the original headers plus "
        f"{subjects.HDR_DLQ_STAGE}, {subjects.HDR_DLQ_REASON}, {subjects.HDR_DLQ_DETAIL}, "
        f"{subjects.HDR_DLQ_SUBJECT} and {subjects.HDR_DLQ_TIME}.",
    ),
}


REPLIES: dict[str, type[BaseModel]] = {
    "recall": RecallResponse,
    "graphEpisodes": GraphEpisodesResponse,
    "graphEdgeGet": GraphEdgeResponse,
    "graphEdgeDelete": GraphDeleteResponse,
    "graphEpisodeDelete": GraphDeleteResponse,
    "graphGroupDelete": GraphDeleteResponse,
    "graphGroups": GraphGroupsResponse,
    "graphEntitySave": GraphEntityNodeResponse,
    "graphEntities": GraphEntitiesResponse,
    **{cid: memory.MemoryResponse for cid in ("memoryNoteSave", "memoryNoteDelete", "memoryNotesList",
                                              "memoryPreferenceSet", "memoryPreferenceGet", "memoryPreferenceRemove",
                                              "memorySessionsList")},
    "context": memory.ContextResponse,
}


def json_schemas() -> dict[str, dict[str, Any]]:
    out = {m.__name__: m.model_json_schema(mode="validation") for m in ALL_MODELS}
    return out


def _params(address: str) -> dict[str, Any]:
    names = [tok[1:-1] for tok in address.split(".") if tok.startswith("{")]
    return {n: {"description": f"{n} token, matching {subjects.TOKEN_PATTERN}"} for n in names}


def subject_constants() -> dict[str, str]:
    """Every subject template schemas/subjects.py defines: its upper-case ``engram.*`` strings."""
    return {name: value for name, value in vars(subjects).items()
            if name.isupper() and isinstance(value, str) and value.startswith("engram.")}


def missing_channels(channels: dict[str, tuple[str, Payload, str]] | None = None) -> dict[str, str]:
    """Subject constants that no channel has as its address (name -> template)."""
    addresses = {address for address, _, _ in (CHANNELS if channels is None else channels).values()}
    return {name: value for name, value in subject_constants().items() if value not in addresses}


def _channel_messages(payload: Payload) -> dict[str, dict[str, Any]]:
    """Component messages (name -> definition) of one channel's payload."""
    if payload is None:
        return {"DeadLetter": {"name": "DeadLetter", "payload": {"type": "string", "format": "binary"}}}
    if isinstance(payload, tuple) and payload and isinstance(payload[0], str):
        name, schema = payload
        return {name: {"name": name, "contentType": "application/json", "payload": schema}}
    models = payload if isinstance(payload, tuple) else (payload,)
    return {m.__name__: {"name": m.__name__, "contentType": "application/json",
                         "payload": {"$ref": f"json/{m.__name__}.schema.json"}} for m in models}


def asyncapi_document(channel_table: dict[str, tuple[str, Payload, str]] | None = None) -> dict[str, Any]:
    table = CHANNELS if channel_table is None else channel_table
    if missing := missing_channels(table):
        raise ValueError(f"subjects without an AsyncAPI channel in schemas/export.py CHANNELS: {sorted(missing)}")
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for cid, (address, payload, description) in table.items():
        chan: dict[str, Any] = {"address": address, "description": description}
        if params := _params(address):
            chan["parameters"] = params
        chan_messages = _channel_messages(payload)
        messages.update(chan_messages)
        chan["messages"] = {name: {"$ref": f"#/components/messages/{name}"} for name in chan_messages}
        channels[cid] = chan
        operations[f"publish_{cid}"] = {"action": "send", "channel": {"$ref": f"#/channels/{cid}"}}
    for cid, reply in REPLIES.items():  # request/reply subjects: the reply's message
        if cid not in table:
            continue
        messages[reply.__name__] = {
            "name": reply.__name__,
            "contentType": "application/json",
            "payload": {"$ref": f"json/{reply.__name__}.schema.json"},
        }
        operations[f"publish_{cid}"]["reply"] = {"messages": [{"$ref": f"#/components/messages/{reply.__name__}"}]}
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "engram",
            "version": "1",
            "description": "Subjects and messages of the engram conversation-memory pipeline.",
        },
        "defaultContentType": "application/json",
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages},
    }


def rendered_files() -> dict[Path, str]:
    files = {
        JSON_DIR / f"{name}.schema.json": json.dumps(schema, indent=2, sort_keys=True) + "\n"
        for name, schema in json_schemas().items()
    }
    files[ASYNCAPI_FILE] = yaml.safe_dump(asyncapi_document(), sort_keys=False, width=100)
    return files


def drifted_files() -> list[Path]:
    """Files whose content on disk differs from what the models generate (or that are missing)."""
    out = []
    for path, text in rendered_files().items():
        if not path.exists() or path.read_text() != text:
            out.append(path)
    stale = {p for p in JSON_DIR.glob("*.schema.json")} - set(rendered_files())
    return out + sorted(stale)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if generated files are stale")
    args = parser.parse_args(argv)
    if args.check:
        drift = drifted_files()
        for p in drift:
            print(f"stale: {p.relative_to(HERE.parent)}", file=sys.stderr)
        return 1 if drift else 0
    JSON_DIR.mkdir(exist_ok=True)
    for stale in set(JSON_DIR.glob("*.schema.json")) - set(rendered_files()):
        stale.unlink()
    for path, text in rendered_files().items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
