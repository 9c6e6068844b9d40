"""The session layer's storage in a memory group's graph (seed 004, 5.3): closed segments
(``EngramSession``), preferences with their history (``EngramPreference``) and notes
(``EngramNote``).

Plain Cypher through graphiti's driver (:class:`engram.graph.drivers.GraphDrivers`), written for both
backends: FalkorDB keeps one graph per group, Neo4j one database for every group, so every node
carries ``group_id`` and every query filters on it. The labels are engram's own; graphiti never
reads them, and they live beside graphiti's nodes in the same group (the user's group is also the
group recall searches for the user scope).

* ``EngramSession`` -- one per segment, ``uuid = uuid5(group, segment_id)``. Its ``state`` is
  ``claimed`` while a close stage works on it and ``closed`` once the record is written.
  :meth:`MemoryStore.claim_session` is the idempotency of the close stage: a MERGE on the uuid
  in one statement (FalkorDB runs a graph's writes one at a time; Neo4j gets a uniqueness
  constraint on the uuid, which makes MERGE lock), so of two concurrent claims exactly one gets
  ``claimed`` and the other ``busy`` (or ``closed`` afterwards).
* ``EngramPreference`` -- one node per value. Setting a key ends its current value
  (``ended_by=replaced``) and adds the new one; setting the current value again changes
  nothing; removing ends it (``ended_by=removed``). The latest value wins, earlier ones stay
  queryable (``include_history``). Keys are normalised (trimmed, case-folded, inner spaces as
  ``_``) so ``Language`` and ``language`` are one preference.
* ``EngramNote`` -- ``uuid = uuid5(group, normalised text)``: a note equal to an existing one
  (case, spacing and punctuation aside) is not stored twice; the first one's source and time stay.
* ``EngramActivity`` -- an activity log entry (seed 004 ``log_activity``), ``uuid = uuid5(group,
  the caller's activity_id)`` when given, else of (kind, normalised text, session, occurred_at): a
  retried request is logged once. The log is bounded: logging an entry deletes the group's oldest
  past ``activities_kept`` (``ENGRAM_SESSION_ACTIVITIES_KEPT``).
* ``EngramFavorite`` -- ``uuid = uuid5(group, kind, normalised item)``: adding an equal favorite
  returns the stored one.

Times are stored as fixed-width ISO-8601 UTC strings (microseconds, ``+00:00``), so ordering
on the string is ordering in time, on both backends. Readers never create a group's graph
(FalkorDB): an unknown group has no sessions, preferences or notes.
"""

from __future__ import annotations

import asyncio
import logging
import re
import unicodedata
import uuid as uuidlib
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Literal

from graphiti_core.driver.driver import GraphDriver

from engram.graph.drivers import GraphDrivers, as_utc, query_rows
from engram.schemas.memory import SessionRecord, UserActivity, UserFavorite, UserNote, UserPreference

log = logging.getLogger("engram.sessions.store")

SESSION, PREFERENCE, NOTE = "EngramSession", "EngramPreference", "EngramNote"
ACTIVITY, FAVORITE = "EngramActivity", "EngramFavorite"
ACTIVITIES_KEPT = 1000
"""Activity entries kept per group unless the store is told otherwise (ENGRAM_SESSION_ACTIVITIES_KEPT)."""
_NAMESPACE = uuidlib.UUID("6f1c2b0e-5d1a-4c47-9a59-3f4f1f0a2e10")  # engram's session layer

ClaimOutcome = Literal["claimed", "busy", "closed"]

