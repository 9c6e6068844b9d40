"""The session close stage's pure steps (seed 004, 3.2): a closing segment's transcript becomes a
hybrid summary and, independently, the user's preferences and notes.

* :func:`prepare_transcript` -- only user and assistant messages with text (tool and system
  messages and empty ones are dropped, seed step 2).
* :func:`summarize_session` -- one LLM call (prompt ``sessions.summary``, response model
  :class:`HybridSessionSummary`), rendered by engram as 2-4 sentences of narrative plus
  ``- TOPICS: / - DECISIONS: / - PENDING: / - USER_INFO:`` lines (empty sections left out), cut
  to ``max_tokens`` cl100k tokens. The previous summaries of the same memory group are in the
  prompt as context. The model writes in the conversation's language; the section labels stay
  as in the seed. Any failure (the call raises, the answer does not validate, the narrative is
  empty) gives the fixed fallback text (seed 004, 7).
* :func:`extract_user_facts` -- one LLM call (prompt ``sessions.facts``, response model
  :class:`UserFacts`): ``{preferences: [{key, value}], notes: [...]}``. A failed call or an
  answer that does not validate gives no facts, with its outcome.
* :func:`close_segment` -- both at once (``asyncio.gather``); each step catches its own
  failures, so one never blocks the other, and the segment always gets a record. A transcript
  with nothing to summarise makes no LLM call at all (``EMPTY_SUMMARY``).

Prompt contract (also read by engram/models/rules_llm/sessions.py, the offline default): the user
message holds ``<PREVIOUS_SUMMARIES>`` (JSON list of strings, newest first) and ``<TRANSCRIPT>``
(JSON list of ``{"role", "name", "text"}``, oldest first).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.prompts.models import Message
from pydantic import BaseModel, Field

from engram.text.language import detect_language
from engram.models.delegating import innermost
from engram.models.rules_llm import RulesExtractorClient
from engram.text.tokens import CountTokens, token_counter
from engram.schemas.memory import EMPTY_SUMMARY, FALLBACK_SUMMARY, SessionRecord, SessionSegmentClosed, SummarySource, TranscriptLine

log = logging.getLogger("engram.sessions")

SUMMARY_PROMPT = "sessions.summary"
FACTS_PROMPT = "sessions.facts"
SummaryOutcome = Literal["ok", "fallback", "skipped"]
FactsOutcome = Literal["ok", "empty", "failed", "invalid", "skipped"]
LABELS = (("topics", "TOPICS"), ("decisions", "DECISIONS"), ("pending", "PENDING"), ("user_info", "USER_INFO"))
# a real model may write a fact too long to be a preference: such items are dropped, not cut
MAX_KEY_CHARS, MAX_VALUE_CHARS, MAX_NOTE_CHARS = 128, 2000, 4000


class HybridSessionSummary(BaseModel):
    """The model's answer to ``sessions.summary``; engram renders it (:func:`render_summary`)."""

    language: str | None = Field(None, description="ISO 639-1 code of the conversation's language, e.g. en, tr.")
    narrative: str = Field(description="2-4 sentences: the conversation's main thread, its decisions and context.")
    topics: list[str] = Field(default_factory=list, description="Main topics, a few words each.")
    decisions: list[str] = Field(default_factory=list, description="Decisions made in the conversation.")
    pending: list[str] = Field(default_factory=list, description="Open items: what is still to be done.")
    user_info: list[str] = Field(default_factory=list, description="What the user said about themselves.")


class PreferenceFact(BaseModel):
    key: str = Field(description="Short snake_case name of the preference, e.g. language, theme, favorite_color.")
    value: str = Field(description="The preferred value, as the user said it.")


class UserFacts(BaseModel):
    """The model's answer to ``sessions.facts`` (seed 004, 5.2)."""

    preferences: list[PreferenceFact] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list, description="Short notes about the user, in the conversation's language.")


@dataclass(frozen=True)
class SummaryResult:
    text: str
    source: SummarySource
    outcome: SummaryOutcome
    language: str | None = None


@dataclass(frozen=True)
class FactsResult:
    facts: UserFacts
    outcome: FactsOutcome
    ungrounded: int = 0  # preferences and notes dropped: not in what the user said (see _grounded)


