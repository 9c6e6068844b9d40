"""Pairing never merges messages that name different users, workspaces or groups into one turn
(issue 16, item 4): a turn is written to one set of groups, so a merged turn would put one
person's words into another's memory. End to end in tests/services/test_isolation.py."""

from __future__ import annotations

from engram.schemas import ScopeKeys
from engram.services.turn_detector.pairing import SessionState, TurnPart, apply_message, scope_groups, scopes_conflict
from tests.services.turn_detector.helpers import msg


def feed(events: list[tuple[str, str, ScopeKeys]], closed: list | None = None) -> tuple[SessionState, list]:
    state, done = SessionState(session_id="s"), []
    for i, (mid, role, scopes) in enumerate(events):
        m = msg("s", mid, role, f"text {mid}", i, scopes=scopes)
        tr = apply_message(state, m, TurnPart(message_id=mid, role=role, timestamp=m.timestamp, text=m.content),
                           now=float(i), tokens=5)
        state, done = tr.state, done + tr.completed
        if closed is not None:
            closed += tr.closed
    return state, done


def ids(turn) -> list[str]:  # noqa: ANN001
    return [p.message_id for p in turn.parts]


ALICE, BOB = ScopeKeys(user="alice"), ScopeKeys(user="bob")


def test_two_users_before_the_reply_are_two_turns_each_to_its_own_user() -> None:
    state, done = feed([("a1", "user", ALICE), ("b1", "user", BOB), ("r1", "assistant", BOB)])
    assert [ids(t) for t in done] == [["a1"]] and done[0].completed_by == "next_user"
    assert dict(scope_groups("p", "s", done[0].scopes))["user"] == dict(scope_groups("p", "s", ALICE))["user"]
    assert ids(state.open_turn) == ["b1", "r1"] and state.open_turn.scopes.user == "bob"


def test_a_reply_naming_another_user_opens_its_own_turn() -> None:
    state, done = feed([("a1", "user", ALICE), ("r1", "assistant", BOB)])
    assert [ids(t) for t in done] == [["a1"]] and done[0].scopes.user == "alice"
    assert ids(state.open_turn) == ["r1"]


def test_another_group_or_workspace_splits_too_and_a_scope_named_later_still_merges() -> None:
    _, done = feed([("u1", "user", ScopeKeys(group="g1")), ("u2", "user", ScopeKeys(group="g2")),
                    ("u3", "user", ScopeKeys(workspace="w1")), ("u4", "user", ScopeKeys(workspace="w2")),
                    ("u5", "user", ScopeKeys(workspace="w2", user="alice"))])
    assert [ids(t) for t in done] == [["u1"], ["u2"], ["u3"]]
    # the first message names no user, the next one does, the reply names none: one turn, the user's (as before)
    state, done = feed([("u1", "user", ScopeKeys()), ("u2", "user", ALICE), ("r1", "assistant", ScopeKeys())])
    assert done == [] and ids(state.open_turn) == ["u1", "u2", "r1"] and state.open_turn.scopes.user == "alice"


def test_scopes_conflict() -> None:
    assert scopes_conflict(ALICE, BOB) and not scopes_conflict(ALICE, ALICE)
    assert not scopes_conflict(ScopeKeys(), BOB) and not scopes_conflict(ALICE, ScopeKeys(workspace="w"))
    assert scopes_conflict(ScopeKeys(group="a"), ScopeKeys(group="b"))
    assert scopes_conflict(ScopeKeys(group="a"), ScopeKeys(user="bob"))  # the group replaces bob's scopes
    assert not scopes_conflict(ScopeKeys(group="a"), ScopeKeys()) and not scopes_conflict(ScopeKeys(), ScopeKeys(group="a"))


def test_a_segment_holds_one_persons_conversation() -> None:
    """The session close stage writes a segment's summary, preferences and notes to the memory
    of the segment's scopes: a segment that went on across another user's turn put the first
    user's conversation into the second user's memory (scopes merged, the later user winning)."""
    closed: list = []
    state, _ = feed([("a1", "user", ALICE), ("r1", "assistant", ScopeKeys()), ("a2", "user", ALICE),
                     ("b1", "user", BOB), ("r2", "assistant", ScopeKeys()),
                     ("x1", "user", ScopeKeys()), ("a3", "user", ALICE)], closed)
    assert [(c.reason, c.scopes.user, [line.message_id for line in c.transcript]) for c in closed] == [
        ("scope_change", "alice", ["a1", "r1", "a2"]),
        ("scope_change", "bob", ["b1", "r2", "x1"]),  # a message naming nobody joins the open segment
    ]
    assert state.segment.scopes.user == "alice" and [line.message_id for line in state.segment.transcript] == ["a3"]
    assert [c.segment for c in closed] == [0, 1] and state.segment.index == 2
