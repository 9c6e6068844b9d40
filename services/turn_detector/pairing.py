"""Turn pairing: a pure state machine from chat messages to completed user->assistant turns.

Rules (stream arrival order is the conversation order):
- a user message after any assistant-side activity completes the open turn and opens a new one;
- consecutive messages of one role merge into that side of the turn;
- an assistant (or tool) message with no user before it opens a turn of its own;
- tool messages belong to the assistant side (their outcome only, see noise.py);
- system messages are dropped unless ``include_system``; kept ones never change the side;
- an idle timeout or an explicit session close completes the open turn, so the last turn of a
  session is never lost;
- a message id seen before in the session (at any time: ``SessionState.seen``) is a duplicate
  and changes nothing;
- a turn's extraction override (ChatMessage.extraction) is the first one its messages carry, in
  arrival order -- normally the user message that opened the turn -- secret-scrubbed; a later
  message's is ignored, as for source_description.

Session segments (seed 004): a publisher's session is cut into segments without the publisher
noticing. Every accepted message adds its cl100k tokens (counted by the caller) to the open
segment; at a turn boundary (a message that opens a new turn) a segment holding
``token_limit`` tokens or more is closed with reason ``token_limit`` and the message starts the
next segment, so no turn and no message ever straddles two segments. An explicit close ends the
segment (``explicit``), so a closed session id that sends again starts a new segment; a segment
with no message for ``idle_close_s`` ends with ``idle``; a turn naming another user, workspace or
group than the segment (two people in one chat) ends it with ``scope_change``. A closed segment becomes a
:class:`SessionSegmentClosed` carrying the tail of its (scrubbed) transcript.

Nothing here does I/O: the service loads a :class:`SessionState`, applies one event and stores
the result, so every rule is testable without a broker.
"""

from __future__ import annotations


import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Callable, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from engram.schemas import ChatMessage, Episode, EpisodeMessage, EpisodeStats, ExtractionOverride, ScopeKeys
from engram.schemas.ids import SEEN_DIGEST_CHARS, episode_id_for, message_dedupe_key, seen_digest, seen_holds
from engram.schemas.memory import CloseReason, SessionSegmentClosed, TranscriptLine
from engram.schemas.subjects import _dedupe_digest, session_group, user_group, workspace_group

TRUNCATION_MARKER = "\n[... turn truncated: {n} chars]"


class TurnPart(BaseModel):
    """One already filtered and scrubbed message inside an open turn."""

    model_config = ConfigDict(extra="forbid")

    message_id: str
    role: Literal["user", "assistant", "system", "tool"]
    name: str | None = None
    timestamp: AwareDatetime
    text: str
    secrets_scrubbed: int = 0
    reductions: list[str] = Field(default_factory=list)
    late: bool = False


class OpenTurn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    turn_id: str
    parts: list[TurnPart] = Field(default_factory=list)
    scopes: ScopeKeys = Field(default_factory=ScopeKeys)
    source_description: str | None = None
    extraction: ExtractionOverride | None = Field(
        None, description="The turn's extraction override: its first message's that carries one, scrubbed.")
    first_published_at: AwareDatetime | None = Field(
        None, description="Earliest JetStream time of the turn's messages (the freshness histograms' start).")
    trace_parent: str | None = Field(
        None, description="W3C traceparent of the turn's first message: its Episodes are published under it, "
        "so one turn is one trace (engram/observability/tracing.py).")

    @property
    def has_assistant_side(self) -> bool:
        return any(p.role in ("assistant", "tool") for p in self.parts)


class CompletedTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: str
    turn_id: str
    parts: tuple[TurnPart, ...]
    scopes: ScopeKeys
    completed_by: Literal["next_user", "idle", "session_closed"]
    source_description: str | None = None
    extraction: ExtractionOverride | None = None
    first_published_at: AwareDatetime | None = None
    trace_parent: str | None = None


@dataclass(frozen=True)
class SegmentPolicy:
    """When segments close and how much transcript a closed one carries (ENGRAM_SESSION_*)."""

    token_limit: int = 30_000
    idle_close_s: float = 1800.0
    transcript_messages: int = 50
    transcript_tokens: int = 2000
    max_line_chars: int = 8000


