"""Recall's pure stages (services/recall/merge.py): groups, query, merge, dedupe, budget, section."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from engram.text.tokens import token_counter
from engram.schemas import RecallItem, RecallMessage, RecallRequest, RecallScopes, subjects
from engram.schemas.relations import canonical_relation
from engram.services.recall.merge import (
    FOOTER,
    HEADER,
    fit_budget,
    groups_for,
    merge,
    current_facts_first,
    near_duplicate,
    query_text,
    render_line,
    superseded,
)

COUNT = token_counter()
T = datetime(2024, 5, 1, tzinfo=timezone.utc)


def item(uuid: str, fact: str, scope: str | None = "session", group: str = "g") -> RecallItem:
    return RecallItem(uuid=uuid, fact=fact, scope=scope, group_id=group, valid_at=T)  # type: ignore[arg-type]


def test_groups_in_scope_priority_with_hashed_keys_and_extra_groups() -> None:
    req = RecallRequest(query="q", scopes=RecallScopes(session="s1", workspace="/home/me/repo", user="me@x.org"),
                        group_ids=["extra", "bad.group", "engram_session_s1"])
    groups = groups_for(req, "engram")
    assert groups == [
        ("session", "engram_session_s1"),
        ("workspace", subjects.workspace_group("engram", "/home/me/repo")),
        ("user", subjects.user_group("engram", "me@x.org")),
        (None, "extra"),
    ]
    assert all("/" not in g and "@" not in g for _, g in groups)


def test_query_falls_back_to_recent_messages() -> None:
    assert query_text(RecallRequest(query="  where is it? ")) == "where is it?"
    msgs = [RecallMessage(role="user", content=f"m{i}") for i in range(5)]
    assert query_text(RecallRequest(recent_messages=msgs)) == "m2\nm3\nm4"


def test_merge_keeps_scope_priority_and_drops_near_duplicates() -> None:
    session = [item("a", "Alice works at Acme."), item("b", "Alice likes tea.")]
    workspace = [item("c", "alice works at acme", "workspace"), item("d", "The repo uses pytest.", "workspace")]
    user = [item("a", "Alice works at Acme.", "user"), item("e", "User prefers short answers.", "user")]
    merged = merge([session, workspace, user], max_items=10)
    assert [m.uuid for m in merged] == ["a", "b", "d", "e"]
    assert merge([session, workspace, user], max_items=2) == session
    assert near_duplicate("Alice works at Acme.", "Alice works at ACME") and not near_duplicate("Alice works", "Bob sleeps")


def test_budget_is_respected_with_a_real_tokenizer() -> None:
    items = [item(str(i), f"Fact number {i} about the deployment of service {i} to staging.") for i in range(50)]
    for budget in (16, 60, 120, 500, 5000):
        kept, section = fit_budget(items, budget, COUNT)
        if kept:
            assert COUNT(section) <= budget
            assert section.startswith(HEADER) and section.endswith(FOOTER)
            assert all(i.fact in section for i in kept)
        else:
            assert section == ""
    kept, _ = fit_budget(items, 5000, COUNT)
    assert len(kept) == 50


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=80), min_size=0, max_size=30), st.integers(min_value=16, max_value=800))
def test_budget_property(facts: list[str], budget: int) -> None:
    items = [item(str(i), f) for i, f in enumerate(facts)]
    kept, section = fit_budget(items, budget, COUNT)
    assert COUNT(section) <= budget
    assert [k.uuid for k in kept] == [i.uuid for i in items[: len(kept)]]  # a prefix, best first


def test_section_says_facts_may_be_stale_and_carries_dates() -> None:
    stale = RecallItem(uuid="x", fact="Alice worked at Acme.", scope="user", group_id="g",
                       valid_at=T, invalid_at=datetime(2024, 9, 1, tzinfo=timezone.utc))
    _, section = fit_budget([item("a", "Alice works at Globex."), stale], 500, COUNT)
    assert "<graphiti_memory>" in section and "stale" in section
    assert "(since 2024-05-01)" in section and "(since 2024-05-01, superseded 2024-09-01)" in section
    assert "[session]" in section and "[user]" in section


def test_superseded_facts_are_marked_and_future_ends_are_not() -> None:
    now = datetime(2025, 1, 1, tzinfo=timezone.utc)
    ended = RecallItem(uuid="x", fact="The billing service uses Postgres 15.", group_id="g",
                       invalid_at=datetime(2024, 9, 1, tzinfo=timezone.utc))
    ends_later = RecallItem(uuid="y", fact="Alice's contract runs.", group_id="g", valid_at=T,
                            invalid_at=datetime(2026, 6, 30, tzinfo=timezone.utc))
    assert render_line(ended, now) == "- The billing service uses Postgres 15. (superseded 2024-09-01)\n"
    assert render_line(ends_later, now) == "- Alice's contract runs. (since 2024-05-01, until 2026-06-30)\n"
    assert superseded(ended, now) and not superseded(ends_later, now)
    turn = RecallItem(uuid="t", fact="user: we use Postgres", kind="episode", group_id="g", valid_at=T,
                      invalid_at=datetime(2024, 9, 1, tzinfo=timezone.utc))
    # a past turn with an end is one whose every fact was superseded (services/recall/supersession.py):
    # its line says so; superseded() stays about facts (current_facts_first moves facts only)
    assert not superseded(turn, now) and render_line(turn, now).endswith("(said 2024-05-01, superseded 2024-09-01)\n")


def test_current_facts_come_before_superseded_ones_and_turns_keep_their_places() -> None:
    gone = datetime(2024, 9, 1, tzinfo=timezone.utc)
    old = RecallItem(uuid="old", fact="The billing service uses Postgres 15.", group_id="g", valid_at=T, invalid_at=gone)
    turn = RecallItem(uuid="turn", fact="user (Ada): billing is on Postgres 15 for now", kind="episode", group_id="g")
    new = RecallItem(uuid="new", fact="We switched the billing service to SQLite.", group_id="g", valid_at=gone)
    other = RecallItem(uuid="other", fact="Alice works at Acme.", group_id="g")
    ordered = current_facts_first([old, turn, new, other])
    assert [i.uuid for i in ordered] == ["new", "turn", "other", "old"]
    # merge() applies it: a superseded fact of the session never precedes a current fact of the user scope
    user_new = new.model_copy(update={"scope": "user"})
    assert [i.uuid for i in merge([[old, turn], [user_new]], 10)] == ["new", "turn", "old"]
    assert current_facts_first([turn, other]) == [turn, other]


def test_relation_synonyms_map_to_the_canonical_vocabulary() -> None:
    assert canonical_relation("requires") == "DEPENDS_ON"
    assert canonical_relation("Fixed") == "FIXES"
    assert canonical_relation("uses") == "USES"
    assert canonical_relation("WORKS_AT") == "WORKS_AT"
    assert canonical_relation(None) is None


def test_extraction_template_carries_the_canonical_vocabulary() -> None:
    from pathlib import Path

    from engram.schemas.relations import CANONICAL_RELATIONS

    template = (Path(__file__).resolve().parents[3] / "templates" / "default-session-turn.md").read_text()
    assert all(name in template for name in CANONICAL_RELATIONS)


def test_the_by_day_layout_says_each_day_once_newest_first_and_keeps_the_most_relevant_items() -> None:
    from datetime import timedelta

    from engram.services.recall.merge import HEADER_BY_DAY, line_costs, render_section

    later = T + timedelta(days=3)
    ended = RecallItem(uuid="p", fact="The billing service uses Postgres 15.", group_id="g", valid_at=T,
                       invalid_at=later, expired_at=later)
    items = [  # by relevance: the newest first
        RecallItem(uuid="s", fact="The billing service uses SQLite.", group_id="g", valid_at=later),
        RecallItem(uuid="t", fact="user: we moved billing to SQLite", kind="episode", group_id="g", valid_at=later),
        ended,
        RecallItem(uuid="u", fact="No date known.", group_id="g"),
    ]
    section = render_section(items, "by_day")
    assert section == (
        HEADER_BY_DAY
        + "4 May 2024:\n- The billing service uses SQLite.\n- user: we moved billing to SQLite\n"
        + "1 May 2024:\n- The billing service uses Postgres 15. (superseded 2024-05-04)\n"
        + "undated:\n- No date known.\n"
        + FOOTER
    )
    # the same items in the ranked layout pay a date on every line
    assert COUNT(section) < COUNT(render_section(items, "ranked"))
    base, costs = line_costs(items, COUNT, "by_day")
    assert costs[1] < costs[0]  # the second item of a day pays no heading
    # the budget keeps the most relevant prefix, whatever the day order on the page
    for budget in range(COUNT(HEADER_BY_DAY + FOOTER), COUNT(section) + 5):
        kept, fitted = fit_budget(items, budget, COUNT, "by_day")
        assert kept == items[: len(kept)]
        assert COUNT(fitted) <= budget if kept else fitted == ""
    assert fit_budget(items, 10_000, COUNT, "by_day") == (items, section)


def test_a_day_heading_names_the_month_and_costs_less_than_the_iso_date() -> None:
    from engram.services.recall.merge import _heading

    assert _heading("2023-05-08") == "8 May 2023:\n"
    assert _heading("2024-12-31") == "31 Dec 2024:\n"
    assert _heading("undated") == "undated:\n"
    assert COUNT(_heading("2023-05-08")) < COUNT("2023-05-08:\n")


def test_the_undated_layout_leaves_start_dates_out_but_keeps_when_a_fact_ended() -> None:
    from datetime import timedelta

    from engram.services.recall.merge import HEADER_UNDATED, line_costs, render_section

    later = T + timedelta(days=3)
    items = [
        RecallItem(uuid="s", fact="The billing service uses SQLite.", group_id="g", valid_at=later),
        RecallItem(uuid="p", fact="The billing service uses Postgres 15.", group_id="g", valid_at=T,
                   invalid_at=later, expired_at=later),
        RecallItem(uuid="t", fact="user: we moved billing to SQLite", kind="episode", group_id="g", valid_at=later),
    ]
    section = render_section(items, "undated")
    assert section == (
        HEADER_UNDATED
        + "- The billing service uses SQLite.\n"
        + "- The billing service uses Postgres 15. (superseded 2024-05-04)\n"
        + "- user: we moved billing to SQLite\n"
        + FOOTER
    )
    # cheaper than either dated layout for the same items, and the budget keeps the most relevant prefix
    assert COUNT(section) < COUNT(render_section(items, "by_day")) < COUNT(render_section(items, "ranked"))
    base, costs = line_costs(items, COUNT, "undated")
    assert base + sum(costs) >= COUNT(section) - 2
    for budget in range(COUNT(HEADER_UNDATED + FOOTER), COUNT(section) + 5):
        kept, fitted = fit_budget(items, budget, COUNT, "undated")
        assert kept == items[: len(kept)]
        assert COUNT(fitted) <= budget if kept else fitted == ""


def test_auto_left_unresolved_renders_dated() -> None:
    from engram.services.recall.merge import render_section

    items = [item("a", "Caroline paints.")]
    assert render_section(items, "auto") == render_section(items, "by_day")