@dataclass(frozen=True)
class ClosedSegment:
    record: SessionRecord
    facts: FactsResult
    summary: SummaryResult
    llm_calls: int = 0
    transcript: list[TranscriptLine] = field(default_factory=list)


SUMMARY_SYSTEM = (
    "You summarise a finished chat session between a user and an AI assistant so that the assistant can pick up "
    "the thread in the next session. Write in the language of the conversation. Be factual; state only what the "
    "conversation says."
)
SUMMARY_INSTRUCTIONS = (
    "Summarise the TRANSCRIPT below.\n"
    "- narrative: 2-4 sentences with the main thread of the conversation, its important decisions and context.\n"
    "- topics: the main topics, a few words each.\n"
    "- decisions: decisions that were made (leave empty if none).\n"
    "- pending: what is still open or to be done (leave empty if none).\n"
    "- user_info: what the user said about themselves (job, projects, situation; leave empty if none).\n"
    "- language: the ISO 639-1 code of the conversation's language; write every field in that language.\n"
    "Stay under {max_tokens} tokens in total. PREVIOUS_SUMMARIES (newest first) describe earlier sessions with the "
    "same user: context only, do not repeat them.\n\n"
)
FACTS_SYSTEM = (
    "You extract durable facts about the user from a finished chat session: explicit preferences and short notes "
    "about who the user is and what they work on. Only what the user stated; never guess."
)
FACTS_INSTRUCTIONS = (
    "From the TRANSCRIPT below, extract:\n"
    "- preferences: preferences the user stated explicitly, as {{key, value}} with a snake_case key naming "
    "what the preference is about. Only what the user said; an empty list when the user stated none.\n"
    "- notes: short notes about the user (job, projects, situation), in the conversation's language.\n"
    "Leave a list empty when the conversation states nothing of the kind. Stay under {max_tokens} tokens.\n\n"
)


def prepare_transcript(lines: Sequence[TranscriptLine]) -> list[TranscriptLine]:
    """The messages worth summarising: user and assistant messages with text (seed 3.2, step 2)."""
    return [line for line in lines if line.role in ("user", "assistant") and line.text.strip()]


def _blocks(transcript: Sequence[TranscriptLine], previous: Sequence[str]) -> str:
    lines = [{"role": t.role, "name": t.name, "text": t.text} for t in transcript]
    return (f"<PREVIOUS_SUMMARIES>\n{json.dumps(list(previous), ensure_ascii=False)}\n</PREVIOUS_SUMMARIES>\n\n"
            f"<TRANSCRIPT>\n{json.dumps(lines, ensure_ascii=False)}\n</TRANSCRIPT>")


def summary_messages(transcript: Sequence[TranscriptLine], previous: Sequence[str], max_tokens: int) -> list[Message]:
    return [Message(role="system", content=SUMMARY_SYSTEM),
            Message(role="user", content=SUMMARY_INSTRUCTIONS.format(max_tokens=max_tokens) + _blocks(transcript, previous))]


def facts_messages(transcript: Sequence[TranscriptLine], max_tokens: int) -> list[Message]:
    return [Message(role="system", content=FACTS_SYSTEM),
            Message(role="user", content=FACTS_INSTRUCTIONS.format(max_tokens=max_tokens) + _blocks(transcript, []))]


def _clean(items: Sequence[str], *, item_end: bool = True) -> list[str]:
    """Items with whitespace collapsed, empty and repeated ones dropped; ``item_end``: a closing
    period dropped too (section items are joined with "; ")."""
    out: list[str] = []
    for item in items:
        text = " ".join(str(item).split()).strip(" ;,")
        text = text.rstrip(".") if item_end else text
        if text and text not in out:
            out.append(text)
    return out


def _cut_words(text: str, max_tokens: int, count: CountTokens) -> str:
    """``text`` cut to ``max_tokens`` at a word boundary, ``…`` marking the cut."""
    if count(text) <= max_tokens:
        return text
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:  # the most words that fit with the mark
        mid = (lo + hi + 1) // 2
        if count(" ".join(words[:mid]) + "…") <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + "…" if lo else ""


