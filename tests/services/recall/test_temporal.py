"""Temporal grounding in recall (issue 11, item 4): past turns rendered with their relative dates
resolved against the day they were said (services/recall/merge.py render_line), and the pure
"when"-question re-ranking (services/recall/temporal.py) the search will call."""

from __future__ import annotations

from datetime import datetime, timezone

from hypothesis import given, settings
from hypothesis import strategies as st

from engram.text.tokens import token_counter
from engram.schemas import RecallItem
from engram.services.recall.merge import fit_budget, render_line
from engram.services.recall.temporal import DEFAULT_LIFT, is_dated, is_when_question, prefer_dated, rank_for_query

SAID = datetime(2023, 5, 12, 15, 30, tzinfo=timezone.utc)  # a Friday
TURN = "user (Calvin): I had a car incident last Friday.\n\nassistant: Oh no, are you OK?"


def episode(uuid: str, text: str, said: datetime | None = SAID) -> RecallItem:
    return RecallItem(uuid=uuid, fact=text, kind="episode", scope="session", group_id="g", valid_at=said)


def fact(uuid: str, text: str) -> RecallItem:
    return RecallItem(uuid=uuid, fact=text, kind="fact", scope="session", group_id="g", valid_at=SAID)


# --------------------------------------------------------------------------- rendering
def test_a_past_turn_shows_its_relative_date_resolved_against_the_day_it_was_said() -> None:
    assert render_line(episode("e1", TURN)) == (
        "- [session] user (Calvin): I had a car incident last Friday (2023-05-05).\n\n"
        "assistant: Oh no, are you OK? (said 2023-05-12)\n"
    )


def test_a_turn_without_relative_dates_or_without_a_date_renders_as_before() -> None:
    plain = "user (Calvin): I love my car."
    assert render_line(episode("e1", plain)) == f"- [session] {plain} (said 2023-05-12)\n"
    assert render_line(episode("e2", TURN, said=None)) == f"- [session] {TURN}\n"


def test_facts_are_not_grounded_by_render_line() -> None:
    """A fact's valid_at is the date it names, not the day it was said: grounding "last Friday"
    against it would be wrong (the extractor grounds facts, with the right reference)."""
    line = render_line(fact("f1", "Calvin had a car incident last Friday."))
    assert "last Friday." in line and "last Friday (" not in line


def test_fit_budget_counts_the_grounded_line() -> None:
    count = token_counter()
    items = [episode("e1", TURN)]
    kept, section = fit_budget(items, 10_000, count)
    assert kept == items and "last Friday (2023-05-05)" in section
    line_cost = count(render_line(items[0]))
    # a budget that fits the ungrounded line but not the grounded one keeps nothing
    ungrounded = count(f"- [session] {TURN} (said 2023-05-12)\n")
    assert ungrounded < line_cost
    from engram.services.recall.merge import FOOTER, HEADER
    tight = count(HEADER) + count(FOOTER) + ungrounded
    assert fit_budget(items, tight, count) == ([], "")


def test_turkish_turns_are_grounded_and_otherwise_unchanged() -> None:
    text = "user (Ayşe): Geçen Cuma arabamla kaza yaptım; dün de İzmir'e gittim, 2 gün önce döndüm."
    assert render_line(episode("e1", text)) == (
        "- [session] user (Ayşe): Geçen Cuma (2023-05-05) arabamla kaza yaptım; dün (2023-05-11) de İzmir'e "
        "gittim, 2 gün önce (2023-05-10) döndüm. (said 2023-05-12)\n"
    )
    plain = "user (Ayşe): Yanımızdan geçen araba çok hızlıydı, her şeyden önce dünya çok güzel."
    assert render_line(episode("e2", plain)) == f"- [session] {plain} (said 2023-05-12)\n"


# --------------------------------------------------------------------------- "when" questions
def test_when_questions() -> None:
    for q in ("When did Calvin have a car incident?", "when did Caroline go to the LGBTQ support group",
              "What year did Melanie move to Sweden?", "How long ago was Caroline's trip?",
              "In what month did they adopt the puppy?", "Which day is the wedding?",
              "Since when has Alice worked at Acme?", "So when was the concert?",
              "How long has Melanie been practicing art?", "How many months passed between Andrew adopting Toby and Buddy?",
              "How long did it take for Joanna to finish writing her book?", "Calvin ne zaman kaza yaptı?",
              "Ayse hangi yil tasindi?", "Kaç yıl önce evlendiler?", "Ne kadar zamandır resim yapıyor?"):
        assert is_when_question(q), q
    for q in ("What did Calvin buy?", "Where does Alice work?", "When I asked about Postgres, what did you say?",
              "Who went to the beach?", "What is the weather like?", "Calvin ne aldı?", "",
              "How long is the Golden Gate Bridge?", "How many dogs does Audrey have?", "What may 2000 people do?",
              "How long does Audrey walk her dogs?", "What movie did Joanna watch on 1 May, 2022?"):
        assert not is_when_question(q), q


def test_is_dated_on_absolute_grounded_and_relative_texts() -> None:
    assert is_dated(fact("f", "Melanie moved to Sweden in May 2023."))
    assert is_dated(fact("f", "Calvin had a car incident on 2023-05-05."))
    assert is_dated(episode("e", "I had a car incident last Friday (2023-05-05)."))
    assert is_dated(episode("e", TURN))  # grounded when rendered
    assert not is_dated(episode("e", "I love my car."))
    assert not is_dated(episode("e", "I love watching Friday Night Lights."))


