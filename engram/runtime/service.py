"""The small runtime every service shares: broker, middlewares, HTTP side (/metrics, health).

A service module exposes ``build(settings) -> ServiceApp``; ``engram serve NAME`` runs it with
uvicorn, and tests start the same object in-process.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import nats.errors
from nats.js import JetStreamContext

from faststream.asgi import AsgiFastStream, AsgiResponse, get, make_ping_asgi
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus.provider import NatsMetricsSettingsProvider
from faststream.prometheus.middleware import PrometheusMiddleware
from faststream.security import SASLPlaintext
from prometheus_client import REGISTRY, Counter, make_asgi_app

from engram.runtime import slots
from engram.observability import tracing
from engram.compat import stop_fetching
from engram.runtime.group_order import Decision
from engram.settings import EngramSettings

log = logging.getLogger(__name__)

BACKEND_RETRIES = Counter(
    "engram_backend_unavailable_retries_total",
    "Messages redelivered because the graph database could not be reached (they wait, never dead-lettered).",
)


def collapse_subject(subject: str) -> str:
    """Subject -> low-cardinality label: drop partition numbers and session/group tokens.

    engram.in.3.message.s1 -> engram.in.message; engram.episode.g1 -> engram.episode.
    """
    tokens = subject.split(".")
    if tokens[:2] == ["engram", "sched"] and len(tokens) >= 3:
        return f"engram.sched.{tokens[2]}"  # engram.sched.<kind>.<session|group>[.<node>]
    if tokens[:2] == ["engram", "in"] and len(tokens) == 5:
        return f"engram.in.{tokens[3]}"
    if tokens and tokens[0] == "engram" and len(tokens) == 4 and tokens[2].isdigit():
        return f"engram.{tokens[1]}"  # engram.episode.<p>.<group>
    if tokens and tokens[0] == "engram" and len(tokens) >= 3:
        return ".".join(tokens[:-1])
    if tokens and tokens[0].startswith("_INBOX"):  # _INBOX, or a user's own prefix (_INBOX_engram-recall)
        return "_INBOX"
    return subject if len(tokens) <= 2 else ".".join(tokens[:2]) + ".*"


class _CollapsedSubjectProvider(NatsMetricsSettingsProvider):
    __slots__ = ()

    def get_consume_attrs_from_message(self, msg: Any) -> Any:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = collapse_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return collapse_subject(cmd.destination)


def _provider_factory(msg: Any) -> _CollapsedSubjectProvider:
    return _CollapsedSubjectProvider()


async def message_itself(message: Any) -> Any:
    """FastStream decoder that hands the handler the NatsMessage itself.

    Handlers need the raw bytes (to dead-letter them unchanged), the JetStream metadata and
    manual acks. Asking for ``NatsMessage`` through FastStream's context injection runs a sync
    resolver in a worker thread for every message (measured: ~2 thread hops per message), so
    the handler takes one untyped argument and this decoder supplies the message.
    """
    return message


def subscribe_partitions(
    broker: NatsBroker,
    stream: str,
    consumers: Sequence[Any],
    handler: Callable[[Any], Awaitable[None]],
    *,
    title: str,
) -> None:
    """One pull subscriber per partition durable (``consumers``: nats ConsumerConfig objects
    with durable_name and filter_subject), one message at a time, manual acks, and the handler
    receiving the NatsMessage itself (see :func:`message_itself`)."""
    js_stream = JStream(name=stream, declare=False)
    for p, config in enumerate(consumers):
        _partition_subscriber(broker, js_stream, config, f"{title} partition {p}")(handler)


def _partition_subscriber(broker: NatsBroker, js_stream: JStream, config: Any, title: str) -> Any:
    """The FastStream pull subscriber of one partition durable: one message at a time, manual
    acks, the handler receiving the NatsMessage itself."""
    # FastStream hands pull subscriptions its own default inbox prefix, not the connection's: give
    # it the service's (ENGRAM_NATS_INBOX_PREFIX), the only inboxes a service's NATS user may read.
    prefix = _INBOX_PREFIXES.get(broker)
    return broker.subscriber(
        config.filter_subject,
        stream=js_stream,
        durable=config.durable_name,
        config=config,
        pull_sub=PullSub(batch_size=1, timeout=5.0),
        ack_policy=AckPolicy.MANUAL,
        decoder=message_itself,
        title=title,
        **({"inbox_prefix": f"{prefix}.".encode()} if prefix else {}),
    )


def keep_alive(msg: Any, ack_wait_s: float) -> asyncio.Task:
    """Tell the server every ``ack_wait_s / 3`` that ``msg`` is still being worked on (an LLM call
    may outlast the ack wait); cancel the task when done. This is what lets the ack wait stay
    short: a message whose worker was killed is redelivered after ``ack_wait_s``, not minutes."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(ack_wait_s / 3)
            try:
                await msg.in_progress()
            except Exception:  # noqa: BLE001 - connection down: the next beat (or ack_wait) decides
                log.debug("in_progress failed", exc_info=True)

    return asyncio.create_task(beat(), name="keep-alive")