DEFAULT_SEGMENTS = SegmentPolicy()


class Segment(BaseModel):
    """The open segment of a session: its counters and the tail of its transcript."""

    model_config = ConfigDict(extra="forbid")

    index: int = 0
    tokens: int = 0
    messages: int = 0
    opened_at: AwareDatetime | None = None
    last_at: AwareDatetime | None = None
    scopes: ScopeKeys = Field(default_factory=ScopeKeys)
    transcript: list[TranscriptLine] = Field(default_factory=list)
    line_tokens: list[int] = Field(default_factory=list, description="cl100k tokens of each transcript line.")
    dropped: int = 0


class SessionState(BaseModel):
    """Everything the detector remembers about one session (stored in NATS KV)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str
    epoch: int = Field(0, description="The session's epoch (engram/runtime/epochs.py) when this state was started; "
                       "part of every turn id, so turns re-posted after a delete get new episode ids.")
    last_seq: int = 0
    open_turn: OpenTurn | None = None
    seen: str = Field(
        "", description="Every message key (dedupe_key) the session took, oldest first, as SEEN_DIGEST_CHARS-char "
        "digests each followed by ',' (13 bytes a message): a message sent again at any time after, past the "
        "server's duplicate window, is recognised. Capped at ENGRAM_TURN_RECENT_IDS_KEPT (the oldest go first).")
    scopes_seen: list[ScopeKeys] = Field(
        default_factory=list, description="Every distinct scope set the session's messages named (capped): "
        "which groups it fed, so deleting one of them finds and erases the session.")
    last_turn_end: AwareDatetime | None = None
    turns_completed: int = 0
    last_activity: float | None = Field(
        None, description="Epoch of the last event on the input stream (its JetStream time, not when it was handled).")
    idle_scheduled_for: float | None = Field(None, description="Epoch of the pending idle schedule.")
    idle_timeout_s: float | None = Field(
        None, description="ChatMessage.idle_timeout_s of the session's latest message: that publisher's idle "
        "timeout for the open turn; None = the service's (ENGRAM_TURN_IDLE_TIMEOUT_S).",
    )
    outbox: list[CompletedTurn] = Field(
        default_factory=list,
        description="Turns completed by the event at last_seq. The state is saved before their "
        "episodes are published; a redelivery of that event re-publishes them (the server drops "
        "what already arrived).",
    )
    segment: Segment = Field(default_factory=Segment)
    closed_outbox: list[SessionSegmentClosed] = Field(
        default_factory=list, description="Segments closed by the event at last_seq (published like outbox).",
    )

    @model_validator(mode="before")
    @classmethod
    def _fold_recent_ids(cls, data: object) -> object:
        # A checkpoint written before `seen` kept the last 64 keys in full as `recent_ids`.
        if isinstance(data, dict) and "recent_ids" in data:
            data = dict(data)
            old = data.pop("recent_ids") or []
            data["seen"] = "".join(seen_digest(k) + "," for k in old) + data.get("seen", "")
        return data


@dataclass
class Transition:
    """Result of applying one event to a session."""

    state: SessionState
    completed: list[CompletedTurn] = field(default_factory=list)
    outcome: str = "accepted"  # low-cardinality: accepted|duplicate|excluded|late|flushed|idle_wait|noop
    closed: list[SessionSegmentClosed] = field(default_factory=list)


def _clone(state: SessionState) -> SessionState:
    """Copy what the apply functions change (lists and the open turn), share the rest.

    The apply functions never mutate their input (the service caches states and shares them);
    a copy of exactly the mutable containers is ~20x cheaper than a deep copy, once per message.
    TurnPart, ScopeKeys and CompletedTurn values are replaced, never changed in place.
    """
    new = state.model_copy()
    new.scopes_seen = list(state.scopes_seen)
    new.outbox = list(state.outbox)
    new.closed_outbox = list(state.closed_outbox)
    new.segment = state.segment.model_copy(update={
        "transcript": list(state.segment.transcript), "line_tokens": list(state.segment.line_tokens)})
    if state.open_turn is not None:
        new.open_turn = state.open_turn.model_copy(update={"parts": list(state.open_turn.parts)})
    return new


def _complete(state: SessionState, how: Literal["next_user", "idle", "session_closed"]) -> CompletedTurn | None:
    turn = state.open_turn
    if turn is None or not turn.parts:
        state.open_turn = None
        return None
    state.open_turn = None
    state.turns_completed += 1
    end = max(p.timestamp for p in turn.parts)
    state.last_turn_end = end if state.last_turn_end is None else max(end, state.last_turn_end)
    return CompletedTurn(
        session_id=state.session_id,
        turn_id=turn.turn_id,
        parts=tuple(turn.parts),
        scopes=turn.scopes,
        completed_by=how,
        source_description=turn.source_description,
        extraction=turn.extraction,
        first_published_at=turn.first_published_at,
        trace_parent=turn.trace_parent,
    )


def has_seen(state: SessionState, key: str) -> bool:
    return seen_holds(state.seen, key)


def _remember(state: SessionState, key: str, keep: int) -> None:
    # A str, not a set: states are copied per message (_clone) and cached shared; appending to an
    # immutable string costs one copy, and `in` on it is a fast substring search.
    seen = state.seen + seen_digest(key) + ","
    entry = SEEN_DIGEST_CHARS + 1
    if len(seen) > keep * entry:
        seen = seen[len(seen) - keep * entry:]
    state.seen = seen


def segment_id_for(session_id: str, epoch: int, segment: int) -> str:
    """Deterministic and unique per (session, epoch, segment): the close event's Nats-Msg-Id and
    the stored session record's key. Hashed: session ids may contain any separator we could use."""
    return "seg-" + _dedupe_digest(session_id, int(epoch), int(segment))[:32]


