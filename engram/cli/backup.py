"""``engram backup`` / ``engram restore`` (issue 26, item 5): a running stack's memory, consistent
across NATS JetStream and the graph, into a directory, and back into a fresh data dir.

A backup directory::

    manifest.json                 format, time, the streams and groups it holds
    jetstream/<stream>.json       the stream's config and state at the snapshot (the server's answer)
    jetstream/<stream>.snapshot   the server's own snapshot: messages and consumers (their acks)
    graph/<n>.jsonl               one group's graph, as ``engram export`` writes it (engram/graph/export.py)

**Consistent with each other.** Every stream (the input, the episodes, deltas, sessions, the KV
buckets: turn state, epochs) is snapshotted first, with its consumers, through JetStream's own
snapshot API ($JS.API.STREAM.SNAPSHOT: the state a server restores exactly); the graph is read
after. So whatever a consumer had acknowledged in the snapshot is in the graph, and whatever was
still pending is redelivered after a restore and processed again -- which engram's pipeline does
idempotently by design (deterministic episode ids: an episode found in the graph is not
extracted again; deltas and turns carry their dedupe ids). The graph may also hold a little
more than the snapshot's acks (work done between the two reads): that is memory kept, not lost.
No service has to pause.

**Restore** writes into a data dir with no stack running and no memory yet: it starts the dir's
own NATS and FalkorDB (as ``engram up`` does, with its passwords), recreates each stream from its
snapshot ($JS.API.STREAM.RESTORE, in place of the empty one ``up`` made), imports each group's
graph (idempotent MERGEs), and stops them; the next ``engram up`` carries on where the backup
was taken. A dir that already holds memory is refused (a restore never merges two memories).

Partial: the graph part reads FalkorDB only (as ``engram export``): with ENGRAM_GRAPH_BACKEND=neo4j
the command refuses, and a Neo4j graph is backed up with Neo4j's own ``neo4j-admin database
dump`` (a streams-only backup is not offered). A restore into an external stack (ENGRAM_NATS_URL
set) needs that stack's services stopped, which this command cannot check.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from engram.graph.export import ExportError, export_lines, import_lines
from engram.settings import EngramSettings
from engram.schemas import subjects

FORMAT = "engram.backup/1"
SNAPSHOT_API = "$JS.API.STREAM.SNAPSHOT.{}"
RESTORE_API = "$JS.API.STREAM.RESTORE.{}"
CHUNK_BYTES = 128 * 1024
SNAPSHOT_TIMEOUT_S = 300.0
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_-]{1,255}$")


class BackupError(RuntimeError):
    """A backup or restore that cannot go on (the message says which part and why)."""


# Upstream first: a stage publishes downstream before it acks upstream, so a message acked in an
# earlier snapshot has its output in a later one (or, consumed there too, in the graph read last).
# The turn-detector: ENGRAM_IN -> its KV state and schedules -> ENGRAM_EPISODES and ENGRAM_SESSIONS;
# the extractor: -> ENGRAM_DELTAS; the summary-gate: -> ENGRAM_SUMMARY; dead letters from all.
PIPELINE_ORDER: tuple[str, ...] = (
    subjects.STREAM_IN, f"KV_{subjects.KV_TURN_SESSIONS}", f"KV_{subjects.KV_SESSION_EPOCHS}", subjects.STREAM_SCHED,
    f"KV_{subjects.KV_GATEWAY_REQUESTS}", subjects.STREAM_SESSIONS, subjects.STREAM_EPISODES,
    f"KV_{subjects.KV_GROUP_ORDER}", subjects.STREAM_DELTAS, subjects.STREAM_SUMMARY, subjects.STREAM_DLQ,
)


def snapshot_order(names: list[str]) -> list[str]:
    """``names`` upstream first (:data:`PIPELINE_ORDER`), any other stream after them by name."""
    rank = {name: i for i, name in enumerate(PIPELINE_ORDER)}
    return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


@dataclass
class BackupReport:
    directory: Path
    streams: dict[str, int] = field(default_factory=dict)
    """stream -> messages in it at the snapshot"""
    groups: dict[str, int] = field(default_factory=dict)
    """group -> lines of its graph export (nodes and relationships)"""


def _api_error(reply: dict[str, Any]) -> str | None:
    error = reply.get("error")
    return f"{error.get('description', 'error')} ({error.get('err_code', error.get('code'))})" if error else None


async def snapshot_stream(nc: Any, stream: str, path: Path, timeout_s: float = SNAPSHOT_TIMEOUT_S) -> dict[str, Any]:
    """The server's snapshot of ``stream`` (messages and consumers) into ``path``; returns its
    config and state. Chunks arrive on an inbox; each one that asks for it is acknowledged (the
    server's flow control); an empty message ends it, with an error status if it failed."""
    inbox = nc.new_inbox()
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    with path.open("wb") as out:
        async def on_chunk(msg: Any) -> None:
            if done.done():
                return
            if not msg.data:
                status = (msg.headers or {}).get("Status")
                if status and status not in ("204", "200"):
                    done.set_exception(BackupError(
                        f"stream {stream}: the snapshot failed ({status} {(msg.headers or {}).get('Description', '')})"))
                else:
                    done.set_result(None)
                return
            out.write(msg.data)
            if msg.reply:
                await nc.publish(msg.reply, b"")

        sub = await nc.subscribe(inbox, cb=on_chunk)
        try:
            request = {"deliver_subject": inbox, "no_consumers": False, "chunk_size": CHUNK_BYTES}
            reply = json.loads((await nc.request(SNAPSHOT_API.format(stream), json.dumps(request).encode(),
                                                 timeout=30)).data)
            if (why := _api_error(reply)) is not None:
                raise BackupError(f"stream {stream}: no snapshot ({why})")
            await asyncio.wait_for(done, timeout_s)
        finally:
            await sub.unsubscribe()
    return {"config": reply["config"], "state": reply["state"]}


async def restore_stream(nc: Any, meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """Recreate a stream from its snapshot (the stream must not exist); returns its info."""
    stream = meta["config"]["name"]
    reply = json.loads((await nc.request(RESTORE_API.format(stream), json.dumps(meta).encode(), timeout=30)).data)
    if (why := _api_error(reply)) is not None:
        raise BackupError(f"stream {stream}: the server refused the restore ({why})")
    deliver = reply["deliver_subject"]
    with path.open("rb") as data:
        while chunk := data.read(CHUNK_BYTES):
            ack = await nc.request(deliver, chunk, timeout=30)  # each chunk is acknowledged: empty, or an error
            if ack.data and (why := _api_error(json.loads(ack.data))) is not None:
                raise BackupError(f"stream {stream}: the server stopped the restore ({why})")
    result = json.loads((await nc.request(deliver, b"", timeout=120)).data)
    if (why := _api_error(result)) is not None:
        raise BackupError(f"stream {stream}: the restore failed ({why})")
    return result


async def _falkordb_groups(settings: EngramSettings) -> list[str]:
    from engram.graph.drivers import GraphDrivers

    if settings.graph_backend == "neo4j":
        raise BackupError("engram backup reads FalkorDB graphs only (ENGRAM_GRAPH_BACKEND=neo4j: use neo4j-admin "
                          "database dump for the graph)")
    graphs = GraphDrivers(settings)
    try:
        client = await graphs._client()
        return sorted(await client.list_graphs())
    finally:
        await graphs.close()


async def backup(settings: EngramSettings, nc: Any, directory: Path) -> BackupReport:
    """Back up the stack ``nc`` and ``settings`` reach into ``directory`` (new or empty)."""
    if directory.exists() and any(directory.iterdir()):
        raise BackupError(f"{directory} is not empty: back up into a new directory")
    (directory / "jetstream").mkdir(parents=True, exist_ok=True)
    (directory / "graph").mkdir(exist_ok=True)
    report = BackupReport(directory)
    js = nc.jetstream()
    # 1. every stream, with its consumers, upstream first: what was acknowledged is what the rest holds
    for name in snapshot_order([info.config.name for info in await js.streams_info()]):
        if not _SAFE_NAME.match(name):
            raise BackupError(f"a stream name engram cannot write as a file: {name!r}")
        meta = await snapshot_stream(nc, name, directory / "jetstream" / f"{name}.snapshot")
        (directory / "jetstream" / f"{name}.json").write_text(json.dumps(meta, indent=1))
        report.streams[name] = int(meta["state"].get("messages", 0))
    # 2. then every group's graph (it holds at least what the snapshot's acks say)
    for i, group in enumerate(await _falkordb_groups(settings)):
        try:
            lines = await export_lines(settings, group)
        except ExportError:
            continue  # an empty graph (no node with a uuid): nothing to keep
        (directory / "graph" / f"{i:05d}.jsonl").write_text("\n".join(lines) + "\n")
        report.groups[group] = len(lines) - 1
    manifest = {"format": FORMAT, "created_at": datetime.now(timezone.utc).isoformat(),
                "streams": report.streams, "groups": report.groups,
                "order": "streams first, then the graph (see engram/cli/backup.py)"}
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return report


def read_manifest(directory: Path) -> dict[str, Any]:
    try:
        manifest = json.loads((directory / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        raise BackupError(f"{directory} holds no engram backup (manifest.json: {type(exc).__name__})") from exc
    if manifest.get("format") != FORMAT:
        raise BackupError(f"{directory}: backup format {manifest.get('format')!r}, this engram reads {FORMAT!r}")
    return manifest


async def restore(settings: EngramSettings, nc: Any, directory: Path) -> BackupReport:
    """Restore ``directory`` into the stack ``nc`` and ``settings`` reach, which must hold no memory:
    its streams may exist (``engram up`` creates them) but must be empty, and it has no graph."""
    manifest = read_manifest(directory)
    for name in manifest["streams"]:  # every file there before anything is changed
        if not _SAFE_NAME.match(str(name)):
            raise BackupError(f"{directory}: the manifest names a stream engram cannot read as a file: {name!r}")
        for suffix in (".json", ".snapshot"):
            if not (directory / "jetstream" / f"{name}{suffix}").is_file():
                raise BackupError(f"{directory}: jetstream/{name}{suffix} is missing: an incomplete backup")
    js = nc.jetstream()
    existing = {info.config.name: info for info in await js.streams_info()}
    full = sorted(name for name, info in existing.items() if info.state.messages)
    if full:
        raise BackupError(f"the target already holds messages ({', '.join(full)}): restore into a fresh data dir")
    if await _falkordb_groups(settings):
        raise BackupError("the target's graph already holds groups: restore into a fresh data dir")
    report = BackupReport(directory)
    try:
        for name in snapshot_order(list(manifest["streams"])):
            meta = json.loads((directory / "jetstream" / f"{name}.json").read_text())
            if name in existing:  # the empty stream `engram up` made: the snapshot's replaces it
                await js.delete_stream(name)
            info = await _restore_retrying(nc, meta, directory / "jetstream" / f"{name}.snapshot")
            report.streams[name] = int(info.get("state", {}).get("messages", 0))
        for path in sorted((directory / "graph").glob("*.jsonl")):
            written = await import_lines(settings, path.read_text().splitlines())
            report.groups[written["group_id"]] = int(written.get("nodes", 0)) + int(written.get("edges", 0))
    except (BackupError, ExportError, OSError, ValueError) as exc:
        raise BackupError(f"the restore stopped half way ({exc}): the target now holds part of the backup; "
                          "remove its data dir and restore again") from exc
    return report


async def _restore_retrying(nc: Any, meta: dict[str, Any], path: Path) -> dict[str, Any]:
    """restore_stream, retried while the server's store is not ready ("error creating store for
    stream", right after the stream of that name was deleted: engram/runtime/topology.py's retry)."""
    from engram.runtime.topology import STORE_BUSY_RETRIES

    for delay in (*STORE_BUSY_RETRIES, None):
        try:
            return await restore_stream(nc, meta, path)
        except BackupError as exc:
            if delay is None or "10049" not in str(exc):
                raise
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


async def restore_into(settings: EngramSettings, directory: Path) -> BackupReport:
    """``engram restore``: into the stack ENGRAM_NATS_URL / ENGRAM_GRAPH_URL name when set, else
    into ``settings.data_dir`` with its own servers started for the restore and stopped after (no
    `engram up` may be running on it: the data dir's lock is taken)."""
    import nats

    from engram.runtime import auth
    from engram.stack.datadir_lock import DataDirLock
    from engram.stack.supervisor import Supervisor

    read_manifest(directory)  # before anything starts: a wrong directory changes nothing
    if settings.nats_url:
        nc = await nats.connect(settings.nats_url, name="engram-restore", **settings.nats_options())
        try:
            return await restore(settings, nc, directory)
        finally:
            await nc.close()
    lock = DataDirLock(settings.data_dir)
    lock.acquire()
    try:
        sup = Supervisor(settings, services=())
        try:
            await sup.start()  # the dir's NATS and FalkorDB, with its streams (empty for a new dir)
            running = EngramSettings(data_dir=settings.data_dir)  # reads the runtime file start() wrote
            options = ({"user": auth.ADMIN_USER, "password": sup.nats_passwords["admin"]} if sup.nats_passwords
                       else running.nats_options())
            nc = await nats.connect(sup.nats_url, name="engram-restore", **options)
            try:
                return await restore(running, nc, directory)
            finally:
                await nc.close()
        finally:
            await asyncio.to_thread(sup.stop)
    finally:
        lock.release()
