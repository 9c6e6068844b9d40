"""LongMemEval-format input for bench/recall_quality.py (issue 24, item 2).

A LongMemEval file is a JSON list of items, each one question over its own haystack::

    {"question_id", "question_type", "question", "answer",
     "haystack_sessions": [[{"role": "user"|"assistant", "content": str, "has_answer": bool?}, ...], ...],
     "haystack_dates": ["2023/05/20 (Sat) 02:21", ...], "haystack_session_ids": [...],
     "answer_session_ids": [...]}

Each item is one corpus (its haystack, published under ``ScopeKeys(session=False, user=<question_id>)``),
its question's category is ``question_type`` and its evidence is the turns marked ``has_answer``
(questions with none, LongMemEval's abstention items, are left out as LoCoMo's are). Message ids are
``<question_id>:<session id>:<index in the session>``; sessions are published in date order
(a missing or unreadable date keeps the session after the previous one).
"""

from __future__ import annotations

import hashlib
import re
from datetime import datetime, timedelta, timezone
from typing import Any

from engram.schemas import ChatMessage, ScopeKeys
from engram.schemas import SessionClosed

_DATE = re.compile(r"(\d{4})[/-](\d{1,2})[/-](\d{1,2})(?:\D+?(\d{1,2}):(\d{2}))?")
_NOT_ID = re.compile(r"[^A-Za-z0-9_.:@+=/-]")
_NOT_SESSION = re.compile(r"[^a-zA-Z0-9_-]")
EPOCH = datetime(2023, 1, 1, tzinfo=timezone.utc)


def is_longmemeval(data: Any) -> bool:  # noqa: ANN401 - parsed JSON
    """A LongMemEval-format document: a list of items with a question id and haystack sessions."""
    return isinstance(data, list) and bool(data) and all(
        isinstance(item, dict) and "question_id" in item and "haystack_sessions" in item for item in data)


def session_date(text: Any, fallback: datetime) -> datetime:  # noqa: ANN401
    """"2023/05/20 (Sat) 02:21" or "2023-05-20" as UTC; ``fallback`` when unreadable."""
    m = _DATE.search(str(text or ""))
    if not m:
        return fallback
    year, month, day, hour, minute = (int(g) if g else 0 for g in m.groups())
    try:
        return datetime(year, month, day, hour, minute, tzinfo=timezone.utc)
    except ValueError:
        return fallback


def session_key(question_id: str, session_id: str) -> str:
    """An engram session id (``[a-zA-Z0-9_-]{1,128}``) unique to the item: LongMemEval haystacks
    share sessions across items."""
    raw = _NOT_SESSION.sub("_", f"{question_id}-{session_id}")
    return raw if len(raw) <= 128 else raw[:111] + "-" + hashlib.sha256(raw.encode()).hexdigest()[:16]


def longmemeval_item(item: dict, max_sessions: int | None = None) -> tuple[str, list, str, str, frozenset[str]]:
    """(sample id, events to publish, question, category, evidence message ids) of one item; the
    evidence is limited to the messages published."""
    qid = _NOT_ID.sub("_", str(item["question_id"]))
    sessions = item.get("haystack_sessions") or []
    ids = item.get("haystack_session_ids") or [f"s{i}" for i in range(len(sessions))]
    dates = item.get("haystack_dates") or []
    dated, previous = [], EPOCH
    for i, turns in enumerate(sessions):
        when = session_date(dates[i] if i < len(dates) else None, previous + timedelta(days=1))
        previous = when
        dated.append((when, i, str(ids[i]) if i < len(ids) else f"s{i}", turns or []))
    dated.sort(key=lambda s: (s[0], s[1]))
    events: list = []
    evidence: set[str] = set()
    scopes = ScopeKeys(session=False, user=qid)
    for when, _, sid, turns in dated[:max_sessions]:
        session = session_key(qid, sid)
        ts = when
        for n, turn in enumerate(turns):
            ts = ts + timedelta(seconds=1)  # keep order; the dataset only dates sessions
            role = "assistant" if turn.get("role") == "assistant" else "user"
            message_id = _NOT_ID.sub("_", f"{qid}:{sid}:{n}")[:256]
            events.append(ChatMessage(message_id=message_id, session_id=session, role=role,
                                      content=str(turn.get("content", "")), timestamp=ts, scopes=scopes, name=role,
                                      source_description=f"longmemeval {qid} session {sid}"))
            if turn.get("has_answer"):
                evidence.add(message_id)
        events.append(SessionClosed(session_id=session, closed_at=ts, reason="end of LongMemEval session"))
    return qid, events, str(item["question"]), str(item.get("question_type", "unknown")), frozenset(evidence)