def _add_to_segment(state: SessionState, message: ChatMessage, part: TurnPart, tokens: int, policy: SegmentPolicy) -> None:
    seg = state.segment
    seg.tokens += tokens
    seg.messages += 1
    if seg.opened_at is None:
        seg.opened_at = message.timestamp
    if seg.last_at is None or message.timestamp > seg.last_at:
        seg.last_at = message.timestamp
    seg.scopes = _merge_scopes(seg.scopes, message.scopes) if seg.messages > 1 else message.scopes
    text = part.text if len(part.text) <= policy.max_line_chars else part.text[: policy.max_line_chars]
    seg.transcript.append(TranscriptLine.model_construct(
        message_id=part.message_id, role=part.role, name=part.name, text=text, timestamp=part.timestamp))
    seg.line_tokens.append(tokens)
    # The tail only: the oldest lines go first; the newest line always stays (capped above).
    total = sum(seg.line_tokens)
    while len(seg.transcript) > 1 and (len(seg.transcript) > policy.transcript_messages
                                       or total > policy.transcript_tokens):
        seg.transcript.pop(0)
        total -= seg.line_tokens.pop(0)
        seg.dropped += 1


def close_segment(state: SessionState, reason: CloseReason, closed_at: datetime | None = None) -> SessionSegmentClosed | None:
    """End the open segment (mutates ``state``: the next message starts segment index + 1).
    An empty segment (no accepted message since the last close) closes nothing. ``closed_at``
    defaults to the segment's last message time (the conversation's clock, also for imports of
    old chats); an explicit close passes the publisher's time."""
    seg = state.segment
    if seg.messages == 0:
        return None
    closed_at = closed_at or seg.last_at or seg.opened_at
    assert closed_at is not None
    event = SessionSegmentClosed(
        session_id=state.session_id,
        segment=seg.index,
        segment_id=segment_id_for(state.session_id, state.epoch, seg.index),
        reason=reason,
        token_count=seg.tokens,
        message_count=seg.messages,
        opened_at=seg.opened_at,
        closed_at=max(closed_at, seg.opened_at) if seg.opened_at else closed_at,
        scopes=seg.scopes,
        transcript=seg.transcript,
        transcript_dropped=seg.dropped,
    )
    state.segment = Segment(index=seg.index + 1)
    return event