def render_summary(summary: HybridSessionSummary, max_tokens: int, count: CountTokens | None = None) -> str:
    """The hybrid text: the narrative, then one line per non-empty section, within ``max_tokens``
    cl100k tokens. Over budget, whole section items are dropped from the end (USER_INFO first,
    the narrative last), then the narrative is cut at a word."""
    count = count or token_counter()
    narrative = " ".join(summary.narrative.split())
    sections = [(label, _clean(getattr(summary, name))) for name, label in LABELS]

    def text() -> str:
        lines = [narrative] if narrative else []
        lines += [f"- {label}: {'; '.join(items)}" for label, items in sections if items]
        return "\n".join(lines)

    while count(text()) > max_tokens:
        longest = next((i for i in range(len(sections) - 1, -1, -1) if sections[i][1]), None)
        if longest is None:
            return _cut_words(narrative, max_tokens, count)
        label, items = sections[longest]
        sections[longest] = (label, items[:-1])
    return text()


def _language(code: str | None, transcript: Sequence[TranscriptLine]) -> str | None:
    code = (code or "").strip().casefold()[:2]
    if len(code) == 2 and code.isalpha():
        return code
    return detect_language(t.text for t in transcript)


async def summarize_session(
    llm: LLMClient, transcript: Sequence[TranscriptLine], previous_summaries: Sequence[str], max_tokens: int,
    *, reason: str,
) -> SummaryResult:
    """The hybrid summary of a prepared transcript (never raises: see the module docstring)."""
    if not transcript:
        return SummaryResult(EMPTY_SUMMARY.format(reason=_reason_words(reason)), "empty", "skipped")
    fallback = SummaryResult(FALLBACK_SUMMARY.format(reason=_reason_words(reason)), "fallback", "fallback",
                             detect_language(t.text for t in transcript))
    try:
        answer = await llm.generate_response(
            summary_messages(transcript, previous_summaries, max_tokens), response_model=HybridSessionSummary,
            max_tokens=max_tokens, prompt_name=SUMMARY_PROMPT,
        )
        summary = HybridSessionSummary.model_validate(answer)
    except ValueError:  # ValidationError, or JSON a client could not parse
        log.warning("session summary: the answer did not match HybridSessionSummary; using the fallback text")
        return fallback
    except Exception as exc:  # noqa: BLE001 - best effort: the session closes anyway (seed 004, 7)
        log.warning("session summary failed (%s); using the fallback text", type(exc).__name__)
        return fallback
    text = render_summary(summary, max_tokens)
    if not summary.narrative.strip() or not text:
        log.warning("session summary: the answer had no narrative; using the fallback text")
        return fallback
    # "llm" only when a language model wrote it: the offline rules model is named as such (the
    # agent's context said "summary llm" when no model had run)
    source: SummarySource = "rules" if isinstance(innermost(llm), RulesExtractorClient) else "llm"
    return SummaryResult(text, source, "ok", _language(summary.language, transcript))


# Grounding: a small model copies a prompt's example keys ("favorite_color: blue" from a chat that
# never named a colour) and lists the assistant's lines as notes about the user (measured with
# Qwen2.5-Coder-0.5B, docs/architecture.md). A stored preference is forever in every context, so
# an extracted item is kept only when its words come from the user's own messages: word starts
# of 4 letters (inflection: "works"/"work", "çalışıyorum"/"çalışıyor"), function words aside.
_WORD = re.compile(r"\w+", re.UNICODE)
_FUNCTION_WORDS = frozenset("""
the and but for with that this they them their there what when where which who whom whose your yours
about from into onto over under been being have has had does did doing will would could should shall
user users user's speaker assistant also very really just some such more most much many other than then
kullanıcı kullanıcının bir ve ile için ama gibi daha çok olan olarak bu şu o da de ki mi
""".split())
NOTE_GROUNDED_SHARE = 0.5


def _stems(text: str) -> set[str]:
    out = set()
    for word in _WORD.findall(text.casefold()):
        if word.isdigit():
            out.add(word)
        elif len(word) >= 4 and word not in _FUNCTION_WORDS:
            out.add(word[:4])
    return out


def _grounded(text: str, said: set[str], share: float) -> bool:
    """At least ``share`` of the text's content words (and at least one) start like a word the user said."""
    words = _stems(text)
    return bool(words) and len(words & said) >= max(1, share * len(words))