# FalkorDB: CREATE INDEX fails "already indexed" for an existing one (no IF NOT EXISTS).
_FALKOR_INDICES = (
    f"CREATE INDEX FOR (n:{SESSION}) ON (n.uuid)",
    f"CREATE INDEX FOR (n:{SESSION}) ON (n.group_id, n.state, n.closed_at)",
    f"CREATE INDEX FOR (n:{PREFERENCE}) ON (n.group_id, n.key, n.current)",
    f"CREATE INDEX FOR (n:{NOTE}) ON (n.uuid)",
    f"CREATE INDEX FOR (n:{NOTE}) ON (n.group_id, n.created_at)",
    f"CREATE INDEX FOR (n:{ACTIVITY}) ON (n.uuid)",
    f"CREATE INDEX FOR (n:{ACTIVITY}) ON (n.group_id, n.occurred_at)",
    f"CREATE INDEX FOR (n:{FAVORITE}) ON (n.uuid)",
    f"CREATE INDEX FOR (n:{FAVORITE}) ON (n.group_id, n.added_at)",
)
# Neo4j: one database for all groups; uniqueness constraints make MERGE on the uuid race-free.
_NEO4J_INDICES = (
    f"CREATE CONSTRAINT engram_session_uuid IF NOT EXISTS FOR (n:{SESSION}) REQUIRE n.uuid IS UNIQUE",
    f"CREATE INDEX engram_session_closed IF NOT EXISTS FOR (n:{SESSION}) ON (n.group_id, n.state, n.closed_at)",
    f"CREATE INDEX engram_preference_key IF NOT EXISTS FOR (n:{PREFERENCE}) ON (n.group_id, n.key, n.current)",
    f"CREATE CONSTRAINT engram_note_uuid IF NOT EXISTS FOR (n:{NOTE}) REQUIRE n.uuid IS UNIQUE",
    f"CREATE INDEX engram_note_created IF NOT EXISTS FOR (n:{NOTE}) ON (n.group_id, n.created_at)",
    f"CREATE CONSTRAINT engram_activity_uuid IF NOT EXISTS FOR (n:{ACTIVITY}) REQUIRE n.uuid IS UNIQUE",
    f"CREATE INDEX engram_activity_occurred IF NOT EXISTS FOR (n:{ACTIVITY}) ON (n.group_id, n.occurred_at)",
    f"CREATE CONSTRAINT engram_favorite_uuid IF NOT EXISTS FOR (n:{FAVORITE}) REQUIRE n.uuid IS UNIQUE",
    f"CREATE INDEX engram_favorite_added IF NOT EXISTS FOR (n:{FAVORITE}) ON (n.group_id, n.added_at)",
)


def iso(value: datetime) -> str:
    """A time as stored: UTC, fixed width (``2026-01-01T12:00:00.000000+00:00``)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat(timespec="microseconds")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def session_uuid(group_id: str, segment_id: str) -> str:
    return str(uuidlib.uuid5(_NAMESPACE, f"session\x1f{group_id}\x1f{segment_id}"))


def normal_key(key: str) -> str:
    """A preference key as stored: trimmed, case-folded, inner whitespace as ``_``."""
    return re.sub(r"\s+", "_", key.strip()).casefold()


def normal_note(text: str) -> str:
    """A note's dedupe key: NFKC, case-folded, punctuation dropped, whitespace collapsed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def note_uuid(group_id: str, text: str) -> str:
    return str(uuidlib.uuid5(_NAMESPACE, f"note\x1f{group_id}\x1f{normal_note(text)}"))


def activity_uuid(group_id: str, *, activity_id: str | None, kind: str, text: str, session_id: str | None,
                  occurred_at: datetime) -> str:
    key = (f"id\x1f{activity_id}" if activity_id
           else f"{kind}\x1f{normal_note(text)}\x1f{session_id or ''}\x1f{iso(occurred_at)}")
    return str(uuidlib.uuid5(_NAMESPACE, f"activity\x1f{group_id}\x1f{key}"))


def favorite_uuid(group_id: str, item: str, kind: str | None) -> str:
    return str(uuidlib.uuid5(_NAMESPACE, f"favorite\x1f{group_id}\x1f{kind or ''}\x1f{normal_note(item)}"))


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    token: str
    claimed_at: datetime | None = None  # when the current holder claimed it (busy: the other worker)