BACKEND_RETRY_MAX_DELAY_S = 10.0
"""Longest wait between two deliveries of a message whose backend was down: small, so the work
resumes within seconds of the graph database coming back."""


def backend_unavailable(exc: BaseException) -> bool:
    """The graph database (engram's own storage) could not be reached: a connection refused or
    reset, a socket timeout, no free pool connection, Neo4j unavailable. Such a message is not
    poison; it waits for the backend instead of being dead-lettered (a 30 s FalkorDB outage used to
    dead-letter the head episode of each busy partition: bench/chaos.py)."""
    import redis.exceptions

    kinds: tuple[type[BaseException], ...] = (
        redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionRefusedError, ConnectionResetError,
        BrokenPipeError,
    )
    try:
        import neo4j.exceptions

        kinds += (neo4j.exceptions.ServiceUnavailable, neo4j.exceptions.SessionExpired)
    except ImportError:  # pragma: no cover - a declared dependency
        pass
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:  # graphiti may wrap the driver's error
        if isinstance(current, kinds):
            return True
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return False


async def retry_or_dead_letter(
    msg: Any,
    exc: BaseException,
    *,
    max_deliveries: int,
    dead_letter: Callable[[str, str], Awaitable[None]],
    logger: logging.Logger,
    base_delay_s: float = 1.0,
    max_delay_s: float = 60.0,
) -> bool:
    """The shared failure tail of a handler: nack with an exponential delay (a plain nak would
    redeliver in a hot loop), or, at ``max_deliveries``, dead-letter with reason
    ``processing_failed`` and ack. Returns True when the message was dead-lettered.
    An exception with a ``dead_letter_reason`` attribute (e.g. engram.models.openai_compat
    ``LLMOutputTruncated``) is one a redelivery cannot fix: dead-lettered at once with that
    reason, its message (written to carry no content) in the detail. One with a ``failure_reason``
    (``LLMUnavailable``: ``llm_unavailable``, ``LLMOutputInvalid``: ``llm_output_invalid``) is
    retried like any other, and dead-lettered with that reason and its message.
    A :func:`backend_unavailable` failure is never dead-lettered: it is redelivered (at most
    BACKEND_RETRY_MAX_DELAY_S apart) until the graph database answers again.
    Only the exception type is logged: messages may carry user content."""
    meta = msg.raw_message.metadata
    seq, delivered = meta.sequence.stream, meta.num_delivered
    decision = failure_decision(exc, delivered, max_deliveries=max_deliveries, logger=logger, seq=seq,
                                base_delay_s=base_delay_s, max_delay_s=max_delay_s)
    if decision.retry:
        await msg.nack(delay=decision.delay_s)
        return False
    await dead_letter(decision.reason, decision.detail)
    await msg.ack()
    return True


