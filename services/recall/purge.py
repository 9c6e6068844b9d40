"""Erase a deleted group's or episode's messages from every stream and bucket engram keeps.

Deleting a group in the graph alone left its text in the input, episode, delta, summary and
dead-letter streams and in the turn-detector's KV checkpoints for up to 30 days. These
functions walk each place and erase (overwrite on disk, :mod:`engram.runtime.erase`) what belongs to
the group:

- episodes ``engram.episode.<p>.<group>``, deltas ``engram.delta.<p>.<group>`` and the
  summary-gate's schedules ``engram.sched.summary.<group>.*`` and their fired ticks (ENGRAM_SCHED),
  summary events and audits;
- the sessions that fed the group -- named by its episodes, by their KV checkpoints
  (``scopes_seen``) or by messages still in the input stream: their raw input, idle schedules and
  ticks, every revision of their checkpoint; their epoch is bumped (:mod:`engram.runtime.epochs`) and every
  turn-detector replica told to forget them, so re-posted content is stored afresh;
- dead letters whose original subject, session or group points at the group;
- those sessions' closed segments (``engram.session.closed.<session>``: transcript tails). The
  summaries, preferences and notes already stored in another memory group (the user's) stay:
  they belong to that group and are deleted with it, or one by one.

A session that fed the deleted group *and* others is erased as a whole (its open turn and
unprocessed input included): the pipeline cannot split one raw message between groups.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from pydantic import ValidationError

from engram.runtime.epochs import SessionEpochs
from engram.runtime.erase import erase_where
from engram.runtime.kv import current_entries
from engram.schemas import ChatMessage, subjects
from engram.services.turn_detector.pairing import SessionState, scope_groups
from engram.services.turn_detector.retention import KV_STREAM

log = logging.getLogger("engram.recall.purge")


@dataclass
class PurgeReport:
    erased: int = 0
    sessions: set[str] = field(default_factory=set)


def _json(msg: RawStreamMsg) -> dict | None:
    try:
        value = json.loads(msg.data or b"")
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes; one such
        return None  # message in a stream made every group delete fail (tests/fuzz)
    return value if isinstance(value, dict) else None


def _message_groups(prefix: str, data: dict) -> tuple[str | None, set[str]]:
    try:
        message = ChatMessage.model_validate(data)
    except ValidationError:
        return None, set()
    return message.session_id, {g for _, g in scope_groups(prefix, message.session_id, message.scopes)}


def _state_groups(prefix: str, state: SessionState) -> set[str]:
    groups = {g for scopes in state.scopes_seen for _, g in scope_groups(prefix, state.session_id, scopes)}
    turns = ([state.open_turn] if state.open_turn else []) + list(state.outbox)
    groups |= {g for turn in turns for _, g in scope_groups(prefix, state.session_id, turn.scopes)}
    return groups


async def erase_group(js: JetStreamContext, prefix: str, group_id: str) -> PurgeReport:
    report = PurgeReport()
    sessions = report.sessions
    if group_id.startswith(f"{prefix}_session_"):
        sessions.add(group_id.removeprefix(f"{prefix}_session_"))

    def episode_of_group(msg: RawStreamMsg) -> bool:
        data = _json(msg)
        if data and isinstance(data.get("session_id"), str) and data.get("session_id") != "promotion":
            sessions.add(data["session_id"])
        return True

    report.erased += (await erase_where(js, subjects.STREAM_EPISODES, f"engram.episode.*.{group_id}",
                                        episode_of_group)).erased
    for stream, subject in (
        (subjects.STREAM_DELTAS, f"engram.delta.*.{group_id}"),
        (subjects.STREAM_SCHED, f"engram.sched.summary.{group_id}.*"),
        (subjects.STREAM_SCHED, subjects.sched_summary_fired(group_id)),
        (subjects.STREAM_SUMMARY, subjects.summary(group_id)),
        (subjects.STREAM_SUMMARY, subjects.summary_audit(group_id)),
    ):
        report.erased += (await erase_where(js, stream, subject)).erased

    # Sessions whose checkpoints say they fed the group.
    async for key, value in current_entries(js, subjects.KV_TURN_SESSIONS):  # every one: nats-py's keys() may stop short
        if key in sessions:
            continue
        try:
            if group_id in _state_groups(prefix, SessionState.model_validate_json(value)):
                sessions.add(key)
        except ValidationError:
            continue

    # Raw input still in the stream (unprocessed, or inside the retention period).
    def input_of_group(msg: RawStreamMsg) -> bool:
        session = subjects.session_token_of(msg.subject or "")
        if session in sessions:
            return True
        data = _json(msg)
        message_session, groups = _message_groups(prefix, data) if data else (None, set())
        if group_id in groups and message_session:
            sessions.add(message_session)
            return True
        return False

    # (Closes and ticks of sessions first seen through a later message go in the per-session
    # pass below, once every session is known.)
    report.erased += (await erase_where(js, subjects.STREAM_IN, "engram.in.*.*.*", input_of_group)).erased

    def dead_letter_of_group(msg: RawStreamMsg) -> bool:
        # str(): nats-py's get_msg parses headers with the email parser, which hands back an
        # email.header.Header, not a str, for a non-ASCII value (a subject token like "ünï")
        original = str((msg.headers or {}).get(subjects.HDR_DLQ_SUBJECT, ""))
        if original.rsplit(".", 1)[-1] == group_id and original.startswith(("engram.episode.", "engram.delta.")):
            return True
        if original.startswith("engram.in.") and subjects.session_token_of(original) in sessions:
            return True
        data = _json(msg)
        if not data:
            return False
        if data.get("group_id") == group_id:
            return True
        return group_id in _message_groups(prefix, data)[1]

    report.erased += (await erase_where(js, subjects.STREAM_DLQ, "engram.dlq.*", dead_letter_of_group)).erased

    epochs = await SessionEpochs.open(js)
    for session in sorted(sessions):
        if not subjects.is_valid_token(session):
            continue
        report.erased += (await erase_where(js, subjects.STREAM_IN, f"engram.in.*.*.{session}")).erased
        report.erased += (await erase_where(js, subjects.STREAM_SCHED, subjects.sched_idle(session))).erased
        report.erased += (await erase_where(js, subjects.STREAM_SCHED, subjects.sched_idle_fired(session))).erased
        # Closed segments carry the session's transcript tail for the session close stage.
        report.erased += (await erase_where(js, subjects.STREAM_SESSIONS, subjects.session_closed(session))).erased
        report.erased += (await erase_where(js, KV_STREAM, f"$KV.{subjects.KV_TURN_SESSIONS}.{session}")).erased
        await epochs.bump(session)
    return report


async def erase_episode(js: JetStreamContext, group_id: str, episode_id: str, message_ids: list[str]) -> int:
    """The episode's message in the episode stream, its deltas, and its raw input messages (the
    session comes from the episode's stream copy; message ids from it and from the graph)."""
    found: dict = {}

    def is_episode(msg: RawStreamMsg) -> bool:
        data = _json(msg) or {}
        if (msg.headers or {}).get(subjects.HDR_MSG_ID) == episode_id or data.get("episode_id") == episode_id:
            found.update(data)
            return True
        return False

    erased = (await erase_where(js, subjects.STREAM_EPISODES, f"engram.episode.*.{group_id}", is_episode)).erased
    erased += (await erase_where(js, subjects.STREAM_DELTAS, f"engram.delta.*.{group_id}",
                                 lambda m: (_json(m) or {}).get("episode_id") == episode_id)).erased
    session_id = found.get("session_id")
    wanted = set(message_ids) | {m.get("message_id") for m in found.get("messages") or [] if isinstance(m, dict)}
    if isinstance(session_id, str) and subjects.is_valid_token(session_id) and wanted:
        erased += (await erase_where(js, subjects.STREAM_IN, f"engram.in.*.message.{session_id}",
                                     lambda m: (_json(m) or {}).get("message_id") in wanted)).erased
    return erased
