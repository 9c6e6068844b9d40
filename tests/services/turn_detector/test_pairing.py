"""Pure pairing rules, no broker."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from engram.schemas import ExtractionOverride, ScopeKeys
from engram.services.turn_detector.pairing import (
    SessionState,
    TurnPart,
    apply_close,
    apply_idle,
    apply_message,
    episode_id_for,
    episodes_for,
    plan_idle,
    render_turn,
)
from engram.services.turn_detector.intake import prepare_part
from engram.services.turn_detector.noise import NoiseSettings
from tests.services.turn_detector.helpers import msg


def feed(events: list[tuple[str, str]], session: str = "s") -> tuple[SessionState, list]:
    state = SessionState(session_id=session)
    done = []
    for i, (mid, role) in enumerate(events):
        m = msg(session, mid, role, f"text {mid}", i)
        part = TurnPart(message_id=mid, role=role, timestamp=m.timestamp, text=m.content)
        tr = apply_message(state, m, part, now=float(i))
        state = tr.state
        done += tr.completed
    return state, done


def ids(turn) -> list[str]:  # noqa: ANN001
    return [p.message_id for p in turn.parts]


def test_next_user_completes_the_turn() -> None:
    state, done = feed([("u1", "user"), ("a1", "assistant"), ("u2", "user")])
    assert [ids(t) for t in done] == [["u1", "a1"]]
    assert done[0].completed_by == "next_user"
    assert ids(state.open_turn) == ["u2"]


def test_runs_of_one_role_merge() -> None:
    _, done = feed([("u1", "user"), ("u2", "user"), ("a1", "assistant"), ("a2", "assistant"), ("u3", "user")])
    assert [ids(t) for t in done] == [["u1", "u2", "a1", "a2"]]
    text = render_turn(done[0].parts, 10_000)
    assert text == "user: text u1\ntext u2\n\nassistant: text a1\ntext a2"


def test_assistant_first_is_its_own_turn() -> None:
    _, done = feed([("a0", "assistant"), ("u1", "user"), ("a1", "assistant"), ("u2", "user")])
    assert [ids(t) for t in done] == [["a0"], ["u1", "a1"]]


def test_tool_output_belongs_to_the_assistant_side() -> None:
    _, done = feed([("u1", "user"), ("t1", "tool"), ("u2", "user")])
    assert [ids(t) for t in done] == [["u1", "t1"]]


def test_system_excluded_unless_enabled() -> None:
    state = SessionState(session_id="s")
    m = msg("s", "sys", "system", "rules", 0)
    part = TurnPart(message_id="sys", role="system", timestamp=m.timestamp, text="rules")
    assert apply_message(state, m, part, now=0).outcome == "excluded"
    kept = apply_message(state, m, part, now=0, include_system=True)
    assert kept.outcome == "accepted" and ids(kept.state.open_turn) == ["sys"]


def test_duplicate_message_id_changes_nothing() -> None:
    state, _ = feed([("u1", "user")])
    m = msg("s", "u1", "user", "again", 5)
    tr = apply_message(state, m, TurnPart(message_id="u1", role="user", timestamp=m.timestamp, text="x"), now=9)
    assert tr.outcome == "duplicate" and tr.state == state


def _again(state: SessionState, mid: str, **kw) -> str:  # noqa: ANN003
    m = msg("s", mid, "user", "again", 10_000)
    return apply_message(state, m, TurnPart(message_id=mid, role="user", timestamp=m.timestamp, text="x"),
                         now=10_000.0, **kw).outcome


def test_a_message_is_recognised_at_any_session_length() -> None:
    # issue 23 item 2: only the last 64 ids used to be remembered, so a re-ingest of a longer
    # session after the server's duplicate window took every message again
    state, _ = feed([(f"m{i}", "user" if i % 2 == 0 else "assistant") for i in range(1000)])
    assert all(_again(state, f"m{i}") == "duplicate" for i in range(0, 1000, 37))
    assert _again(state, "m1000") == "accepted"
    assert len(state.seen) == 1000 * 13, "13 bytes a message in the checkpoint"


def test_the_remembered_ids_are_capped_oldest_first() -> None:
    state = SessionState(session_id="s")
    for i in range(5):
        m = msg("s", f"m{i}", "user", "t", i)
        state = apply_message(state, m, TurnPart(message_id=m.message_id, role="user", timestamp=m.timestamp,
                                                 text="t"), now=float(i), recent_ids_kept=3).state
    assert [_again(state, f"m{i}", recent_ids_kept=3) for i in range(5)] == ["accepted"] * 2 + ["duplicate"] * 3


def test_a_checkpoint_of_an_older_engram_keeps_its_recent_ids() -> None:
    old = SessionState(session_id="s").model_dump(mode="json") | {"recent_ids": ["u1", "a1|0123456789ab"]}
    del old["seen"]
    state = SessionState.model_validate_json(json.dumps(old))
    assert _again(state, "u1") == "duplicate" and _again(state, "u2") == "accepted"
    assert "recent_ids" not in state.model_dump()


def test_close_flushes_even_a_user_only_turn_and_is_idempotent() -> None:
    state, _ = feed([("u1", "user")])
    tr = apply_close(state, now=1)
    assert [ids(t) for t in tr.completed] == [["u1"]] and tr.completed[0].completed_by == "session_closed"
    assert apply_close(tr.state, now=2).completed == []


def test_idle_flushes_only_after_the_timeout() -> None:
    state, _ = feed([("u1", "user"), ("a1", "assistant")])  # last activity at t=1
    plan_idle(state, 10)
    assert state.idle_scheduled_for == 11
    early = apply_idle(state, now=5, idle_timeout_s=10)
    assert early.completed == [] and early.state.idle_scheduled_for == 11  # rescheduled
    late = apply_idle(state, now=11, idle_timeout_s=10)
    assert [ids(t) for t in late.completed] == [["u1", "a1"]] and late.completed[0].completed_by == "idle"
    assert late.state.idle_scheduled_for is None
    assert apply_idle(late.state, now=30, idle_timeout_s=10).outcome == "noop"


def test_episode_ids_are_deterministic_per_group_and_turn() -> None:
    _, done = feed([("u1", "user"), ("a1", "assistant"), ("u2", "user")])
    turn = done[0]
    turn = turn.model_copy(update={"scopes": ScopeKeys(workspace="w", user="u")})
    eps = episodes_for(turn, prefix="engram", max_chars=1000)
    assert [e.scope for e in eps] == ["session", "workspace", "user"]
    assert eps[0].episode_id == episode_id_for("engram_session_s", "s:u1")
    assert episodes_for(turn, prefix="engram", max_chars=1000) == eps


def test_turn_content_is_capped_with_a_marker() -> None:
    part = TurnPart(message_id="u", role="user", timestamp=msg("s", "u", "user", "", 0).timestamp, text="x" * 500)
    text = render_turn([part], 100)
    assert text.startswith("user: ") and text.endswith("[... turn truncated: 406 chars]")


def predicted_turns(roles: list[str]) -> int:
    """Independent statement of the rules: every run of user messages starts a turn, and so does
    a leading run of assistant-side messages."""
    kept = [("user" if r == "user" else "assistant") for r in roles if r != "system"]
    runs = [r for i, r in enumerate(kept) if i == 0 or kept[i - 1] != r]
    return sum(1 for r in runs if r == "user") + (1 if runs and runs[0] == "assistant" else 0)


@settings(max_examples=300)
@given(st.lists(st.sampled_from(["user", "assistant", "tool", "system"]), max_size=40))
def test_turn_count_matches_the_rules_and_no_message_is_lost(roles: list[str]) -> None:
    events = [(f"m{i}", r) for i, r in enumerate(roles)]
    state, done = feed(events)
    done += apply_close(state, now=99).completed
    assert len(done) == predicted_turns(roles)
    flat = [p.message_id for t in done for p in t.parts]
    assert flat == [mid for mid, r in events if r != "system"]  # each kept message exactly once, in order


@settings(max_examples=200)
@given(st.lists(st.sampled_from(["user", "assistant", "tool", "close", "idle"]), max_size=25))
def test_apply_functions_never_change_their_input(events: list[str]) -> None:
    """The service shares cached states between calls: applying must leave the input as it was."""
    state = SessionState(session_id="s")
    for i, kind in enumerate(events):
        before = state.model_dump_json()
        if kind == "close":
            tr = apply_close(state, now=float(i))
        elif kind == "idle":
            tr = apply_idle(state, now=float(i), idle_timeout_s=0.5)
        else:
            m = msg("s", f"m{i}", kind, f"t{i}", i)
            tr = apply_message(state, m, TurnPart(message_id=m.message_id, role=kind, timestamp=m.timestamp,
                                                  text=m.content), now=float(i))
        assert state.model_dump_json() == before
        plan_idle(tr.state, 5.0)
        assert state.model_dump_json() == before
        state = tr.state


def test_an_explicit_group_replaces_the_derived_scope_groups() -> None:
    from engram.schemas import ScopeKeys
    from engram.services.turn_detector.pairing import scope_groups

    assert scope_groups("engram", "s1", ScopeKeys(group="cc_session_abc", workspace="w")) == [("session", "cc_session_abc")]
    assert scope_groups("engram", "s1", ScopeKeys(group="cc_workspace_9f")) == [("workspace", "cc_workspace_9f")]
    assert scope_groups("engram", "s1", ScopeKeys(group="mygroup")) == [("session", "mygroup")]


def test_an_explicit_group_survives_scope_merging() -> None:
    from engram.schemas import ScopeKeys
    from engram.services.turn_detector.pairing import _merge_scopes

    merged = _merge_scopes(ScopeKeys(), ScopeKeys(group="cc_session_abc"))
    assert merged.group == "cc_session_abc"
    assert _merge_scopes(merged, ScopeKeys(user="u")).group == "cc_session_abc"


@settings(max_examples=100)
@given(
    st.lists(st.sampled_from(["user", "assistant", "tool"]), min_size=2, max_size=12),
    st.sampled_from([ScopeKeys(), ScopeKeys(workspace="/repo/x", user="ada@example.com"), ScopeKeys(group="cc_session_abc")]),
    st.integers(min_value=20, max_value=2000),
)
def test_episodes_built_without_validation_are_valid_episodes(roles: list[str], scopes: ScopeKeys, max_chars: int) -> None:
    """Whatever episodes_for builds is exactly what validation accepts and yields, also after a
    JSON round trip (a guard for building them without validation, which was tried and measured
    no faster: pydantic's model_construct is Python, validation is Rust)."""
    from engram.schemas import Episode

    _, done = feed([(f"m{i}", r) for i, r in enumerate(roles)])
    state, _ = feed([(f"m{i}", r) for i, r in enumerate(roles)])
    done += apply_close(state, now=99).completed
    for turn in done:
        turn = turn.model_copy(update={
            "scopes": scopes,
            "parts": tuple(p.model_copy(update={"secrets_scrubbed": 1, "reductions": ["long_line"], "late": True})
                           for p in turn.parts)})
        for ep in episodes_for(turn, prefix="engram", max_chars=max_chars):
            assert Episode.model_validate(ep.model_dump()) == ep
            assert Episode.model_validate_json(ep.model_dump_json()) == ep
            assert ep.stats.secrets_scrubbed == len(turn.parts) and ep.stats.late_messages == len(turn.parts)


# --------------------------------------------------------------------------- extraction override

def test_a_turns_extraction_override_is_its_first_messages_scrubbed_and_reaches_its_episodes() -> None:
    secret = "sk-" + "Zq8wN3vR5tY7uI9oP1aS2dF4gH6jK8lX"
    given_by = {"u1": None, "u2": f"FIRST keep decisions {secret}", "a1": "LATER", "u3": None}
    state = SessionState(session_id="s")
    done = []
    for i, (mid, role) in enumerate([("u1", "user"), ("u2", "user"), ("a1", "assistant"), ("u3", "user")]):
        text = given_by[mid]
        raw = msg("s", mid, role, f"text {mid}", i, extraction=ExtractionOverride(preprocessing_prompt=text) if text else None)
        prepared = prepare_part(raw, NoiseSettings())  # the turn-detector scrubs a message's texts there
        assert sum(prepared.secrets.values()) == (1 if mid == "u2" else 0)  # counted: its raw input is erased at once
        tr = apply_message(state, prepared.message, prepared.part, now=float(i))
        state, done = tr.state, done + tr.completed
    (turn,) = done
    (episode,) = episodes_for(turn, prefix="engram", max_chars=10_000)
    prompt = episode.extraction.preprocessing_prompt
    assert prompt.startswith("FIRST keep decisions ") and secret not in prompt and "LATER" not in prompt
    assert state.open_turn.extraction is None  # the next turn starts without one


def test_a_turn_without_an_override_has_none() -> None:
    _, done = feed([("u1", "user"), ("a1", "assistant"), ("u2", "user")])
    assert done[0].extraction is None
    assert episodes_for(done[0], prefix="engram", max_chars=10_000)[0].extraction is None
