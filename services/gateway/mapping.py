"""Pure mapping between the Graphiti REST contract and engram's messages (no I/O)."""

from __future__ import annotations

import hashlib
import json
from datetime import datetime, timedelta, timezone

from engram.schemas import subjects
from engram.publishing.triplets import triplet_episode
from engram.schemas import ChatMessage, Episode, EpisodeMessage, ExtractionOverride, RecallItem, RecallMessage, RecallRequest, ScopeKeys, TripletFact
from engram.text.secrets import scrub_secrets
from engram.schemas.ids import episode_id_for
from engram.schemas.messages import GraphEpisode, GraphFact
from engram.schemas.relations import canonical_relation
from engram.services.extractor.pipeline import safe_entity_name
from engram.services.gateway.models import AddTripletRequest, EntityEdgeResult, EpisodeResult, FactFilters, FactResult, Message

RECALL_TOKEN_BUDGET = 100_000
"""The REST contract limits by ``max_facts`` only: give recall's token budget its maximum."""


def _utc(value: datetime) -> datetime:
    return value.astimezone(timezone.utc) if value.tzinfo else value.replace(tzinfo=timezone.utc)


def message_id_for(group_id: str, message: Message, occurrence: int = 0, request_id: str = "") -> str:
    """The client's uuid, else a hash of what the message is -- group, role, name, content, the
    client's timestamp if it sent one, and ``occurrence`` (how many equal messages came before it
    in the same request) -- so a retried POST maps to the same ids and is stored once, while two
    equal messages of one request are both kept. Never the arrival time: a retry arrives later.
    Without uuid and timestamp, ``request_id`` tells an equal message of a later request apart
    (services/gateway/idempotency.py: the Idempotency-Key, or the first arrival of an identical
    request within the retry window), so "yes" said twice is stored twice."""
    if message.uuid:
        return message.uuid
    stamp = _utc(message.timestamp).isoformat() if message.timestamp else ""
    parts: list = [group_id, message.role_type, message.role or "", message.name or "", message.content, stamp,
                   occurrence]
    if not stamp and request_id:  # ids of stamped messages keep their form: they are already distinct
        parts.append(request_id)
    key = json.dumps(parts, ensure_ascii=False, separators=(",", ":"))
    return "gw-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32]


def dedupe_header(message: ChatMessage, epoch: int = 0) -> str:
    """The Nats-Msg-Id: :func:`engram.schemas.subjects.message_dedupe_id` (session, scopes, id, epoch),
    like every engram publisher. ``epoch`` changes when a delete erased the session."""
    return subjects.message_dedupe_id(message.session_id, message.scopes, message.message_id, epoch)


def chat_messages(group_id: str, messages: list[Message], now: datetime,
                  idle_timeout_s: float | None = None, request_id: str = "") -> list[ChatMessage]:
    """One ChatMessage per REST message, in order, all in session ``group_id`` writing to exactly
    that group. Messages without a timestamp get ``now`` plus their index in microseconds: their
    order is kept and two equal messages of one request get different ids. ``request_id``: see
    :func:`message_id_for`."""
    out = []
    seen: dict[str, int] = {}
    for i, m in enumerate(messages):
        timestamp = _utc(m.timestamp) if m.timestamp else now + timedelta(microseconds=i)
        base = message_id_for(group_id, m, request_id=request_id)
        occurrence = seen.get(base, 0)
        seen[base] = occurrence + 1
        out.append(ChatMessage(
            message_id=message_id_for(group_id, m, occurrence, request_id) if occurrence else base,
            session_id=group_id,
            role=m.role_type,
            content=m.content,
            timestamp=timestamp,
            scopes=ScopeKeys(session=True, group=group_id),
            name=m.role or None,
            source_description=m.source_description or None,
            metadata={"name": m.name} if m.name else {},
            idle_timeout_s=idle_timeout_s,
            extraction=extraction_override(m.custom_extraction_instructions),
        ))
    return out


def extraction_override(custom_extraction_instructions: str | None,
                        excluded_entity_types: list[str] | None = None) -> ExtractionOverride | None:
    """Graphiti's ``custom_extraction_instructions`` and ``excluded_entity_types`` as engram's
    per-turn override; neither: none (the configured preprocessing prompt stays)."""
    text = (custom_extraction_instructions or "").strip()
    if not text and not excluded_entity_types:
        return None
    return ExtractionOverride(preprocessing_prompt=text or None, excluded_entity_types=list(excluded_entity_types or []))


def search_request(query: str, group_ids: list[str], max_facts: int, timeout_ms: int,
                   filters: FactFilters | None = None) -> RecallRequest:
    # The Graphiti contract returns facts (edges): no past turns here.
    return RecallRequest(query=query, group_ids=group_ids, max_facts=max_facts, include_episodes=False,
                         token_budget=RECALL_TOKEN_BUDGET, timeout_ms=timeout_ms,
                         **(filters.recall_fields() if filters is not None else {}))


def memory_request(group_id: str, messages: list[Message], max_facts: int, timeout_ms: int) -> RecallRequest:
    return RecallRequest(
        recent_messages=[RecallMessage(role=m.role_type, content=m.content) for m in messages],
        group_ids=[group_id], max_facts=max_facts, include_episodes=False, token_budget=RECALL_TOKEN_BUDGET,
        timeout_ms=timeout_ms,
    )