def apply_message(
    state: SessionState,
    message: ChatMessage,
    part: TurnPart,
    *,
    now: float,
    include_system: bool = False,
    recent_ids_kept: int = 20_000,
    tokens: int | Callable[[str], int] = 0,
    segments: SegmentPolicy = DEFAULT_SEGMENTS,
    published_at: datetime | None = None,
    trace_parent: str | None = None,
    idle_timeout_s: float | None = None,
) -> Transition:
    """Apply one chat message (``part`` is its filtered, scrubbed form, ``tokens`` its cl100k
    count, or the counter to call only once the message is accepted) to the session.
    ``published_at``: the message's JetStream time; ``trace_parent``: the trace context it was
    handled in (kept for the turn when it opens one).

    ``now`` is the message's time on the input stream (the service passes the JetStream
    timestamp), so pairing depends only on the stream, never on when a replica got to the
    message: a message that arrives ``idle_timeout_s`` or more after the session's last event
    first completes the open turn (``idle``), and one ``segments.idle_close_s`` after it first
    closes the segment, exactly as the idle tick would have had it been handled before the
    message (after a crash or in a backlog it is handled later, or fires late). None: no gap check."""
    state = _clone(state)
    key = dedupe_key(message)
    if has_seen(state, key):
        return Transition(state, outcome="duplicate")
    _remember(state, key, recent_ids_kept)
    completed: list[CompletedTurn] = []
    closed: list[SessionSegmentClosed] = []
    if idle_timeout_s is not None and state.last_activity is not None:
        gap = now - state.last_activity
        if state.open_turn is not None and gap + IDLE_SLACK_S >= idle_timeout_s:
            done = _complete(state, "idle")
            if done:
                completed.append(done)
        if state.open_turn is None and state.segment.messages and gap + IDLE_SLACK_S >= segments.idle_close_s:
            ended = close_segment(state, "idle")
            if ended is not None:
                closed.append(ended)
    state.last_activity = now
    state.idle_timeout_s = message.idle_timeout_s
    if message.role == "system" and not include_system:
        return Transition(state, completed, outcome="excluded", closed=closed)

    if state.last_turn_end is not None and message.timestamp < state.last_turn_end:
        part = part.model_copy(update={"late": True})  # shallow: only the flag changes
    turn = state.open_turn
    other_person = scopes_conflict(state.segment.scopes, message.scopes) if state.segment.messages else False
    if turn is not None and ((message.role == "user" and turn.has_assistant_side) or other_person
                             or scopes_conflict(turn.scopes, message.scopes)):
        # A message naming another user, workspace or group than the open turn or segment (two
        # people in one chat before the reply) opens a turn of its own: a turn is written to one
        # set of groups, so merging would put one person's words into the other's memory.
        # Counted as next_user (the message that opens the next turn; no new schema value).
        done = _complete(state, "next_user")
        if done:
            completed.append(done)
        turn = None
    if turn is None:
        # A turn boundary: the only place a segment may rotate (no turn spans two segments).
        # A turn of another user, workspace or group ends the segment too: its summary goes to
        # the memory of the segment's scopes, so it must hold one person's conversation.
        ended = None
        if other_person:
            ended = close_segment(state, "scope_change")
        elif state.segment.tokens >= segments.token_limit:
            ended = close_segment(state, "token_limit")
        if ended is not None:
            closed.append(ended)
        turn = OpenTurn(turn_id=turn_id_for(state, message.message_id), trace_parent=trace_parent)
        state.open_turn = turn
    if published_at is not None and (turn.first_published_at is None or published_at < turn.first_published_at):
        turn.first_published_at = published_at
    if callable(tokens):  # counted only here: duplicates and excluded messages cost no tokenizer run
        tokens = tokens(part.text)
    _add_to_segment(state, message, part, tokens, segments)
    turn.parts.append(part)
    if message.scopes not in state.scopes_seen and len(state.scopes_seen) < MAX_SCOPES_SEEN:
        state.scopes_seen.append(message.scopes)
    turn.scopes = _merge_scopes(turn.scopes, message.scopes)
    turn.source_description = turn.source_description or message.source_description
    if turn.extraction is None and message.extraction is not None:
        turn.extraction = message.extraction  # scrubbed with the message's other texts (intake.prepare_part)
    return Transition(state, completed, outcome="late" if part.late else "accepted", closed=closed)


