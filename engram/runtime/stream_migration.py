"""Re-creating ENGRAM_IN and ENGRAM_DELTAS without message schedules (streams made before ENGRAM_SCHED).

Older engram kept the turn-detector's idle schedules in ENGRAM_IN and the summary-gate's refresh
schedules in ENGRAM_DELTAS. nats-server forces ``allow_rollup_hdrs`` on any stream that allows
message schedules, so one publisher's ``Nats-Rollup: all`` header purged every stored message.
The schedules now live in ENGRAM_SCHED (engram/runtime/topology.py), but NATS can neither switch a
stream's schedules off (error 10052) nor let such a stream source another (10187): the two
streams are deleted and created again. :func:`migrate` does it so that nothing is lost:

1. it refuses while a durable of the stream has anything pending or unacknowledged: the stream's
   messages are dropped, so an unprocessed one would be lost (the error says how much is left);
2. it takes the stream's subjects away, so publishers get "no stream" and retry (engram's own do:
   the gateway, ``engram ingest``, the turn-detector), and checks again; if something arrived
   in between, the subjects are put back and it refuses;
3. it copies the stream's pending schedules into ENGRAM_SCHED, aimed at their new fire subjects
   (a schedule copied twice, or fired by both streams, only repeats an idempotent tick);
4. it deletes the stream; the caller then creates it anew, its sequence numbers continuing after
   the old ones (:func:`first_sequence`: the turn-detector's checkpoints compare stream
   sequences, and a checkpoint at or above a new message's sequence would drop it as seen).

Every step can be repeated after a crash: a stream left without subjects still allows schedules,
so the next ``engram up`` or ``engram topology`` finds and finishes it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import StreamConfig

from engram.schemas import subjects
from engram.runtime.kv import current_entries

log = logging.getLogger(__name__)


class LegacyStreamError(RuntimeError):
    """A stream made by an older engram must be re-created and cannot be yet (see the message)."""


@dataclasses.dataclass(frozen=True)
class LegacySchedules:
    """Where an old stream kept its schedules and where each one fires now."""

    stream: str
    schedule_filter: str
    new_target: Callable[[str], str]


def _idle_target(schedule_subject: str) -> str:
    return subjects.sched_idle_fired(schedule_subject.rsplit(".", 1)[-1])  # engram.sched.idle.<session>


def _summary_target(schedule_subject: str) -> str:
    return subjects.sched_summary_fired(schedule_subject.split(".")[3])  # engram.sched.summary.<group>.<node>


LEGACY = (
    LegacySchedules(subjects.STREAM_IN, "engram.sched.idle.*", _idle_target),
    LegacySchedules(subjects.STREAM_DELTAS, "engram.sched.summary.*.*", _summary_target),
)


async def legacy_streams(js: JetStreamContext) -> list[tuple[LegacySchedules, StreamConfig]]:
    """The streams that still allow message schedules, with their current config."""
    found = []
    for legacy in LEGACY:
        try:
            info = await js.stream_info(legacy.stream)
        except nats.js.errors.NotFoundError:
            continue
        if info.config.allow_msg_schedules:
            found.append((legacy, info.config))
    return found


async def _undrained(js: JetStreamContext, stream: str) -> list[str]:
    """What the stream's durables have not handled yet, one line per durable."""
    left = []
    infos = await js.consumers_info(stream)
    for info in infos:
        if not info.config.durable_name:
            continue  # an ephemeral reader (status, a bench): nothing is owed to it
        if info.num_pending or info.num_ack_pending:
            left.append(f"{info.config.durable_name}: {info.num_pending} pending, {info.num_ack_pending} unacknowledged")
    if not any(i.config.durable_name for i in infos):
        state = (await js.stream_info(stream)).state
        if state.messages:
            left.append(f"no durable consumer, {state.messages} stored messages")
    return left


async def _copy_schedules(js: JetStreamContext, legacy: LegacySchedules, first_seq: int) -> int:
    copied = 0
    seq = first_seq
    while True:
        try:
            msg = await js.get_msg(legacy.stream, seq=seq, subject=legacy.schedule_filter, next=True)
        except nats.js.errors.NotFoundError:
            return copied
        assert msg.seq is not None and msg.subject is not None
        seq = msg.seq + 1
        when = (msg.headers or {}).get("Nats-Schedule")
        if not when:
            continue
        await js.publish(
            msg.subject, msg.data or b"",
            headers={"Nats-Schedule": str(when), "Nats-Schedule-Target": legacy.new_target(msg.subject)},
            stream=subjects.STREAM_SCHED,
        )
        copied += 1


async def migrate(js: JetStreamContext, legacy: list[tuple[LegacySchedules, StreamConfig]],
                  schedule_stream: StreamConfig) -> dict[str, int]:
    """Steps 1-4 of the module docstring for the given old streams; returns, per stream, the
    sequence after its last message (the new stream's first is at least that). ENGRAM_SCHED is
    created here, once no old stream claims its subjects any more."""
    for item, _ in legacy:
        left = await _undrained(js, item.stream)
        if left:
            raise LegacyStreamError(
                f"{item.stream} was made by an older engram (it allows message schedules, and so rollup headers: any "
                f"publisher could purge it) and must be re-created, which drops its messages; not all are processed "
                f"yet ({'; '.join(left)}). Run the older engram until `engram status` shows no backlog, then start "
                "again."
            )
    for item, old in legacy:
        if not old.subjects:
            continue  # a run cut short already took them away
        await js.update_stream(dataclasses.replace(old, subjects=[]))
        left = await _undrained(js, item.stream)
        if left:  # published between the check and the update
            await js.update_stream(old)
            raise LegacyStreamError(f"{item.stream} received messages during its migration ({'; '.join(left)}); "
                                    "start again")
    try:
        await js.add_stream(schedule_stream)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != 10058:  # exists already (a run cut short)
            raise
    next_seqs = {}
    for item, _ in legacy:
        state = (await js.stream_info(item.stream)).state
        copied = await _copy_schedules(js, item, state.first_seq)
        await js.delete_stream(item.stream)
        log.warning("re-created %s without message schedules: %s pending schedules moved to %s; its %s processed "
                    "messages were dropped", item.stream, copied, subjects.STREAM_SCHED, state.messages)
        next_seqs[item.stream] = state.last_seq + 1
    return next_seqs


async def first_sequence(js: JetStreamContext, at_least: int = 0) -> int | None:
    """The first sequence for a newly created ENGRAM_IN: above every turn-detector checkpoint's
    ``last_seq`` (a new stream would otherwise restart at 1, and the detector drops a message at
    or below its session's checkpoint as already handled). None when nothing requires more than 1."""
    highest = at_least - 1
    async for _key, value in current_entries(js, subjects.KV_TURN_SESSIONS):
        try:
            last = json.loads(value).get("last_seq", 0)
        except (ValueError, AttributeError):
            continue
        if isinstance(last, int) and last > highest:
            highest = last
    return highest + 1 if highest >= 1 else None