def _user_said(transcript: Sequence[TranscriptLine]) -> set[str]:
    said: set[str] = set()
    for line in transcript:
        if line.role == "user":
            said |= _stems(line.text) | _stems(line.name or "")
    return said


def grounded_facts(facts: UserFacts, transcript: Sequence[TranscriptLine]) -> tuple[UserFacts, int]:
    """Only the preferences whose value, and the notes of which half the content words, the user's
    own messages say; and how many items were dropped. A preference value with no content word
    of 4+ letters ("C#", "Go", "15"?) is kept when it appears in the user's text as it is."""
    said = _user_said(transcript)
    user_text = " ".join(line.text.casefold() for line in transcript if line.role == "user")
    preferences = [p for p in facts.preferences
                   if _grounded(p.value, said, 0.0) or (not _stems(p.value) and p.value.casefold() in user_text)]
    notes = [n for n in facts.notes if _grounded(n, said, NOTE_GROUNDED_SHARE)]
    dropped = len(facts.preferences) - len(preferences) + len(facts.notes) - len(notes)
    return UserFacts(preferences=preferences, notes=notes), dropped


def _valid_facts(facts: UserFacts) -> UserFacts:
    """Preferences with a key and a value, notes with text, each within the stored limits."""
    seen: dict[str, PreferenceFact] = {}
    for pref in facts.preferences:
        key, value = pref.key.strip(), " ".join(pref.value.split())
        if key and value and len(key) <= MAX_KEY_CHARS and len(value) <= MAX_VALUE_CHARS:
            seen.pop(key, None)
            seen[key] = PreferenceFact(key=key, value=value)  # the last one said wins
    notes = [n for n in _clean(facts.notes, item_end=False) if len(n) <= MAX_NOTE_CHARS]
    return UserFacts(preferences=list(seen.values()), notes=notes)


async def extract_user_facts(llm: LLMClient, transcript: Sequence[TranscriptLine], max_tokens: int) -> FactsResult:
    """Preferences and notes from a prepared transcript (never raises)."""
    if not transcript:
        return FactsResult(UserFacts(), "skipped")
    try:
        answer = await llm.generate_response(
            facts_messages(transcript, max_tokens), response_model=UserFacts, max_tokens=max_tokens,
            prompt_name=FACTS_PROMPT,
        )
        facts, ungrounded = grounded_facts(_valid_facts(UserFacts.model_validate(answer)), transcript)
    except ValueError:  # ValidationError, or JSON a client could not parse (seed 004, 7: invalid JSON)
        log.warning("session facts: the answer did not match UserFacts; no facts from this segment")
        return FactsResult(UserFacts(), "invalid")
    except Exception as exc:  # noqa: BLE001 - best effort (seed 004, 7)
        log.warning("session facts failed (%s); no facts from this segment", type(exc).__name__)
        return FactsResult(UserFacts(), "failed")
    if ungrounded:
        log.info("session facts: %d extracted item(s) not grounded in the user's messages were dropped", ungrounded)
    return FactsResult(facts, "ok" if facts.preferences or facts.notes else "empty", ungrounded)


def _reason_words(reason: str) -> str:
    return {"token_limit": "token limit", "idle": "inactivity", "explicit": "an explicit close",
            "scope_change": "another person speaking"}.get(reason, reason)


async def close_segment(
    llm: LLMClient, event: SessionSegmentClosed, previous_summaries: Sequence[str], *,
    summary_max_tokens: int, facts_max_tokens: int,
) -> ClosedSegment:
    """Both steps for one closing segment, concurrently; always returns the segment's record."""
    transcript = prepare_transcript(event.transcript)
    summary, facts = await asyncio.gather(
        summarize_session(llm, transcript, previous_summaries, summary_max_tokens, reason=event.reason),
        extract_user_facts(llm, transcript, facts_max_tokens),
    )
    record = SessionRecord(
        session_id=event.session_id, segment=event.segment, segment_id=event.segment_id, summary=summary.text,
        summary_source=summary.source, close_reason=event.reason, token_count=event.token_count,
        message_count=event.message_count, opened_at=event.opened_at, closed_at=event.closed_at,
        language=summary.language,
    )
    return ClosedSegment(record, facts, summary, llm_calls=2 if transcript else 0, transcript=transcript)