def test_prefer_dated_moves_dated_items_up_a_bounded_number_of_places() -> None:
    items = [episode(f"u{i}", f"undated turn number {i}") for i in range(6)]
    items.insert(5, episode("d", TURN))  # rank 5
    assert [x.uuid for x in prefer_dated(items, lift=2)] == ["u0", "u1", "u2", "d", "u3", "u4", "u5"]
    assert [x.uuid for x in prefer_dated(items, lift=10)][0] == "d"
    assert prefer_dated(items, lift=0) == items
    assert [x.uuid for x in prefer_dated(items)].index("d") == 5 - DEFAULT_LIFT


def test_rank_for_query_only_reorders_for_when_questions() -> None:
    items = [episode("u0", "I love my car."), episode("d", TURN)]
    assert [x.uuid for x in rank_for_query("When did Calvin have a car incident?", items)] == ["d", "u0"]
    assert rank_for_query("What happened to Calvin's car?", items) == items


@settings(max_examples=200, deadline=None)
@given(flags=st.lists(st.booleans(), max_size=30), lift=st.integers(min_value=0, max_value=8))
def test_prefer_dated_is_a_stable_bounded_permutation(flags: list[bool], lift: int) -> None:
    items = list(range(len(flags)))
    out = prefer_dated(items, lift=lift, dated=lambda i: flags[i])
    assert sorted(out) == items
    dated = [i for i in out if flags[i]]
    undated = [i for i in out if not flags[i]]
    assert dated == sorted(dated) and undated == sorted(undated)  # stable within each class
    for i in dated:
        assert i - lift <= out.index(i) <= i  # up, by at most lift places
    for i in undated:
        assert out.index(i) >= i  # undated items only move down


def test_auto_layout_dates_the_section_only_for_a_question_about_time() -> None:
    from engram.services.recall.temporal import asks_about_time, layout_for

    about_time = [
        "When did Caroline go to the LGBTQ support group?",
        "What did Joanna watch on 1 May, 2022?",  # names a date: the lines of that day are the answer
        "What did Melanie do last weekend?",
        "Are we still on Postgres for billing?",
        "What did Jon do before opening his studio?",
        "How long has Melanie been painting?",
        "Where did Caroline move from 4 years ago?",
    ]
    not_about_time = [
        "What is Caroline's identity?",
        "What activities does Melanie partake in?",
        "Which database does the billing service use?",
        "Would Caroline pursue writing as a career?",
    ]
    for q in about_time:
        assert asks_about_time(q), q
        assert layout_for("auto", q) == "by_day", q
    for q in not_about_time:
        assert not asks_about_time(q), q
        assert layout_for("auto", q) == "undated", q
    # any other layout is left as it is, whatever the question
    assert layout_for("ranked", about_time[0]) == "ranked"
    assert layout_for("by_day", not_about_time[0]) == "by_day"
    assert not asks_about_time("")


# --- a time the question names -----------------------------------------------------------------


def test_a_question_names_a_day_a_month_or_a_year_and_before_or_after_widens_it() -> None:
    from datetime import date

    from engram.services.recall.temporal import Period, named_period

    assert named_period("Who did Maria have dinner with on May 3, 2023?") == Period(date(2023, 5, 2), date(2023, 5, 4))
    assert named_period("What movie did Joanna watch on 1 May, 2022?") == Period(date(2022, 4, 30), date(2022, 5, 2))
    assert named_period("what broke on 2024-02-29") == Period(date(2024, 2, 28), date(2024, 3, 1))
    assert named_period("What did Maria donate in December 2023?") == Period(date(2023, 12, 1), date(2023, 12, 31))
    assert named_period("How often did we deploy in 2023?") == Period(date(2023, 1, 1), date(2023, 12, 31))
    # "before"/"after" a day: the two weeks on that side, the day itself kept
    assert named_period("What did John do the week before August 3, 2023?") == Period(date(2023, 7, 19), date(2023, 8, 4))
    assert named_period("What changed after 2023-03-01?") == Period(date(2023, 2, 28), date(2023, 3, 16))
    # two named times: from the first to the last
    assert named_period("between 1 May 2023 and June 2023") == Period(date(2023, 4, 30), date(2023, 6, 30))
    # nothing named, no such day, or a time with no year (which year it means needs a reference)
    for query in ("When did Caroline go to the support group?", "What happened on 2023-02-30?",
                  "What did we decide about billing in March?", "we have 2023 users", "What is our plan for 2023?", ""):
        assert named_period(query) is None, query


def test_items_of_the_named_time_move_up_a_bounded_number_of_places() -> None:
    from engram.services.recall.temporal import prefer_period

    may_3 = datetime(2023, 5, 3, 18, tzinfo=timezone.utc)
    items = [episode(f"t{i}", f"turn {i}", datetime(2023, 4, 1, tzinfo=timezone.utc)) for i in range(6)]
    items.append(episode("dinner", "Maria: had dinner with my mom tonight", may_3))
    items.append(fact("fact-then", "Maria had dinner with her mom").model_copy(update={"valid_at": may_3}))
    question = "Who did Maria have dinner with on May 3, 2023?"
    moved = [i.uuid for i in prefer_period(question, items, lift=3)]
    assert moved == ["t0", "t1", "t2", "dinner", "t3", "fact-then", "t4", "t5"]  # each aims 3 places up
    assert [i.uuid for i in prefer_period(question, items, lift=100)][:2] == ["dinner", "fact-then"]
    # no time named, or lift 0: the order is kept
    assert prefer_period("Who did Maria have dinner with?", items, lift=3) == items
    assert prefer_period(question, items, lift=0) == items
    # an item with no date is never moved up
    undated = [episode("a", "x", datetime(2023, 4, 1, tzinfo=timezone.utc)), episode("b", "y", None)]
    assert prefer_period(question, undated, lift=5) == undated
