"""Pure mapping between the Graphiti REST contract and engram's messages (no I/O)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

from schemas import ChatMessage, RecallItem, RecallMessage, RecallRequest, ScopeKeys
from schemas.messages import GraphEpisode, GraphFact
from services.gateway.models import EntityEdgeResult, EpisodeResult, FactResult, Message

RECALL_TOKEN_BUDGET = 100_000
"""The REST contract limits by ``max_facts`` only: give recall's token budget its maximum."""


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)


def message_id_for(group_id: str, message: Message, timestamp: datetime) -> str:
    """The client's uuid, else a hash of what the message is: a retried POST maps to the same id."""
    if message.uuid:
        return message.uuid
    key = json.dumps([group_id, message.role_type, message.role or "", message.content, _utc(timestamp).isoformat()],
                     ensure_ascii=False, separators=(",", ":"))
    return "gw-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def dedupe_header(group_id: str, message_id: str) -> str:
    """The Nats-Msg-Id. JetStream deduplicates per stream, not per subject: scoping the id by group
    keeps a client uuid that is written to two groups (session + workspace) from being dropped
    as a duplicate in the second."""
    return f"{group_id}:{message_id}"


def chat_messages(group_id: str, messages: list[Message], now: datetime) -> list[ChatMessage]:
    """One ChatMessage per REST message, in order, all in session ``group_id`` writing to exactly
    that group. Messages without a timestamp get ``now`` plus their index in microseconds: their
    order is kept and two equal messages of one request get different ids."""
    out = []
    for i, m in enumerate(messages):
        timestamp = _utc(m.timestamp) if m.timestamp else now + timedelta(microseconds=i)
        out.append(ChatMessage(
            message_id=message_id_for(group_id, m, timestamp),
            session_id=group_id,
            role=m.role_type,
            content=m.content,
            timestamp=timestamp,
            scopes=ScopeKeys(session=True, group=group_id),
            name=m.role or None,
            source_description=m.source_description or None,
            metadata={"name": m.name} if m.name else {},
        ))
    return out


def search_request(query: str, group_ids: list[str], max_facts: int, timeout_ms: int) -> RecallRequest:
    # The Graphiti contract returns facts (edges): no past turns here.
    return RecallRequest(query=query, group_ids=group_ids, max_facts=max_facts, include_episodes=False,
                         token_budget=RECALL_TOKEN_BUDGET, timeout_ms=timeout_ms)


def memory_request(group_id: str, messages: list[Message], max_facts: int, timeout_ms: int) -> RecallRequest:
    return RecallRequest(
        recent_messages=[RecallMessage(role=m.role_type, content=m.content) for m in messages],
        group_ids=[group_id], max_facts=max_facts, include_episodes=False, token_budget=RECALL_TOKEN_BUDGET,
        timeout_ms=timeout_ms,
    )


def fact_result(item: RecallItem) -> FactResult:
    return FactResult(uuid=item.uuid, name=item.name, fact=item.fact, valid_at=item.valid_at,
                      invalid_at=item.invalid_at, created_at=item.created_at, expired_at=item.expired_at)


def episode_result(episode: GraphEpisode) -> EpisodeResult:
    return EpisodeResult(
        uuid=episode.uuid, name=episode.name, group_id=episode.group_id, created_at=episode.created_at,
        source=episode.source, source_description=episode.source_description, content=episode.content,
        valid_at=episode.valid_at, entity_edges=episode.entity_edges, message_ids=episode.message_ids,
    )


def edge_result(edge: GraphFact) -> EntityEdgeResult:
    return EntityEdgeResult(**edge.model_dump())