def _session_record(row: dict[str, Any]) -> SessionRecord:
    return SessionRecord(
        session_id=row["session_id"], segment=int(row["segment"] or 0), segment_id=row["segment_id"],
        summary=row["summary"] or "", summary_source=row["summary_source"] or "fallback",
        close_reason=row["close_reason"], token_count=int(row["token_count"] or 0),
        message_count=int(row["message_count"] or 0), opened_at=as_utc(row["opened_at"]),
        closed_at=as_utc(row["closed_at"]), language=row["language"],
    )


def _preference(row: dict[str, Any]) -> UserPreference:
    return UserPreference(
        key=row["key"], value=row["value"], source=row["source"], set_at=as_utc(row["set_at"]),
        session_id=row["session_id"], current=bool(row["current"]), ended_at=as_utc(row["ended_at"]),
        ended_by=row["ended_by"],
    )


def _note(row: dict[str, Any]) -> UserNote:
    return UserNote(uuid=row["uuid"], text=row["text"], source=row["source"], created_at=as_utc(row["created_at"]),
                    session_id=row["session_id"])


_SESSION_FIELDS = ", ".join(
    f"s.{f} AS {f}" for f in ("session_id", "segment", "segment_id", "summary", "summary_source", "close_reason",
                              "token_count", "message_count", "opened_at", "closed_at", "language")
)
_PREFERENCE_FIELDS = ", ".join(
    f"p.{f} AS {f}" for f in ("key", "value", "source", "set_at", "session_id", "current", "ended_at", "ended_by")
)
_NOTE_FIELDS = ", ".join(f"n.{f} AS {f}" for f in ("uuid", "text", "source", "created_at", "session_id"))
_ACTIVITY_FIELDS = ", ".join(f"a.{f} AS {f}" for f in ("uuid", "kind", "text", "occurred_at", "source", "session_id"))
_FAVORITE_FIELDS = ", ".join(f"f.{f} AS {f}" for f in ("uuid", "item", "kind", "added_at", "source", "session_id"))


def _activity(row: dict[str, Any]) -> UserActivity:
    return UserActivity(uuid=row["uuid"], kind=row["kind"], text=row["text"], occurred_at=as_utc(row["occurred_at"]),
                        source=row["source"], session_id=row["session_id"])


def _favorite(row: dict[str, Any]) -> UserFavorite:
    return UserFavorite(uuid=row["uuid"], item=row["item"], kind=row["kind"], added_at=as_utc(row["added_at"]),
                        source=row["source"], session_id=row["session_id"])


