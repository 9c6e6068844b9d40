"""Issue 11 item 2, end to end: a Turkish conversation ingested offline (turn-detector, rules
extractor, recall over real NATS and FalkorDB) is found by a Turkish question whose words are
inflected otherwise than in the turns (services/recall/lexical.py stems in the group's language)."""

from __future__ import annotations

from schemas import RecallRequest, RecallScopes
from tests.services.recall.test_lexical import TURKISH
from tests.services.recall.test_service import ask, ingest, stack

CONVERSATION_TR = [(t.split(": ", 1)[0], t.split(": ", 1)[1], "Deniz" if t.startswith("user") else None)
                   for t in TURKISH]


async def test_a_turkish_question_finds_the_turkish_turn(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, _):
        ids = await ingest(nc, "tr-1", CONVERSATION_TR)
        # stored: "veritabanı çöktü", "sunucu diski", "kedim ... aşı oldu"; asked otherwise inflected
        for question, message in (("Veritabanının çökmesi ne zaman oldu?", 0), ("Sunucunun diskinde ne vardı?", 4),
                                  ("Kedinin aşısı ne zaman?", 6)):
            response = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(session="tr-1"), max_facts=5))
            assert not response.degraded, response.reason
            turns = [i for i in response.items if i.kind == "episode"]
            assert turns, question
            assert ids[message] in turns[0].provenance[0].message_ids, (question, [t.fact for t in turns])