_DEFAULT_SCOPES = ScopeKeys()
MAX_SCOPES_SEEN = 16


def dedupe_key(message: ChatMessage) -> str:
    return message_dedupe_key(message)


def turn_id_for(state: SessionState, first_message_id: str) -> str:
    # The epoch only appears after a delete erased the session, so ids made before any delete
    # keep their form (and stay idempotent across re-ingests).
    if state.epoch:
        return f"{state.session_id}@{state.epoch}:{first_message_id}"
    return f"{state.session_id}:{first_message_id}"


def scopes_conflict(current: ScopeKeys, incoming: ScopeKeys) -> bool:
    """Both name a user or a workspace, and not the same one; or both name scopes and not the
    same explicit group (a group replaces the derived scopes). A message with the default scopes
    names none: it joins any turn (agents often publish replies without scopes)."""
    if current == _DEFAULT_SCOPES or incoming == _DEFAULT_SCOPES:
        return False
    return current.group != incoming.group or any(
        a is not None and b is not None and a != b
        for a, b in ((current.user, incoming.user), (current.workspace, incoming.workspace)))


def _merge_scopes(current: ScopeKeys, incoming: ScopeKeys) -> ScopeKeys:
    # A later message may name the workspace or user when the first one did not.
    if incoming == current or incoming == _DEFAULT_SCOPES:
        return current  # nothing new: skip building (and validating) an equal object
    return ScopeKeys(
        session=current.session and incoming.session,
        workspace=incoming.workspace or current.workspace,
        user=incoming.user or current.user,
        group=incoming.group or current.group,
    )


def apply_close(state: SessionState, *, now: float, closed_at: datetime | None = None) -> Transition:
    """An explicit close: flush the open turn and end the segment (``explicit``); the session id
    may send again later, into a new segment."""
    state = _clone(state)
    state.last_activity = now
    done = _complete(state, "session_closed")
    ended = close_segment(state, "explicit", closed_at)
    return Transition(state, [done] if done else [], outcome="flushed" if done or ended else "noop",
                      closed=[ended] if ended else [])


IDLE_SLACK_S = 0.5
"""Idle schedules have 1 s resolution: a tick or a message this close to the timeout counts as idle."""


def apply_idle(state: SessionState, *, now: float, idle_timeout_s: float,
               idle_close_s: float = DEFAULT_SEGMENTS.idle_close_s) -> Transition:
    """An idle tick fired: flush the open turn if the session really was idle for
    ``idle_timeout_s``, and close the segment once it was idle for ``idle_close_s``; else ask to
    be rescheduled.

    The tick may be late or early relative to the latest activity (a schedule is only pending
    once per session, see app.py); the caller reschedules (plan_idle) when something is left to
    do. 0.5 s slack: schedules have 1 s resolution.
    """
    state = _clone(state)
    state.idle_scheduled_for = None
    last = state.last_activity or 0.0
    completed: list[CompletedTurn] = []
    if state.open_turn is not None:
        if now + IDLE_SLACK_S < last + idle_timeout_s:
            state.idle_scheduled_for = last + idle_timeout_s
            return Transition(state, outcome="idle_wait")
        done = _complete(state, "idle")
        completed = [done] if done else []
    closed: list[SessionSegmentClosed] = []
    if state.segment.messages and now + IDLE_SLACK_S >= last + idle_close_s:
        ended = close_segment(state, "idle")
        closed = [ended] if ended else []
    if completed or closed:
        return Transition(state, completed, outcome="flushed", closed=closed)
    return Transition(state, outcome="noop")


def idle_timeout_for(state: SessionState, default_s: float) -> float:
    """The session's idle timeout: its latest message's override, else the service's default."""
    return state.idle_timeout_s or default_s


