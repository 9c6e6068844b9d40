"""engram.runtime.service.keep_alive: a message worked on longer than the ack wait is not redelivered
while its worker lives, and is redelivered one ack wait after the worker died (so a killed
extractor's episode comes back in seconds, not minutes: bench/chaos.py)."""

from __future__ import annotations

import asyncio
import time

import nats
import nats.errors
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig

from engram.runtime.service import keep_alive


async def _setup(url: str, name: str):  # noqa: ANN202
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name=name, subjects=[f"{name.lower()}.>"]))
    await js.publish(f"{name.lower()}.x", b"work")
    sub = await js.pull_subscribe(f"{name.lower()}.x", durable="w", stream=name,
                                  config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=1.0, max_ack_pending=1))
    return nc, js, sub


async def test_progress_keeps_a_long_job_from_redelivery(clean_nats: str) -> None:
    nc, js, sub = await _setup(clean_nats, "KEEPALIVE_A")
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        beat = keep_alive(msg, 1.0)
        try:
            # three ack waits of work: nobody else gets the message meanwhile
            deadline = time.monotonic() + 3
            while time.monotonic() < deadline:
                try:
                    again = await sub.fetch(1, timeout=0.5)
                except nats.errors.TimeoutError:
                    continue
                raise AssertionError(f"redelivered while in progress: {again}")
        finally:
            beat.cancel()
        await msg.ack()
    finally:
        await nc.close()


async def test_a_dead_workers_message_returns_after_one_ack_wait(clean_nats: str) -> None:
    nc, js, sub = await _setup(clean_nats, "KEEPALIVE_B")
    try:
        (msg,) = await sub.fetch(1, timeout=5)
        beat = keep_alive(msg, 1.0)
        await asyncio.sleep(1.5)
        beat.cancel()  # the worker "dies": no ack, no more progress
        started = time.monotonic()
        (again,) = await sub.fetch(1, timeout=5)
        assert again.data == b"work" and again.metadata.num_delivered == 2
        assert time.monotonic() - started < 2.5
        await again.ack()
    finally:
        await nc.close()
