"""Knowledge updates in recall: a past turn whose every fact was superseded never outranks the
turn that superseded it, and says so (issue 24, item 4).

Why: recall ranks past turns by their text. "The billing service uses Postgres 15" matches "are
we still on Postgres for billing?" far better than "We switched the billing service to SQLite"
does, so the old turn came first although the graph had marked its fact invalid: the temporal
graph never reached the agent. Here, after a group's search:

* a turn is *superseded* when it wrote at least one fact and every one of its facts no longer
  holds (``invalid_at`` passed or ``expired_at`` set: graphiti's invalidation). A turn with one
  fact still current (it also said something else) is left alone;
* the turns that superseded it are the episodes that invalidated those facts: graphiti lists an
  invalidated fact in the invalidating episode's ``entity_edges`` while the fact's own
  ``episodes`` do not name it (the same rule as the explorer's and the extractor's deltas);
* the superseded turn is marked (its item gets ``invalid_at``: the prompt line reads "said ...,
  superseded ...") and moved to just after its superseding turns; a superseding turn the search
  did not find is brought in, right before it. A chain (Postgres -> SQLite -> DuckDB) is
  followed a few steps, so the newest turn comes first.

Two graph reads per searched group that found turns (the turns' facts; the episodes that
invalidated them), both by uuid lists the search already bounded. On FalkorDB both go through
indices (issue 25, item 3: each was a scan of the whole group, ~150 ms a recall at 100k facts):
a turn's facts are read from its ``entity_edges`` (the extractor lists there every fact the turn
resolved, the ones naming it in ``episodes`` among them) by the RELATES_TO uuid index, and the
turns that invalidated a fact among the turns created within ``INVALIDATOR_WINDOW`` before the
fact's ``expired_at`` (the extractor sets both in the same run) by the ``created_at`` range index.
Partial: an invalidating turn created longer than that before it expired the fact (an extraction
held up for over an hour) is not found; the superseded turn is still marked and moved, with no
superseding turn brought in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

from graphiti_core.driver.driver import GraphProvider

from engram.graph.drivers import as_utc, query_rows
from engram.schemas import Provenance, RecallItem
from engram.services.extractor.pipeline import MESSAGE_IDS_PROPERTY
from engram.services.recall.search import shorten

MAX_CHAIN = 3
"""Supersessions followed from a found turn (old -> newer -> newest): enough for a value that
changed a few times, bounded so a long history of changes costs a few reads at most."""

Q_FACTS_OF_TURNS = (
    "MATCH (:Entity)-[r:RELATES_TO]->(:Entity) WHERE r.group_id = $group_id "
    "AND any(u IN r.episodes WHERE u IN $uuids) "
    "RETURN r.uuid AS uuid, r.episodes AS episodes, r.invalid_at AS invalid_at, r.expired_at AS expired_at"
)
Q_INVALIDATORS = (
    "MATCH (e:Episodic) WHERE e.group_id = $group_id AND any(x IN e.entity_edges WHERE x IN $facts) "
    "RETURN e.uuid AS uuid, e.content AS content, e.valid_at AS valid_at, e.created_at AS created_at, "
    f"e.entity_edges AS entity_edges, e.{MESSAGE_IDS_PROPERTY} AS message_ids"
)


# FalkorDB: the same two reads through indices (see the module docstring); Neo4j keeps the scans.
# In two reads: FalkorDB 4.16.3 crashed (a general protection fault in its thread pool) on the
# one-query form, UNWIND of the turns' entity_edges into a RELATES_TO uuid match, at 100k facts.
Q_ENTITY_EDGES_OF_TURNS = (
    "UNWIND $uuids AS u MATCH (t:Episodic {uuid: u}) WHERE t.group_id = $group_id RETURN t.entity_edges AS edges"
)
Q_FACTS_BY_UUID = (
    "UNWIND $edges AS x MATCH ()-[r:RELATES_TO {uuid: x}]->() "
    "WITH r, startNode(r) AS a, endNode(r) AS b WHERE a:Entity AND b:Entity "
    "RETURN r.uuid AS uuid, r.episodes AS episodes, r.invalid_at AS invalid_at, r.expired_at AS expired_at"
)
Q_INVALIDATORS_INDEXED = (
    "MATCH (e:Episodic) WHERE e.created_at >= $since AND e.created_at <= $until AND e.group_id = $group_id "
    "AND any(x IN e.entity_edges WHERE x IN $facts) "
    "RETURN e.uuid AS uuid, e.content AS content, e.valid_at AS valid_at, e.created_at AS created_at, "
    f"e.entity_edges AS entity_edges, e.{MESSAGE_IDS_PROPERTY} AS message_ids"
)
INVALIDATOR_WINDOW = timedelta(hours=1)


async def _facts_of_turns(driver: Any, group_id: str, turns: list[str]) -> list[dict[str, Any]]:
    """The facts naming one of ``turns`` in their ``episodes``."""
    if getattr(driver, "provider", None) != GraphProvider.FALKORDB:
        return await query_rows(driver, Q_FACTS_OF_TURNS, group_id=group_id, uuids=turns)
    listed = await query_rows(driver, Q_ENTITY_EDGES_OF_TURNS, group_id=group_id, uuids=turns)
    edges = sorted({x for r in listed for x in (r.get("edges") or [])})
    if not edges:
        return []
    wanted = set(turns)
    rows = await query_rows(driver, Q_FACTS_BY_UUID, edges=edges)
    return [r for r in rows if wanted & set(r.get("episodes") or ())]


async def _invalidators(driver: Any, group_id: str, ended: dict[str, StoredFact]) -> list[dict[str, Any]]:
    """The episodes listing one of the ``ended`` facts in their ``entity_edges``."""
    if getattr(driver, "provider", None) != GraphProvider.FALKORDB:
        return await query_rows(driver, Q_INVALIDATORS, group_id=group_id, facts=sorted(ended))
    by_window: dict[tuple[str, str], list[str]] = {}
    for uuid, fact in ended.items():
        if fact.expired_at is None:
            continue  # ended by invalid_at alone: no run to look near
        since = (fact.expired_at - INVALIDATOR_WINDOW).isoformat()
        until = (fact.expired_at + timedelta(minutes=1)).isoformat()
        by_window.setdefault((since, until), []).append(uuid)
    rows: dict[str, dict[str, Any]] = {}
    for (since, until), facts in sorted(by_window.items()):
        for row in await query_rows(driver, Q_INVALIDATORS_INDEXED, group_id=group_id, facts=facts,
                                    since=since, until=until):
            rows.setdefault(row["uuid"], row)
    return list(rows.values())


@dataclass(frozen=True)
class StoredFact:
    uuid: str
    episodes: tuple[str, ...]
    invalid_at: datetime | None
    expired_at: datetime | None

    def holds(self, now: datetime) -> bool:
        """Whether the fact held at ``now`` (the present, or a request's ``as_of``): not known to
        have ended by then (``expired_at``: when engram learnt it ended, always past for the
        present) and not ended in the world by then (``invalid_at``)."""
        if self.expired_at is not None and self.expired_at <= now:
            return False
        return self.invalid_at is None or self.invalid_at > now


@dataclass
class Supersession:
    """Why a turn no longer holds: when (the latest end of its facts) and by which turns."""

    at: datetime | None
    by: list[RecallItem] = field(default_factory=list)


def superseded_turns(turn_uuids: Sequence[str], facts: Sequence[StoredFact], now: datetime) -> dict[str, datetime | None]:
    """turn uuid -> when its facts stopped holding, for the turns whose every fact has (pure)."""
    by_turn: dict[str, list[StoredFact]] = {}
    wanted = set(turn_uuids)
    for fact in facts:
        for episode in fact.episodes:
            if episode in wanted:
                by_turn.setdefault(episode, []).append(fact)
    out: dict[str, datetime | None] = {}
    for turn, own in by_turn.items():
        if own and not any(f.holds(now) for f in own):
            # when it stopped holding in the world (invalid_at), not when engram learnt it (expired_at)
            ends = [f.invalid_at or f.expired_at for f in own]
            out[turn] = max((t for t in ends if t is not None), default=None)
    return out


def reorder(items: Sequence[RecallItem], found: dict[str, Supersession]) -> list[RecallItem]:
    """``items`` with every superseded turn marked and placed right after its superseding turns,
    each brought in when missing (pure). Nothing else moves; nothing appears twice."""
    out: list[RecallItem] = []
    placed: set[str] = set()

    def place(item: RecallItem, depth: int = 0) -> None:
        if item.uuid in placed:
            return
        info = found.get(item.uuid) if item.kind == "episode" else None
        if info is not None:
            if depth < MAX_CHAIN:
                for newer in info.by:
                    place(newer, depth + 1)  # the newer turn first, and what superseded it before that
            item = item.model_copy(update={"invalid_at": info.at})
        placed.add(item.uuid)
        out.append(item)

    for item in items:
        place(item)  # a superseding turn found lower down is pulled up by the turn it superseded
    return out


def _turn_item(row: dict[str, Any], scope: str | None, group_id: str, chars: int,
               speaker_names: bool = False) -> RecallItem:
    return RecallItem(
        uuid=row["uuid"], fact=shorten(row.get("content") or "", chars, speaker_names), kind="episode",
        scope=scope,  # type: ignore[arg-type]
        group_id=group_id, valid_at=as_utc(row.get("valid_at")), created_at=as_utc(row.get("created_at")),
        provenance=[Provenance(episode_id=row["uuid"], message_ids=list(row.get("message_ids") or []))],
    )


async def find_supersessions(driver: Any, group_id: str, scope: str | None, items: Sequence[RecallItem],
                             episode_chars: int, now: datetime | None = None,
                             speaker_names: bool = False) -> dict[str, Supersession]:
    """turn uuid -> its :class:`Supersession`, for the turns among ``items`` (and, following the
    chain, the turns that superseded them) whose every fact was superseded."""
    now = now or datetime.now(timezone.utc)
    found: dict[str, Supersession] = {}
    pending = [i.uuid for i in items if i.kind == "episode"]
    seen: set[str] = set()
    for _ in range(MAX_CHAIN):
        pending = [u for u in pending if u not in seen]
        if not pending:
            break
        seen.update(pending)
        rows = await _facts_of_turns(driver, group_id, pending)
        facts = [StoredFact(r["uuid"], tuple(r.get("episodes") or ()), as_utc(r.get("invalid_at")),
                            as_utc(r.get("expired_at"))) for r in rows]
        ended = superseded_turns(pending, facts, now)
        if not ended:
            break
        ended_facts = {f.uuid: f for f in facts if any(e in ended for e in f.episodes)}
        invalidators = await _invalidators(driver, group_id, ended_facts)
        newer: list[str] = []
        for turn, at in ended.items():
            own = {u for u, f in ended_facts.items() if turn in f.episodes}
            by = [row for row in invalidators
                  if row["uuid"] != turn and own & set(row.get("entity_edges") or ())
                  and not any(row["uuid"] in ended_facts[u].episodes for u in own)]
            by.sort(key=lambda r: as_utc(r.get("valid_at")) or as_utc(r.get("created_at")) or now, reverse=True)
            found[turn] = Supersession(at, [_turn_item(r, scope, group_id, episode_chars, speaker_names) for r in by])
            newer += [r["uuid"] for r in by]
        pending = newer
    return found