def plan_idle(state: SessionState, idle_timeout_s: float,
              idle_close_s: float = DEFAULT_SEGMENTS.idle_close_s) -> None:
    """An open turn gets an idle schedule at last activity + timeout when none is pending, or
    when the pending one is later than that (a message with a shorter idle_timeout_s arrived);
    with no open turn, an open segment gets one at last activity + ``idle_close_s``.
    With one timeout per session the due time only grows, so a pending schedule is kept and
    apply_idle reschedules when it fires early: one publish per idle period, not per message."""
    if state.open_turn is not None:
        due = (state.last_activity or 0.0) + idle_timeout_s
    elif state.segment.messages:
        due = (state.last_activity or 0.0) + idle_close_s
    else:
        return
    if state.idle_scheduled_for is None or state.idle_scheduled_for > due:
        state.idle_scheduled_for = due


# --- completed turn -> episodes ----------------------------------------------------------
# the label render_turn gives a named speaker, "user (Caroline): ", for readers of a turn's text
# (recall shortens it to "Caroline: ", the extractor finds the turn's speakers)
NAMED_SPEAKER = re.compile(r"(?m)^(?:user|assistant|system|tool) \(([^()\n]{1,100})\): ")


def render_turn(parts: tuple[TurnPart, ...] | list[TurnPart], max_chars: int) -> str:
    """Render parts as '<role> (<name>): text' blocks, merging runs of one role."""
    blocks: list[str] = []
    prev_role: str | None = None
    for part in parts:
        label = part.role if not part.name else f"{part.role} ({part.name})"
        if part.role == prev_role and blocks:
            blocks[-1] += "\n" + part.text
        else:
            blocks.append(f"{label}: {part.text}")
        prev_role = part.role
    text = "\n\n".join(blocks)
    if len(text) > max_chars:
        cut = len(text) - max_chars
        text = text[:max_chars] + TRUNCATION_MARKER.format(n=cut)
    return text


def scope_groups(prefix: str, session_id: str, scopes: ScopeKeys) -> list[tuple[str, str]]:
    """(scope, group_id) for every enabled scope, session first; an explicit group replaces them
    (its scope is read from a ``<prefix>_<scope>_`` id, else it counts as a session group)."""
    if scopes.group:
        scope = next((s for s in ("workspace", "user") if f"_{s}_" in scopes.group), "session")
        return [(scope, scopes.group)]
    out: list[tuple[str, str]] = []
    if scopes.session:
        out.append(("session", session_group(prefix, session_id)))
    if scopes.workspace:
        out.append(("workspace", workspace_group(prefix, scopes.workspace)))
    if scopes.user:
        out.append(("user", user_group(prefix, scopes.user)))
    return out


def episodes_for(turn: CompletedTurn, *, prefix: str, max_chars: int) -> list[Episode]:
    content = render_turn(turn.parts, max_chars)
    messages = [
        # fields of validated TurnParts: no need to validate them again
        EpisodeMessage.model_construct(message_id=p.message_id, role=p.role, name=p.name, timestamp=p.timestamp)
        for p in turn.parts
    ]
    reductions = sorted({r for p in turn.parts for r in p.reductions})
    stats = EpisodeStats(
        secrets_scrubbed=sum(p.secrets_scrubbed for p in turn.parts),
        reductions=reductions,
        late_messages=sum(1 for p in turn.parts if p.late),
    )
    reference_time: datetime = turn.parts[0].timestamp
    return [
        Episode(
            episode_id=episode_id_for(group_id, turn.turn_id),
            group_id=group_id,
            scope=scope,  # type: ignore[arg-type]
            turn_id=turn.turn_id,
            session_id=turn.session_id,
            reference_time=reference_time,
            content=content,
            messages=messages,
            completed_by=turn.completed_by,
            source_description=turn.source_description,
            extraction=turn.extraction,
            stats=stats,
            first_published_at=turn.first_published_at,
            # the key the group is named after (the explorer shows it; an explicit group has none)
            scope_key=None if turn.scopes.group else {"session": turn.session_id, "workspace": turn.scopes.workspace,
                                                      "user": turn.scopes.user}.get(scope),
        )
        for scope, group_id in scope_groups(prefix, turn.session_id, turn.scopes)
    ]
