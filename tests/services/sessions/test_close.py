"""services/sessions/close.py and the rules model's answers to its two prompts
(engram/models/rules_llm/sessions.py), without a broker: English and Turkish transcripts, the
hybrid format, the token cap, and each step's failure outcomes."""

from __future__ import annotations

from engram.text.language import detect_language
from engram.text.tokens import token_counter
from engram.schemas.memory import EMPTY_SUMMARY, FALLBACK_SUMMARY
from engram.services.sessions.close import (
    HybridSessionSummary,
    close_segment,
    extract_user_facts,
    prepare_transcript,
    render_summary,
    summarize_session,
)
from tests.services.sessions.helpers import ENGLISH, TOOL_ONLY, TURKISH, CountingLLM, UnparsableJSONLLM, line, segment

count = token_counter()


def test_prepare_transcript_keeps_user_and_assistant_text_only() -> None:
    kept = prepare_transcript(ENGLISH)
    assert [t.message_id for t in kept] == ["m1", "m2", "m4", "m5", "m7"]
    assert prepare_transcript(TOOL_ONLY) == []


def test_detect_language() -> None:
    assert detect_language(t.text for t in TURKISH) == "tr"
    assert detect_language(t.text for t in ENGLISH) == "en"
    assert detect_language(["Bu projede JWT kullanacagiz ve sonra test yazacagiz."]) == "tr"  # no Turkish letters
    assert detect_language(["We flew to İstanbul last week and it was great."]) == "en"
    assert detect_language(["", "123"]) is None


async def test_english_summary_is_hybrid_and_within_budget() -> None:
    llm = CountingLLM()
    result = await summarize_session(llm, prepare_transcript(ENGLISH), ["An earlier summary."], 500, reason="token_limit")
    assert (result.outcome, result.source, result.language) == ("ok", "rules", "en")
    narrative, *sections = result.text.split("\n")
    # (the topics come from the rules extractor's entities, whose rules change: not pinned here)
    assert narrative.startswith("The conversation was about ") and "jwt" in sections[0].lower()
    assert 2 <= narrative.count("”") + 1 <= 4  # the topic sentence and 1-3 quoted sentences
    labels = [s.split(":")[0] for s in sections]
    assert labels == ["- TOPICS", "- DECISIONS", "- PENDING", "- USER_INFO"]
    text = result.text
    assert "JWT instead of OAuth2" in sections[1] and "bcrypt" in sections[1]
    assert "token refresh" in sections[2]
    assert "software engineer" in sections[3]
    assert "pytest passed" not in text and "helpful" not in text  # tool and system messages left out
    assert count(text) <= 500
    assert llm.by_prompt == {"sessions.summary": 1}


async def test_english_facts_preferences_and_notes() -> None:
    result = await extract_user_facts(CountingLLM(), prepare_transcript(ENGLISH), 300)
    assert result.outcome == "ok"
    assert {(p.key, p.value) for p in result.facts.preferences} == {
        ("favorite_editor", "Neovim"), ("language", "English"), ("preferred_name", "Sam"),
        ("prefers_answers", "short answers"),
    }
    assert result.facts.notes == ["The user is a software engineer and the user works on a Django project.",
                                  "The user's favourite editor is Neovim."]


async def test_turkish_summary_and_notes_are_in_turkish() -> None:
    llm = CountingLLM()
    closed = await close_segment(llm, segment("trs", TURKISH), [], summary_max_tokens=500, facts_max_tokens=300)
    summary = closed.record.summary
    assert closed.record.language == "tr" and closed.summary.outcome == "ok"
    narrative = summary.split("\n")[0]
    assert narrative.startswith("Konuşma ") and " ve " in narrative and "hakkındaydı." in narrative
    assert "Kullanıcı şunu söyledi:" in narrative and "The user" not in summary
    assert "- DECISIONS: OAuth2 yerine JWT tercih ettim, daha basit; Tamam, JWT kullanacağız" in summary
    assert "- PENDING: Token yenileme henüz yapılmadı, sonra bakacağız" in summary
    assert "- USER_INFO: Ben yazılım mühendisiyim" in summary
    facts = closed.facts.facts
    assert {(p.key, p.value) for p in facts.preferences} == {("language", "Türkçe"), ("favorite_renk", "mavi")}
    assert facts.notes == ["Ben yazılım mühendisiyim ve Django projesi üzerinde çalışıyorum.",
                           "En sevdiğim renk mavi.", "İstanbul'da yaşıyorum."]
    assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}


def test_render_leaves_out_empty_sections_and_cuts_to_the_budget() -> None:
    summary = HybridSessionSummary(narrative="We talked.", topics=["a", "b"], decisions=[], pending=[" "],
                                   user_info=["engineer."])
    assert render_summary(summary, 500) == "We talked.\n- TOPICS: a; b\n- USER_INFO: engineer"
    long = HybridSessionSummary(narrative="word " * 200, topics=[f"topic {i}" for i in range(100)],
                                decisions=["decided " * 30] * 5, pending=["later"] * 3, user_info=["me " * 50])
    for budget in (500, 120, 20):
        text = render_summary(long, budget)
        assert 0 < count(text) <= budget, budget
    assert render_summary(long, 20).endswith("…")


