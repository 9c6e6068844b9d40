"""The FalkorDB client's connection pool (engram/graph/drivers.py): queries beyond
ENGRAM_GRAPH_MAX_CONNECTIONS wait for a free connection instead of failing with redis-py's
"Too many connections" (30 groups ingested at once logged it 201 times: issue 16 item 5)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis.exceptions

from engram.stack.embedded import ManagedProcess
from engram.graph.drivers import GraphDrivers
from engram.settings import EngramSettings

SLOW_QUERY = "UNWIND range(1, 20000) AS i WITH i WHERE i % 7 = 0 RETURN count(i)"


def settings(falkordb_server: ManagedProcess, tmp_path: Path, **kw) -> EngramSettings:  # noqa: ANN003
    return EngramSettings(graph_url=falkordb_server.url, data_dir=tmp_path, **kw)


async def test_queries_beyond_the_pool_wait_instead_of_failing(falkordb_server: ManagedProcess, tmp_path: Path) -> None:
    drivers = GraphDrivers(settings(falkordb_server, tmp_path, graph_max_connections=3, graph_pool_timeout_s=30))
    driver = await drivers.driver("pool_test")
    results = await asyncio.gather(*(driver.execute_query(SLOW_QUERY) for _ in range(40)))
    assert len(results) == 40
    assert drivers._falkor_client.connection.connection_pool.max_connections == 3


async def test_the_same_load_overflows_redis_pys_default_pool(falkordb_server: ManagedProcess) -> None:
    """What engram's pool replaces: redis-py's default pool raises at its bound (so the test above
    passes only because queries waited for a connection)."""
    from falkordb.asyncio import FalkorDB

    host, port = falkordb_server.url.split("://", 1)[1].rsplit(":", 1)
    graph = FalkorDB(host=host, port=int(port), max_connections=3).select_graph("pool_test")
    with pytest.raises(redis.exceptions.ConnectionError, match="Too many connections"):
        await asyncio.gather(*(graph.query(SLOW_QUERY) for _ in range(40)))


async def test_the_wait_is_bounded(falkordb_server: ManagedProcess, tmp_path: Path) -> None:
    """A query that cannot get a connection within the timeout fails (and its episode is retried)."""
    drivers = GraphDrivers(settings(falkordb_server, tmp_path, graph_max_connections=1, graph_pool_timeout_s=0.05))
    await drivers.driver("pool_test_b")
    pool = drivers._falkor_client.connection.connection_pool
    held = await pool.get_connection()  # the only connection, taken
    try:
        with pytest.raises(redis.exceptions.ConnectionError, match="No connection available"):
            await drivers._falkor_client.list_graphs()
    finally:
        await pool.release(held)
    assert isinstance(await drivers._falkor_client.list_graphs(), list)
