"""Episodes -> speaker blocks -> sentences: the document every extraction starts from."""

from __future__ import annotations

from datetime import datetime, timezone

from engram.models.rules_llm.episodes import _analyse
from tests.engram.models.rules_llm.helpers import REF


def test_speakers_sentences_and_blocks_of_a_turn() -> None:
    doc = _analyse("user (Caroline): I moved to Boston. I love it!\n\nassistant (Melanie): Wow, nice.", "Jordan: hi", REF)
    assert doc.speakers == ["Caroline", "Melanie"]
    assert [(s.text, s.speaker, s.block) for s in doc.sentences] == [
        ("I moved to Boston.", "Caroline", 0), ("I love it!", "Caroline", 0), ("Wow, nice.", "Melanie", 1),
    ]
    assert doc.n_blocks == 2
    assert doc.known_people == {"caroline", "melanie", "jordan"}  # previous messages teach names too
    assert all(s.reference == REF and s.episode == 0 for s in doc.sentences)


def test_context_episodes_are_never_read_and_headers_date_their_episode() -> None:
    content = (
        "[Episode 0] (timestamp: 2023-05-01T00:00:00+00:00)\nCaroline: I moved to Boston.\n"
        "[CONTEXT EPISODE] (timestamp: 2023-05-02T00:00:00+00:00)\nMelanie: I visited Tokyo.\n"
        "[Episode 1] (timestamp: 2023-05-03T00:00:00+00:00)\nCaroline: I work at Google.\n"
    )
    doc = _analyse(content, None, REF)
    assert [(s.text, s.episode, s.reference) for s in doc.sentences] == [
        ("I moved to Boston.", 0, datetime(2023, 5, 1, tzinfo=timezone.utc)),
        ("I work at Google.", 1, datetime(2023, 5, 3, tzinfo=timezone.utc)),
    ]
    assert doc.speakers == ["Caroline"]


def test_a_code_fence_is_one_code_block_and_not_a_speaker_label() -> None:
    doc = _analyse("user: It fails:\n```\nError: boom\nfile: x.py\n```\nThanks.")
    assert doc.speakers == ["User"]
    assert any(s.code and "Error: boom" in s.text for s in doc.sentences)
    assert all(s.speaker == "User" for s in doc.sentences)