async def test_previous_summaries_are_in_the_prompt() -> None:
    llm = CountingLLM()
    await summarize_session(llm, prepare_transcript(ENGLISH), ["Summary of segment 0.", "Older."], 500, reason="idle")
    assert '["Summary of segment 0.", "Older."]' in llm.prompts[0][1]


async def test_step_failures_are_outcomes_not_exceptions() -> None:
    transcript = prepare_transcript(ENGLISH)
    down = CountingLLM(fail=("sessions.summary", "sessions.facts"))
    summary = await summarize_session(down, transcript, [], 500, reason="token_limit")
    assert (summary.text, summary.source, summary.outcome) == (
        FALLBACK_SUMMARY.format(reason="token limit"), "fallback", "fallback")
    assert summary.text == "Session closed due to token limit (summary unavailable)."  # seed 004, 7
    assert (await extract_user_facts(down, transcript, 300)).outcome == "failed"
    garbage = CountingLLM(garbage=("sessions.summary", "sessions.facts"))
    assert (await summarize_session(garbage, transcript, [], 500, reason="idle")).source == "fallback"
    facts = await extract_user_facts(garbage, transcript, 300)
    assert (facts.outcome, facts.facts.preferences, facts.facts.notes) == ("invalid", [], [])
    unparsable = await extract_user_facts(UnparsableJSONLLM(), transcript, 300)
    assert unparsable.outcome == "invalid"
    nothing = await extract_user_facts(CountingLLM(), [line(1, "user", "What time is it?")], 300)
    assert nothing.outcome == "empty"


async def test_empty_transcript_makes_no_call() -> None:
    llm = CountingLLM()
    closed = await close_segment(llm, segment("empty", TOOL_ONLY, reason="idle"), ["x"], summary_max_tokens=500,
                                 facts_max_tokens=300)
    assert closed.record.summary == EMPTY_SUMMARY.format(reason="inactivity")
    assert (closed.record.summary_source, closed.summary.outcome, closed.facts.outcome) == ("empty", "skipped", "skipped")
    assert llm.by_prompt == {} and closed.llm_calls == 0


async def test_notes_name_the_user_when_the_transcript_does_and_topics_skip_chat_filler() -> None:
    transcript = [
        line(1, "user", "Wow, I'm keen on counseling. I'd love to help. Wow, that's great!"),
        line(2, "assistant", "Wow, painting sounds great! Painting is relaxing."),
        line(3, "user", "Yeah, painting helps me. Wow."),
    ]
    named = [t.model_copy(update={"name": "Caroline" if t.role == "user" else "Mel"}) for t in transcript]
    facts = await extract_user_facts(CountingLLM(), named, 300)
    assert facts.facts.notes == ["Caroline is keen on counseling."]
    summary = await summarize_session(CountingLLM(), named, [], 500, reason="idle")
    topics = next(s for s in summary.text.split("\n") if s.startswith("- TOPICS: "))
    assert "painting" in topics.lower() and "wow" not in topics.lower() and "caroline" not in topics.lower()
    assert "Caroline said: “" in summary.text


class AnsweringLLM(UnparsableJSONLLM):
    """A model that answers the facts prompt with a fixed (partly invented) answer, like the
    0.5B model did: the prompt's example keys, and the assistant's lines as notes about the user."""

    def __init__(self, answer: dict) -> None:
        super().__init__()
        self.answer = answer

    async def generate_response(self, *args, **kwargs) -> dict:  # noqa: ANN002, ANN003
        self.calls += 1
        return self.answer


async def test_facts_the_user_never_said_are_dropped() -> None:
    transcript = [
        line(0, "user", "I prefer dark mode in every editor, and I work as a nurse in Izmir."),
        line(1, "assistant", "You'd be a great counselor! Your empathy will really help people."),
        line(2, "user", "Please answer in Turkish from now on. My C# projects are at work."),
    ]
    llm = AnsweringLLM({
        "preferences": [{"key": "theme", "value": "dark mode"}, {"key": "favorite_color", "value": "blue"},
                        {"key": "language", "value": "Turkish"}, {"key": "preferred_name", "value": "Caroline"},
                        {"key": "stack", "value": "C#"}],
        "notes": ["The user works as a nurse in Izmir.",
                  "You'd be a great counselor with a lot of empathy.",
                  "They are interested in exploring new cultures and knitting."],
    })
    result = await extract_user_facts(llm, transcript, 300)
    assert [(p.key, p.value) for p in result.facts.preferences] == [("theme", "dark mode"), ("language", "Turkish"),
                                                                     ("stack", "C#")]
    assert result.facts.notes == ["The user works as a nurse in Izmir."]
    assert result.ungrounded == 4 and result.outcome == "ok"


async def test_grounding_follows_turkish_inflection() -> None:
    transcript = [line(0, "user", "Ankara'da yazılımcı olarak çalışıyorum ve kahveyi sütsüz içerim.")]
    llm = AnsweringLLM({"preferences": [{"key": "kahve", "value": "sütsüz"}],
                        "notes": ["Kullanıcı Ankara'da yazılımcı olarak çalışıyor."]})
    result = await extract_user_facts(llm, transcript, 300)
    assert result.facts.notes == ["Kullanıcı Ankara'da yazılımcı olarak çalışıyor."]
    assert [p.value for p in result.facts.preferences] == ["sütsüz"] and result.ungrounded == 0