def ranked_across_groups(per_group: list[list[RecallItem]], max_facts: int) -> list[RecallItem]:
    """One ranking of several groups' answers, for a search over all groups: by recall's fused
    score (rank-based, so the groups' best facts interleave), one item per uuid, ``max_facts``."""
    items = sorted((item for items in per_group for item in items), key=lambda i: -(i.score or 0.0))
    seen: set[str] = set()
    out = []
    for item in items:
        if item.uuid not in seen:
            seen.add(item.uuid)
            out.append(item)
    return out[:max_facts]


def fact_result(item: RecallItem) -> FactResult:
    # recall already names facts canonically; mapped here as well so both REST paths share one rule
    return FactResult(uuid=item.uuid, name=canonical_relation(item.name), fact=item.fact, valid_at=item.valid_at,
                      invalid_at=item.invalid_at, created_at=item.created_at, expired_at=item.expired_at)


def episode_result(episode: GraphEpisode) -> EpisodeResult:
    return EpisodeResult(
        uuid=episode.uuid, name=episode.name, group_id=episode.group_id, created_at=episode.created_at,
        source=episode.source, source_description=episode.source_description, content=episode.content,
        valid_at=episode.valid_at, entity_edges=episode.entity_edges, message_ids=episode.message_ids,
        extraction=episode.extraction,
    )


def edge_result(edge: GraphFact) -> EntityEdgeResult:
    """The stored edge, named as recall (and so /search) names it: one edge, one name."""
    return EntityEdgeResult(**edge.model_dump(exclude={"name"}), name=canonical_relation(edge.name) or edge.name)


def triplet_fact_episode(group_id: str, triplet: TripletFact, *, fields: tuple[str, str] = ("source", "target"),
                         at: datetime | None = None) -> Episode:
    """The episode of a fact given whole (engram/publishing/triplets.py), from any door. ValueError for an
    entity name the graph cannot store (only stopwords, pronouns or punctuation:
    services/extractor/pipeline.py), naming the door's own field (``fields``: source, target)."""
    for field, name in zip(fields, (triplet.source, triplet.target)):
        if not safe_entity_name(name):
            raise ValueError(f"{field}: the name is empty, punctuation or only stopwords/pronouns")
    triplet = triplet.model_copy(update={"source": triplet.source.strip(), "relation": triplet.relation.strip(),
                                         "target": triplet.target.strip(), "fact": triplet.fact.strip()})
    return triplet_episode(group_id, triplet, at or datetime.now(timezone.utc), f"add_triplet ({triplet.relation})")


def triplet_request_episode(request: AddTripletRequest, at: datetime | None = None) -> Episode:
    """The episode of a REST or MCP add_triplet (:func:`triplet_fact_episode`)."""
    triplet = TripletFact(source=request.source_node_name, relation=request.edge_name, target=request.target_node_name,
                          fact=request.fact, valid_at=request.valid_at, invalid_at=request.invalid_at)
    return triplet_fact_episode(request.group_id, triplet, fields=("source_node_name", "target_node_name"), at=at)


def text_episode(group_id: str, name: str, body: str, source: str, source_description: str,
                 uuid: str | None, at: datetime, custom_extraction_instructions: str | None = None,
                 request_id: str = "", saga: str | None = None, *, door: str,
                 excluded_entity_types: list[str] | None = None) -> Episode:
    """A whole episode (Graphiti's add_memory with source 'text' or 'json'; ``POST /episodes``),
    published straight to the episode stream like a promotion: it is a finished text, not a chat
    message waiting for its reply. Its turn id is ``<door>:`` and the client's ``uuid``, else a
    hash of (name, source, body) and ``request_id`` (services/gateway/idempotency.py), so the same
    call retried stores it once (the episode id is the Nats-Msg-Id, and the extractor finds a
    stored one). ``saga`` (Graphiti's sequence of episodes) is the episode's session: engram's
    saga. A 'json' body must parse as JSON (ValueError): it is chunked between elements
    (services/extractor/chunking.py)."""
    if source == "json":
        try:
            json.loads(body)
        except ValueError as exc:
            raise ValueError(f"source 'json': the episode body is not JSON ({type(exc).__name__})") from None
    key = uuid or hashlib.sha256(f"{name}\0{source}\0{body}\0{request_id}".encode()).hexdigest()[:24]
    turn_id = f"{door}:{key}"
    content = scrub_secrets(body.strip()).text  # it skips the turn-detector, where chat messages lose secrets
    return Episode(
        episode_id=episode_id_for(group_id, turn_id),
        group_id=group_id,
        scope="session",
        turn_id=turn_id,
        session_id=saga or group_id,
        reference_time=at,
        content=content,
        messages=[EpisodeMessage(message_id=turn_id, role="user", name=scrub_secrets(name).text or None, timestamp=at)],
        # "promotion": the one completion that means "published whole, not completed by the turn-detector"
        completed_by="promotion",
        source_description=scrub_secrets(
            source_description or f"{door} add_memory ({source}{f', saga {saga}' if saga else ''})").text[:512],
        extraction=extraction_override(scrub_secrets(custom_extraction_instructions or "").text, excluded_entity_types),
    )