def failure_decision(
    exc: BaseException,
    attempt: int,
    *,
    max_deliveries: int,
    logger: logging.Logger,
    seq: int | None = None,
    base_delay_s: float = 1.0,
    max_delay_s: float = 60.0,
) -> Decision:
    """The policy of :func:`retry_or_dead_letter` for the ``attempt``-th failure of a message:
    retry after an exponential delay, or dead-letter (see there). Also used by
    :class:`engram.runtime.group_order.GroupOrder`, which counts attempts itself."""
    final_reason = getattr(exc, "dead_letter_reason", None)
    if not final_reason and backend_unavailable(exc):
        BACKEND_RETRIES.inc()
        logger.warning("graph backend unavailable; retrying seq=%s (attempt %s): %s", seq, attempt,
                       type(exc).__name__)
        return Decision(True, min(BACKEND_RETRY_MAX_DELAY_S, base_delay_s * 2 ** (min(attempt, 10) - 1)))
    if attempt >= max_deliveries or final_reason:
        logger.error("giving up on seq=%s after %s deliveries: %s", seq, attempt, type(exc).__name__)
        named = final_reason or getattr(exc, "failure_reason", None)
        detail = f"{type(exc).__name__} after {attempt} deliveries" + (f": {exc}" if named else "")
        return Decision(False, reason=named or "processing_failed", detail=detail)
    logger.warning("retrying seq=%s (attempt %s): %s", seq, attempt, type(exc).__name__,
                   exc_info=logger.isEnabledFor(logging.DEBUG))
    return Decision(True, min(max_delay_s, base_delay_s * 2 ** (min(attempt, 30) - 1)))


