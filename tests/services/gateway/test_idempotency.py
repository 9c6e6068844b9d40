"""Idempotency without surprises (issue 23 item 2), over a real socket and real NATS JetStream
with the real turn-detector: a message without uuid or timestamp was hashed from its content
alone, so "yes" in a later request was dropped as a duplicate and the next reply merged into the
previous turn. Now only a retry stores nothing new: an identical request within the retry window
(ENGRAM_GATEWAY_RETRY_WINDOW_S, shortened to 1 s here), or the same Idempotency-Key."""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import subjects
from engram.services.gateway.settings import GatewaySettings
from engram.services.turn_detector import app as td_app
from tests.services.gateway.test_gateway import serve_gateway, stored_messages
from tests.services.turn_detector.helpers import episodes, wait_for

WINDOW_S = 1.0


def pair(group: str, reply: str = "Done.") -> dict:
    return {"group_id": group, "messages": [{"role_type": "user", "role": "Ada", "content": "yes"},
                                            {"role_type": "assistant", "role": "", "content": reply}]}


async def _past_the_window() -> None:
    # the record's per-message TTL is whole seconds; the server removes expired messages promptly
    await asyncio.sleep(WINDOW_S + 1.5)


def _in(group: str, stored) -> list:  # noqa: ANN001
    return [m for m in stored if m.session_id == group]


async def test_the_same_words_in_a_later_request_are_stored_and_a_retry_is_not(clean_nats: str, tmp_path: Path) -> None:
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=1))
    gateway = GatewaySettings(retry_window_s=WINDOW_S, idle_timeout_s=1)
    detector = td_app.build(settings)
    await detector.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        async with serve_gateway(settings, gateway) as http:
            # "yes" + a reply, and later "yes" + another reply: two requests, two turns
            assert (await http.post("/messages", json=pair("g_yes"))).status_code == 202
            await _past_the_window()
            assert (await http.post("/messages", json=pair("g_yes"))).status_code == 202

            # a request retried within the window (a lost 202) stores nothing new
            for _ in range(2):
                assert (await http.post("/messages", json=pair("g_retry"))).status_code == 202

            # the same Idempotency-Key and body is a retry even after the window ...
            keyed = {"Idempotency-Key": '"8e03978e-40d5-43e8-bc93-6894a57f9324"'}
            assert (await http.post("/messages", json=pair("g_key"), headers=keyed)).status_code == 202
            await _past_the_window()
            assert (await http.post("/messages", json=pair("g_key"), headers=keyed)).status_code == 202
            # ... the same key with another body is refused, and stores nothing
            reused = await http.post("/messages", json=pair("g_key", "Something else."), headers=keyed)
            assert reused.status_code == 422 and "Idempotency-Key" in reused.json()["detail"], reused.text
            # another key is another request
            other = {"Idempotency-Key": "second-request"}
            assert (await http.post("/messages", json=pair("g_key"), headers=other)).status_code == 202
            # the same key in another group is that group's own key
            assert (await http.post("/messages", json=pair("g_key2"), headers=keyed)).status_code == 202

        stored = await stored_messages(clean_nats)
        assert [m.content for m in _in("g_yes", stored)] == ["yes", "Done.", "yes", "Done."]
        assert len({m.message_id for m in _in("g_yes", stored)}) == 4
        assert len(_in("g_retry", stored)) == 2
        assert [m.content for m in _in("g_key", stored)] == ["yes", "Done.", "yes", "Done."]
        assert len(_in("g_key2", stored)) == 2

        async def turns_of_g_yes():  # noqa: ANN202
            eps = [e for e in await episodes(js) if e.group_id == "g_yes"]
            return eps if len(eps) >= 2 else None

        eps = await wait_for(turns_of_g_yes, 20) or [e for e in await episodes(js) if e.group_id == "g_yes"]
        assert [[m.role for m in e.messages] for e in eps] == [["user", "assistant"]] * 2, \
            "the second request's reply merged into the first turn"
    finally:
        await nc.close()
        await detector.stop()


async def test_retry_records_are_shared_and_expire(clean_nats: str, tmp_path: Path) -> None:
    """The record is in NATS (every replica and a restarted gateway see it) with the window as
    its TTL: what makes a retry within the window survive a gateway restart."""
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2)
    gateway = GatewaySettings(retry_window_s=WINDOW_S)
    async with serve_gateway(settings, gateway) as first:
        assert (await first.post("/messages", json=pair("g_restart"))).status_code == 202
    async with serve_gateway(settings, gateway) as restarted:  # a new process, no memory of the first
        assert (await restarted.post("/messages", json=pair("g_restart"))).status_code == 202
    assert len(_in("g_restart", await stored_messages(clean_nats))) == 2

    nc = await nats.connect(clean_nats)
    try:
        async def expired() -> bool:
            sub = await nc.jetstream().subscribe(
                f"$KV.{subjects.KV_GATEWAY_REQUESTS}.r.>", stream=f"KV_{subjects.KV_GATEWAY_REQUESTS}",
                ordered_consumer=True, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE))
            try:
                await sub.next_msg(timeout=0.3)
                return False
            except (asyncio.TimeoutError, TimeoutError):
                return True
            finally:
                await sub.unsubscribe()

        assert await wait_for(expired, 10), "the retry record outlived its window"
    finally:
        await nc.close()