class MemoryStore:
    """Reads and writes of the session layer over the service's :class:`GraphDrivers`."""

    def __init__(self, graphs: GraphDrivers, *, activities_kept: int = ACTIVITIES_KEPT) -> None:
        self.graphs = graphs
        self.activities_kept = activities_kept
        self._indexed: set[int] = set()
        self._lock = asyncio.Lock()

    # --- drivers -----------------------------------------------------------------------------
    async def _writer(self, group_id: str) -> GraphDriver:
        """The group's driver with graphiti's and this module's indices (creates the graph)."""
        driver = await self.graphs.driver(group_id)
        if id(driver) not in self._indexed:
            async with self._lock:
                if id(driver) not in self._indexed:
                    await self._ensure_indices(driver)
                    self._indexed.add(id(driver))
        return driver

    async def _reader(self, group_id: str) -> GraphDriver | None:
        """The group's driver, or None when the group has no graph (never creates one)."""
        if not await self.graphs.exists(group_id):
            return None
        return await self._writer(group_id)

    async def _ensure_indices(self, driver: GraphDriver) -> None:
        neo4j = self.graphs.settings.graph_backend == "neo4j"
        for statement in _NEO4J_INDICES if neo4j else _FALKOR_INDICES:
            try:
                await driver.execute_query(statement)
            except Exception as exc:  # FalkorDB: "already indexed"; anything else is real
                if "already indexed" not in str(exc):
                    raise

    # --- sessions ----------------------------------------------------------------------------
    async def claim_session(
        self, group_id: str, *, session_id: str, segment: int, segment_id: str, lease_s: float,
        token: str | None = None, now: datetime | None = None,
    ) -> Claim:
        """Claim the segment for closing, in one statement.

        ``closed``: the record exists (a redelivery or a second close): nothing to do.
        ``busy``: another worker claimed it less than ``lease_s`` ago: try again later.
        ``claimed``: it is ours (new, ours already, or the other claim's lease ran out: that
        worker is presumed dead). ``token`` identifies the claimant (a fresh one by default)."""
        token = token or uuidlib.uuid4().hex
        now = now or utc_now()
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MERGE (s:{SESSION} {{uuid: $uuid}}) "
            "ON CREATE SET s.group_id = $group_id, s.session_id = $session_id, s.segment = $segment, "
            "s.segment_id = $segment_id, s.state = 'open' "
            "WITH s, s.state = 'closed' AS closed, "
            "(s.state = 'claimed' AND s.claim_token <> $token AND s.claimed_at_s > $stale_before) AS busy "
            "SET s.claim_token = CASE WHEN closed OR busy THEN s.claim_token ELSE $token END, "
            "s.claimed_at_s = CASE WHEN closed OR busy THEN s.claimed_at_s ELSE $now END, "
            "s.state = CASE WHEN closed OR busy THEN s.state ELSE 'claimed' END "
            "RETURN CASE WHEN closed THEN 'closed' WHEN busy THEN 'busy' ELSE 'claimed' END AS outcome, "
            "s.claimed_at_s AS claimed_at",
            uuid=session_uuid(group_id, segment_id), group_id=group_id, session_id=session_id, segment=segment,
            segment_id=segment_id, token=token, now=now.timestamp(), stale_before=now.timestamp() - lease_s,
        )
        row = rows[0]
        claimed_at = row["claimed_at"]
        return Claim(row["outcome"], token,
                     datetime.fromtimestamp(float(claimed_at), timezone.utc) if claimed_at is not None else None)

    async def segment_state(self, group_id: str, *, session_id: str, segment: int, lease_s: float,
                            now: datetime | None = None) -> Literal["closing", "closed", "idle"] | None:
        """Where ``session_id``'s ``segment`` stands in the group: ``closing`` (a live worker claimed
        it less than ``lease_s`` ago), ``closed``, ``idle`` (released, or its worker's claim ran
        out), or None (no record in this group: not picked up yet, or in another group)."""
        now = now or utc_now()
        driver = await self._reader(group_id)
        if driver is None:
            return None
        rows = await query_rows(
            driver,
            f"MATCH (s:{SESSION}) WHERE s.group_id = $group_id AND s.session_id = $session_id "
            "AND s.segment = $segment RETURN s.state AS state, s.claimed_at_s AS claimed_at LIMIT 1",
            group_id=group_id, session_id=session_id, segment=segment,
        )
        if not rows:
            return None
        state, claimed_at = rows[0]["state"], rows[0]["claimed_at"]
        if state == "closed":
            return "closed"
        if state == "claimed" and claimed_at is not None and float(claimed_at) > now.timestamp() - lease_s:
            return "closing"
        return "idle"

    async def save_session(self, group_id: str, record: SessionRecord, *, token: str | None = None) -> bool:
        """Write the closed segment's record and mark it closed. A record already closed is
        left as it is (False): the first close wins. With ``token``, only while the claim is
        still that token's or the segment is unclaimed (a worker whose lease ran out and was
        taken over does not write over the new holder)."""
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MERGE (s:{SESSION} {{uuid: $uuid}}) "
            "ON CREATE SET s.group_id = $group_id, s.state = 'open' "
            "WITH s WHERE s.state <> 'closed' AND ($token IS NULL OR s.claim_token IS NULL OR s.claim_token = $token) "
            "SET s.session_id = $session_id, s.segment = $segment, s.segment_id = $segment_id, "
            "s.summary = $summary, s.summary_source = $summary_source, s.close_reason = $close_reason, "
            "s.token_count = $token_count, s.message_count = $message_count, s.opened_at = $opened_at, "
            "s.closed_at = $closed_at, s.language = $language, s.state = 'closed' "
            "RETURN s.uuid AS uuid",
            uuid=session_uuid(group_id, record.segment_id), group_id=group_id, token=token,
            session_id=record.session_id, segment=record.segment, segment_id=record.segment_id,
            summary=record.summary, summary_source=record.summary_source, close_reason=record.close_reason,
            token_count=record.token_count, message_count=record.message_count,
            opened_at=iso(record.opened_at) if record.opened_at else None, closed_at=iso(record.closed_at),
            language=record.language,
        )
        return bool(rows)

    async def renew_claim(self, group_id: str, segment_id: str, token: str, *, now: datetime | None = None) -> bool:
        """Keep ``token``'s claim alive (a close outlasting the lease is not taken over while its
        worker lives). False when the claim is no longer that token's."""
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MATCH (s:{SESSION} {{uuid: $uuid}}) WHERE s.group_id = $group_id AND s.state = 'claimed' "
            "AND s.claim_token = $token SET s.claimed_at_s = $now RETURN s.uuid AS uuid",
            uuid=session_uuid(group_id, segment_id), group_id=group_id, token=token,
            now=(now or utc_now()).timestamp(),
        )
        return bool(rows)

    async def release_session(self, group_id: str, segment_id: str, token: str) -> None:
        """Give a claim back (the close failed and will be retried): the next delivery need not
        wait for the lease to run out."""
        driver = await self._writer(group_id)
        await driver.execute_query(
            f"MATCH (s:{SESSION} {{uuid: $uuid}}) WHERE s.group_id = $group_id AND s.state = 'claimed' "
            "AND s.claim_token = $token SET s.state = 'open', s.claim_token = NULL, s.claimed_at_s = NULL",
            uuid=session_uuid(group_id, segment_id), group_id=group_id, token=token,
        )

    async def last_sessions(self, group_id: str, n: int = 1) -> list[SessionRecord]:
        """The group's ``n`` most recently closed segments, newest first."""
        driver = await self._reader(group_id)
        if driver is None or n <= 0:
            return []
        rows = await query_rows(
            driver,
            f"MATCH (s:{SESSION}) WHERE s.group_id = $group_id AND s.state = 'closed' "
            f"RETURN {_SESSION_FIELDS} ORDER BY s.closed_at DESC, s.segment DESC LIMIT $n",
            group_id=group_id, n=n,
        )
        return [_session_record(r) for r in rows]

    # --- preferences -------------------------------------------------------------------------
    async def set_preference(
        self, group_id: str, key: str, value: str, *, source: str, session_id: str | None = None,
        at: datetime | None = None,
    ) -> UserPreference:
        """Set ``key`` to ``value``: ends the current value (``replaced``) and adds the new one,
        in one statement. The same value again changes nothing and returns the current one."""
        at = at or utc_now()
        key = normal_key(key)
        value = value.strip()
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"OPTIONAL MATCH (old:{PREFERENCE}) WHERE old.group_id = $group_id AND old.key = $key "
            "AND old.current = true AND old.value <> $value "
            "WITH collect(old) AS olds "
            "FOREACH (o IN olds | SET o.current = false, o.ended_at = $at, o.ended_by = 'replaced') "
            f"MERGE (p:{PREFERENCE} {{group_id: $group_id, key: $key, value: $value, current: true}}) "
            "ON CREATE SET p.uuid = $uuid, p.source = $source, p.set_at = $at, p.session_id = $session_id "
            f"RETURN {_PREFERENCE_FIELDS}",
            group_id=group_id, key=key, value=value, at=iso(at), uuid=uuidlib.uuid4().hex, source=source,
            session_id=session_id,
        )
        return _preference(rows[0])

    async def remove_preference(self, group_id: str, key: str, *, at: datetime | None = None) -> UserPreference | None:
        """End the current value of ``key`` (``removed``; it stays in the history). None when
        the key has no current value."""
        driver = await self._reader(group_id)
        if driver is None:
            return None
        rows = await query_rows(
            driver,
            f"MATCH (p:{PREFERENCE}) WHERE p.group_id = $group_id AND p.key = $key AND p.current = true "
            "SET p.current = false, p.ended_at = $at, p.ended_by = 'removed' "
            f"RETURN {_PREFERENCE_FIELDS}",
            group_id=group_id, key=normal_key(key), at=iso(at or utc_now()),
        )
        return _preference(rows[0]) if rows else None

    async def preferences(self, group_id: str, *, include_history: bool = False) -> list[UserPreference]:
        """The current preferences by key; with ``include_history`` also the ended values
        (each key's values newest first)."""
        driver = await self._reader(group_id)
        if driver is None:
            return []
        where = "" if include_history else " AND p.current = true"
        rows = await query_rows(
            driver,
            f"MATCH (p:{PREFERENCE}) WHERE p.group_id = $group_id{where} "
            f"RETURN {_PREFERENCE_FIELDS} ORDER BY p.key, p.current DESC, p.set_at DESC",
            group_id=group_id,
        )
        return [_preference(r) for r in rows]

    # --- notes -------------------------------------------------------------------------------
    async def add_note(
        self, group_id: str, text: str, *, source: str, session_id: str | None = None, at: datetime | None = None,
    ) -> UserNote:
        """Store a note, unless an equal one (:func:`normal_note`) exists: then that one is
        returned unchanged."""
        text = " ".join(text.split())
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MERGE (n:{NOTE} {{uuid: $uuid}}) "
            "ON CREATE SET n.group_id = $group_id, n.text = $text, n.source = $source, n.created_at = $at, "
            "n.session_id = $session_id "
            f"RETURN {_NOTE_FIELDS}",
            uuid=note_uuid(group_id, text), group_id=group_id, text=text, source=source, at=iso(at or utc_now()),
            session_id=session_id,
        )
        return _note(rows[0])

    async def notes(self, group_id: str, limit: int = 50) -> list[UserNote]:
        """The group's notes, newest first."""
        driver = await self._reader(group_id)
        if driver is None or limit <= 0:
            return []
        rows = await query_rows(
            driver,
            f"MATCH (n:{NOTE}) WHERE n.group_id = $group_id "
            f"RETURN {_NOTE_FIELDS} ORDER BY n.created_at DESC, n.uuid LIMIT $limit",
            group_id=group_id, limit=limit,
        )
        return [_note(r) for r in rows]

    async def delete_note(self, group_id: str, note_uuid_: str) -> bool:
        """Delete one note; False when the group has no note with that uuid."""
        return await self._delete_one(group_id, NOTE, note_uuid_)

    # --- activity log --------------------------------------------------------------------------
    async def log_activity(
        self, group_id: str, text: str, *, kind: str, source: str, session_id: str | None = None,
        occurred_at: datetime | None = None, activity_id: str | None = None,
    ) -> UserActivity:
        """Log an entry (an equal one, see :func:`activity_uuid`, is returned unchanged), then
        delete the group's oldest entries past ``activities_kept``."""
        text = " ".join(text.split())
        at = occurred_at or utc_now()
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MERGE (a:{ACTIVITY} {{uuid: $uuid}}) "
            "ON CREATE SET a.group_id = $group_id, a.kind = $kind, a.text = $text, a.occurred_at = $at, "
            "a.source = $source, a.session_id = $session_id "
            f"RETURN {_ACTIVITY_FIELDS}",
            uuid=activity_uuid(group_id, activity_id=activity_id, kind=kind, text=text, session_id=session_id,
                               occurred_at=at),
            group_id=group_id, kind=kind, text=text, at=iso(at), source=source, session_id=session_id,
        )
        await query_rows(
            driver,
            f"MATCH (a:{ACTIVITY}) WHERE a.group_id = $group_id "
            "WITH a ORDER BY a.occurred_at DESC, a.uuid SKIP $kept DELETE a",
            group_id=group_id, kept=self.activities_kept,
        )
        return _activity(rows[0])

    async def activities(self, group_id: str, limit: int = 50, *, kind: str | None = None) -> list[UserActivity]:
        """The group's activity log, newest first (only ``kind``'s entries when given)."""
        driver = await self._reader(group_id)
        if driver is None or limit <= 0:
            return []
        rows = await query_rows(
            driver,
            f"MATCH (a:{ACTIVITY}) WHERE a.group_id = $group_id AND ($kind IS NULL OR a.kind = $kind) "
            f"RETURN {_ACTIVITY_FIELDS} ORDER BY a.occurred_at DESC, a.uuid LIMIT $limit",
            group_id=group_id, kind=kind, limit=limit,
        )
        return [_activity(r) for r in rows]

    async def delete_activity(self, group_id: str, activity_uuid_: str) -> bool:
        """Delete one entry; False when the group has no entry with that uuid."""
        return await self._delete_one(group_id, ACTIVITY, activity_uuid_)

    # --- favorites -----------------------------------------------------------------------------
    async def add_favorite(
        self, group_id: str, item: str, *, kind: str | None, source: str, session_id: str | None = None,
        at: datetime | None = None,
    ) -> UserFavorite:
        """Store a favorite, unless an equal one (same kind, :func:`normal_note` of the item)
        exists: then that one is returned unchanged."""
        item = " ".join(item.split())
        driver = await self._writer(group_id)
        rows = await query_rows(
            driver,
            f"MERGE (f:{FAVORITE} {{uuid: $uuid}}) "
            "ON CREATE SET f.group_id = $group_id, f.item = $item, f.kind = $kind, f.added_at = $at, "
            "f.source = $source, f.session_id = $session_id "
            f"RETURN {_FAVORITE_FIELDS}",
            uuid=favorite_uuid(group_id, item, kind), group_id=group_id, item=item, kind=kind,
            at=iso(at or utc_now()), source=source, session_id=session_id,
        )
        return _favorite(rows[0])

    async def favorites(self, group_id: str, limit: int = 100) -> list[UserFavorite]:
        """The group's favorites, newest first."""
        driver = await self._reader(group_id)
        if driver is None or limit <= 0:
            return []
        rows = await query_rows(
            driver,
            f"MATCH (f:{FAVORITE}) WHERE f.group_id = $group_id "
            f"RETURN {_FAVORITE_FIELDS} ORDER BY f.added_at DESC, f.uuid LIMIT $limit",
            group_id=group_id, limit=limit,
        )
        return [_favorite(r) for r in rows]

    async def remove_favorite(self, group_id: str, favorite_uuid_: str) -> bool:
        """Remove one favorite; False when the group has no favorite with that uuid."""
        return await self._delete_one(group_id, FAVORITE, favorite_uuid_)

    async def _delete_one(self, group_id: str, label: str, uuid_: str) -> bool:
        driver = await self._reader(group_id)
        if driver is None:
            return False
        rows = await query_rows(
            driver,
            f"MATCH (n:{label} {{uuid: $uuid}}) WHERE n.group_id = $group_id WITH n, n.uuid AS uuid DELETE n RETURN uuid",
            uuid=uuid_, group_id=group_id,
        )
        return bool(rows)