class CapacityPuller:
    """Pulls from a set of partition durables only when this replica can start the work at once.

    Why: with :func:`subscribe_partitions` every replica keeps a pull request open on every
    partition durable whether or not it has a free slot, and the server hands a partition's next
    message to whichever request came first. A message that lands on a busy replica waits there
    for capacity while holding its partition's only ack slot (``max_ack_pending=1``), and another
    replica idles. Measured by bench/scale_out.py (defaults: 16 groups x 5 episodes, 200 ms
    simulated LLM, 3 rounds, 2 shared cores), 4 vs 1 extractor replicas: 2.87x at
    extractor_concurrency=1 and 1.91x at 4 when the bench was written; rerun next to this puller:
    3.21x and 1.69x, with 134 s and 11 s (summed) of pulled episodes waiting for capacity. With
    this puller: 3.68x (wall 11.3 s, perfect scheduling 10.9 s) and 2.06x (5.7 s vs 5.5 s: at
    concurrency 4, 16 slots for 16 groups, the busiest group's chain is the floor), 0 s waiting,
    0 order violations, 0 redeliveries. Idle cost: ~70 pull requests/s and ~2% of a core per
    replica with 16 partitions and ``idle_max_s=0.2``.

    How: ``capacity`` slots and one loop per replica. The loop waits for a free slot, then asks
    the partitions for one message each, round-robin from a rotating start (random at first, then
    the partition after the last one served), with a one-shot pull request
    ``{"batch": 1, "no_wait": true, "expires": probe_expires_s}``. The server answers at once with
    a message when the partition has one it may deliver, and otherwise with a 404/408 status after
    at most ``probe_expires_s`` (about 1.5 ms per empty or busy partition at the 1 ms default).
    At most one request is outstanding per replica, only while a slot is free for it, and it is
    never abandoned before the server's final answer, so every delivered message starts at once:
    no message waits on a full replica while holding its partition.

    ``expires`` is not optional: nats-server 2.15 queues a ``no_wait`` request *without* expires
    on a partition that has messages but whose ack slot is taken (another replica is working on
    it) until the slot frees, then delivers to it: a capacity-blind long poll again. With expires
    it ends after ``probe_expires_s``.

    Idle: when a sweep finds nothing, the loop waits ``idle_min_s``, doubling up to
    ``idle_max_s`` (the bound on the latency it adds), or less when kicked: a slot frees (its
    partition may have more), or a message arrives on the optional ``wake_subject``, a core-NATS
    subscription on the subjects publishers use (e.g. ``engram.episode.*``; note: it receives the
    payloads too). Redeliveries (delayed nacks, expired ack_wait) send no wake-up: the bounded
    polling picks them up.

    Stalled work: a task whose model call hangs may hand its slot on (:mod:`engram.runtime.slots`): the loop pulls into it at once and the stalled task finishes
    outside the count. At most ``capacity`` slots are lent at once.

    Stop (:meth:`stop`): no new pulls; the outstanding request (if any) is answered within
    ``probe_expires_s`` and a message it brings is handled like the others; work in flight gets
    ``grace_s`` to finish, then is cancelled and nacked without delay so another replica takes it
    at once (its delivery count grows by one, as for any redelivery).

    ``consume(partition, msg)`` receives the nats-py ``Msg`` and must ack/nack it (manual acks);
    the handler's own retry policy is untouched. A message delivered with no request waiting
    for it (the reply of a request given up after ``reply_timeout_s``, e.g. across a reconnect)
    is handled too, outside the slot count, rather than left to wait for ack_wait.
    """

    def __init__(
        self,
        stream: str,
        durables: Sequence[str],
        consume: Callable[[int, Any], Awaitable[None]],
        *,
        capacity: int,
        name: str = "puller",
        probe_expires_s: float = 0.001,
        idle_min_s: float = 0.005,
        idle_max_s: float = 0.1,
        wake_subject: str | None = None,
        reply_timeout_s: float = 5.0,
        api_prefix: str = "$JS.API",
    ) -> None:
        if capacity < 1 or not durables:
            raise ValueError("CapacityPuller needs capacity >= 1 and at least one durable")
        self.stream = stream
        self.durables = list(durables)
        self.capacity = capacity
        self.name = name
        self.probe_expires_s = probe_expires_s
        self.idle_min_s = idle_min_s
        self.idle_max_s = idle_max_s
        self.wake_subject = wake_subject
        self.reply_timeout_s = reply_timeout_s
        self._consume = consume
        self._next_subjects = [f"{api_prefix}.CONSUMER.MSG.NEXT.{stream}.{d}" for d in self.durables]
        self._request = json.dumps(
            {"batch": 1, "no_wait": True, "expires": max(1, int(probe_expires_s * 1e9))}
        ).encode()
        self._nc: Any = None
        self._subs: list[Any] = []
        self._inbox = ""
        self._seq = 0
        self._partition_of = {d: p for p, d in enumerate(self.durables)}
        self._waiting: dict[int, tuple[str, asyncio.Future[Any]]] = {}  # partition -> (reply subject, answer)
        self._free = capacity
        self._lent = 0  # slots handed on by stalled work (engram/runtime/slots.py), at most ``capacity``
        self._tasks: set[asyncio.Task[None]] = set()
        self._kick = asyncio.Event()
        self._stopping = False
        self._loop_task: asyncio.Task[None] | None = None
        self._next = 0
        # observable counters (tests, benchmarks)
        self.probes = 0
        self.delivered = 0
        self.unsolicited = 0
        self.lent = 0

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    async def start(self, nc: Any) -> None:
        """Subscribe the reply inbox (and the wake subject), then start the pull loop."""
        if self._loop_task is not None:
            return
        self._nc = nc
        self._stopping = False
        self._inbox = nc.new_inbox()
        self._subs.append(await nc.subscribe(f"{self._inbox}.>", cb=self._on_reply))
        if self.wake_subject:
            self._subs.append(await nc.subscribe(self.wake_subject, cb=self._on_wake))
        self._next = random.randrange(len(self.durables))  # replicas start their rounds apart
        self._loop_task = asyncio.create_task(self._run(), name=f"{self.name} pull loop")

    async def stop(self, grace_s: float = 15.0) -> None:
        """Stop pulling; in-flight work gets ``grace_s`` to finish, the rest is nacked."""
        self._stopping = True
        self._kick.set()
        if self._loop_task is not None:
            try:
                await self._loop_task
            except Exception:  # noqa: BLE001 - logged; stopping anyway
                log.exception("%s: pull loop failed", self.name)
            self._loop_task = None
        if self._tasks:
            _, pending = await asyncio.wait(set(self._tasks), timeout=grace_s)
            if pending:
                log.warning("%s: %d message(s) still in flight after %.1fs: nacked for redelivery",
                            self.name, len(pending), grace_s)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # noqa: BLE001 - connection already gone
                pass
        self._subs.clear()
        if self._nc is not None and self._nc.is_connected:
            try:
                await self._nc.flush(timeout=2)  # the naks above are on the wire before the broker closes
            except Exception:  # noqa: BLE001
                pass

    # --- loop ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._stopping:
            try:
                await self._pull_loop()
            except Exception:  # noqa: BLE001 - a bug here must not end pulling for good
                log.exception("%s: pull loop failed; restarting it", self.name)
                await self._wait_kick(self.idle_max_s)

    async def _pull_loop(self) -> None:
        backoff = self.idle_min_s
        while not self._stopping:
            if self._free <= 0:
                self._kick.clear()
                if self._free <= 0 and not self._stopping:
                    await self._kick.wait()  # a slot frees (or stop)
                continue
            if not self._nc.is_connected:
                await self._wait_kick(self.idle_max_s)
                continue
            self._kick.clear()  # before the sweep: a kick during the sweep means "look again"
            try:
                found = await self._sweep()
            except (nats.errors.ConnectionClosedError, nats.errors.ConnectionReconnectingError,
                    nats.errors.OutboundBufferLimitError) as exc:
                log.debug("%s: pull request not sent: %s", self.name, type(exc).__name__)
                found = None
            if found is not None:
                backoff = self.idle_min_s
                self._dispatch(*found, slot=True)
                continue
            kicked = await self._wait_kick(backoff)
            backoff = self.idle_min_s if kicked else min(backoff * 2, self.idle_max_s)

    async def _wait_kick(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._kick.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def _sweep(self) -> tuple[int, Any] | None:
        n = len(self.durables)
        for i in range(n):
            if self._stopping:
                return None
            p = (self._next + i) % n
            msg = await self._pull(p)
            if msg is not None:
                self._next = (p + 1) % n
                return p, msg
        return None

    async def _pull(self, p: int) -> Any | None:
        """One pull request on partition ``p``; returns its message or None, only once the
        server has answered (or after ``reply_timeout_s``: a late message is then unsolicited)."""
        self._seq += 1
        reply = f"{self._inbox}.{p}.{self._seq}"
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting[p] = (reply, fut)
        self.probes += 1
        try:
            await self._nc.publish(self._next_subjects[p], self._request, reply=reply)
            return await asyncio.wait_for(fut, self.probe_expires_s + self.reply_timeout_s)
        except asyncio.TimeoutError:
            log.warning("%s: no answer to a pull on %s within %.1fs", self.name, self.durables[p],
                        self.probe_expires_s + self.reply_timeout_s)
            return None
        finally:
            if self._waiting.get(p, (None, None))[1] is fut:
                del self._waiting[p]

    async def _on_reply(self, msg: Any) -> None:
        status = msg.headers.get("Status") if msg.headers else None
        if status == "100":  # idle heartbeat / flow control: not an answer
            return
        if status:
            # Status messages come on the request's own reply subject: <inbox>.<partition>.<seq>.
            try:
                p = int(msg.subject.rsplit(".", 2)[-2])
            except (ValueError, IndexError):
                return
            if status not in ("404", "408"):
                log.debug("%s: pull on %s answered %s %s", self.name, self.durables[p], status,
                          msg.headers.get("Description", ""))
            reply, fut = self._waiting.get(p, (None, None))
            if reply == msg.subject and fut is not None and not fut.done():
                fut.set_result(None)
            return  # else: the late answer of a request given up on
        # A message keeps its stream subject; its ack subject names the consumer.
        try:
            p = self._partition_of[msg.metadata.consumer]
        except Exception:  # noqa: BLE001 - not a JetStream delivery of ours
            log.error("%s: delivery from an unknown consumer (%s): nacked", self.name, msg.reply)
            await self._give_back(msg)
            return
        self.delivered += 1
        _, fut = self._waiting.get(p, (None, None))
        if fut is not None and not fut.done():
            fut.set_result(msg)
            return
        # The answer to a request nobody waits for any more: it holds its partition's ack slot,
        # so handle it now (outside the slot count) rather than let it wait for ack_wait.
        self.unsolicited += 1
        log.warning("%s: unsolicited delivery on %s", self.name, self.durables[p])
        self._dispatch(p, msg, slot=False)

    async def _on_wake(self, msg: Any) -> None:
        self._kick.set()

    # --- work ----------------------------------------------------------------------------
    def _dispatch(self, p: int, msg: Any, *, slot: bool) -> None:
        if slot:
            self._free -= 1
        task = asyncio.create_task(self._work(p, msg, slot), name=f"{self.name} p{p}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _lend(self) -> bool:
        """A stalled piece of work hands its slot on (engram/runtime/slots.py), up to ``capacity`` at once."""
        if self._lent >= self.capacity:
            return False
        self._lent += 1
        self._free += 1
        self.lent += 1
        self._kick.set()
        return True

    async def _work(self, p: int, msg: Any, slot: bool) -> None:
        held = slots.Slot(self._lend) if slot else None
        slots.CURRENT.set(held)  # this task's own context: the work may lend it (engram/runtime/slots.py)
        try:
            if self._stopping and not slot:
                await self._give_back(msg)
                return
            await self._consume(p, msg)
        except asyncio.CancelledError:
            await self._give_back(msg)  # stop(): past the grace period
            raise
        except Exception:  # noqa: BLE001 - consume failed outside the handler's own policy
            log.exception("%s: consuming a message of %s failed", self.name, self.durables[p])
            await self._give_back(msg)
        finally:
            if held is not None:
                if held.held:
                    self._free += 1
                else:
                    self._lent -= 1  # its slot was handed on when it stalled: already counted free
            self._kick.set()

    @staticmethod
    async def _give_back(msg: Any) -> None:
        """Nack without delay unless the handler already acked or nacked it."""
        try:
            await msg.nak()
        except nats.errors.MsgAlreadyAckdError:
            pass
        except Exception:  # noqa: BLE001 - connection gone: ack_wait redelivers it
            log.debug("nak failed", exc_info=True)


def subscribe_partitions_with_capacity(
    broker: NatsBroker,
    stream: str,
    consumers: Sequence[Any],
    handler: Callable[[Any], Awaitable[None]],
    *,
    title: str,
    capacity: int,
    **puller_options: Any,
) -> CapacityPuller:
    """:func:`subscribe_partitions`, but messages are pulled by a :class:`CapacityPuller` (only
    when one of ``capacity`` slots is free) instead of FastStream's per-subscriber fetch loop.

    One FastStream pull subscriber per partition durable is still registered (same subject,
    durable, config, manual acks, :func:`message_itself` decoder, AsyncAPI entry), but never
    fetches: the puller hands each message to its partition's ``subscriber.consume``, so the
    broker middlewares (engram_faststream_* Prometheus metrics, OpenTelemetry context from the
    message headers) and the handler run exactly as before. Only FastStream's fetch loop is
    replaced. The caller starts the puller after the broker (``await puller.start(nc)``) and
    stops it before the broker (``await puller.stop(grace_s)``).
    """
    js_stream = JStream(name=stream, declare=False)
    subscribers: list[Any] = []
    for p, config in enumerate(consumers):
        subscriber = _partition_subscriber(broker, js_stream, config, f"{title} partition {p}")
        subscriber(handler)
        stop_fetching(subscriber)  # the CapacityPuller fetches (engram/compat.py)
        subscribers.append(subscriber)

    async def consume(p: int, msg: Any) -> None:
        subscriber = subscribers[p]
        if not subscriber.running:  # consume() would drop it silently
            raise RuntimeError(f"{title} partition {p}: subscriber not running")
        await subscriber.consume(msg)

    return CapacityPuller(stream, [c.durable_name for c in consumers], consume, capacity=capacity,
                          name=title, **puller_options)


def start_pulling(broker: NatsBroker, puller: CapacityPuller) -> Callable[[], Awaitable[None]]:
    """The ``after_startup`` hook of a service that pulls with ``puller``: starts it on the
    broker's connection once the broker's (non-fetching) subscribers run. The service stops it
    itself, before whatever its in-flight work still uses (graph drivers) is closed."""

    async def start() -> None:
        await puller.start(broker.connection)

    return start


def jetstream(broker: NatsBroker) -> JetStreamContext:
    """A JetStream context on the broker's connection (FastStream's public ``broker.connection``;
    raises FastStream's IncorrectState before the broker connected)."""
    return broker.connection.jetstream()


def make_broker(settings: EngramSettings, *, service: str) -> NatsBroker:
    middlewares: list[Any] = [
        PrometheusMiddleware(
            settings_provider_factory=_provider_factory,
            registry=REGISTRY,
            app_name=service,
            metrics_prefix="engram_faststream",
        )
    ]
    tracer_provider = _tracer_provider(settings, service)
    if tracer_provider is not None:
        middlewares.insert(0, NatsTelemetryMiddleware(tracer_provider=tracer_provider, include_messages_counters=False))
    options = settings.nats_options()
    if "user" in options:  # FastStream takes a user and password as `security` (inbox_prefix as is)
        options["security"] = SASLPlaintext(username=options.pop("user"), password=options.pop("password"))
    broker = NatsBroker(
        settings.nats_servers(),
        middlewares=middlewares,
        name=f"engram-{service}",
        max_reconnect_attempts=-1,
        log_level=logging.DEBUG,
        **options,
    )
    if options.get("inbox_prefix"):
        _INBOX_PREFIXES[broker] = options["inbox_prefix"]
    return broker


_INBOX_PREFIXES: "weakref.WeakKeyDictionary[NatsBroker, str]" = weakref.WeakKeyDictionary()


async def flush_tracing() -> None:
    """Export buffered spans and stop exporters (called when a service stops)."""
    tracing.shutdown()


def _tracer_provider(settings: EngramSettings, service: str) -> Any | None:
    """OTLP/HTTP tracing when ENGRAM_OTEL_ENDPOINT is set; off (no provider) otherwise (engram/observability/tracing.py)."""
    return tracing.provider_for(settings.otel_endpoint, service)


@dataclass
class ServiceApp:
    """A service: its broker, ASGI app and lifecycle hooks."""

    name: str
    broker: NatsBroker
    on_startup: Sequence[Callable[[], Awaitable[None]]] = ()
    after_startup: Sequence[Callable[[], Awaitable[None]]] = ()
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = ()
    extra_routes: Sequence[tuple[str, Any]] = field(default_factory=tuple)

    async def start(self) -> None:
        """Start in-process (tests, benchmarks): hooks, then the broker's subscribers."""
        for hook in self.on_startup:
            await hook()
        await self.broker.start()
        for hook in self.after_startup:
            await hook()

    async def stop(self) -> None:
        for hook in self.on_shutdown:
            await hook()
        await self.broker.stop()
        tracing.shutdown(self.name)  # this service's spans (others in the process keep tracing)

    def asgi(self) -> AsgiFastStream:
        @get(include_in_schema=False)
        async def live(scope: Any) -> AsgiResponse:
            return AsgiResponse(b'{"status":"ok"}', 200, headers={"content-type": "application/json"})

        return AsgiFastStream(
            self.broker,
            asgi_routes=[
                ("/metrics", make_asgi_app(REGISTRY)),
                ("/healthz", live),
                ("/readyz", make_ping_asgi(self.broker, timeout=2.0)),
                *self.extra_routes,
            ],
            on_startup=list(self.on_startup),
            after_startup=list(self.after_startup),
            on_shutdown=list(self.on_shutdown),
            after_shutdown=[flush_tracing],
            asyncapi_path="/asyncapi",
        )


ENGRAM_LOGGERS = ("engram", "services", "schemas")
"""engram's own loggers: they never log message content, at any level."""


def configure_logging(level: str) -> None:
    """``level`` for engram's own loggers; third-party libraries log at INFO at the most, because
    their DEBUG lines carry message content (sse_starlette logs every MCP response body, the MCP
    SDK and graphiti-core log requests and extracted names): tests/services/test_secrets_at_rest.py
    runs every door at DEBUG and greps the logs."""
    wanted = logging.getLevelName(level.upper())
    logging.basicConfig(
        level=max(wanted, logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    for name in ENGRAM_LOGGERS:
        logging.getLogger(name).setLevel(wanted)
    # FastStream logs every message at INFO with its subject (which holds session ids): keep it quiet.
    logging.getLogger("faststream").setLevel(max(logging.WARNING, wanted))
    log.debug("engram logs at %s; third-party libraries at INFO at the most (their DEBUG lines carry content)",
              level.upper())
