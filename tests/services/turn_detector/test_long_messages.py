"""A long message is kept whole, not cut (issue 23, item 6): the turn-detector used to keep
16,000 characters of a message (head and tail) and 48,000 of a turn, so a word in the middle
of a long paste never reached the graph. Real NATS JetStream, the real turn-detector."""

from __future__ import annotations

from tests.services.turn_detector.helpers import close, msg, publish
from tests.services.turn_detector.test_service import _episodes_when, detector, js  # noqa: F401 - fixtures


def _paste(n: int, middle: str) -> str:
    prose = "The deploy pipeline runs the migrations, then the smoke tests, then flips traffic. "
    half = (prose * (n // len(prose) + 1))[: (n - len(middle)) // 2]
    return half + middle + half


async def test_a_50k_character_message_reaches_its_episode_whole(detector, js) -> None:  # noqa: ANN001, F811
    paste = _paste(50_000, " QUOKKAMIDDLE ")
    reply = _paste(60_000, " WOMBATMIDDLE ")  # a turn above the old 48,000-character turn cap too
    await publish(js, msg("long1", "u1", "user", paste, 0))
    await publish(js, msg("long1", "a1", "assistant", reply, 1))
    await close(js, "long1")
    (episode,) = await _episodes_when(js, 1)
    assert episode.content == f"user: {paste}\n\nassistant: {reply}"
    assert "QUOKKAMIDDLE" in episode.content and "WOMBATMIDDLE" in episode.content
    assert "truncated" not in episode.content and episode.stats.reductions == []
