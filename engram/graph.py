"""Graph drivers for every service: one place that knows FalkorDB vs Neo4j.

* FalkorDB (default): one graph per group (database = group id) and one graphiti FalkorDriver
  per group -- graphiti otherwise clones a driver and re-creates indices on every call.
* Neo4j (ENGRAM_GRAPH_BACKEND=neo4j): Community has one database, so all groups share one
  driver on ``neo4j_database`` and are kept apart by graphiti's ``group_id`` property (written
  on every node and edge, filtered on by every search and name lookup).

Indices are built once per driver, on first use rather than at start-up: a graph database that
is down at start only delays work, and a failed build is retried by the next call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.parse
from typing import Any

from graphiti_core.driver.driver import GraphDriver
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.driver.neo4j_driver import Neo4jDriver

from engram.settings import EngramSettings

SOCKET_CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 120.0  # a stalled graph fails the call (retried) instead of hanging forever
NEO4J_SCHEMES = ("bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc")


class GraphDrivers:
    def __init__(self, settings: EngramSettings) -> None:
        self.settings = settings
        self.falkor: dict[str, FalkorDriver] = {}
        self.neo4j: Neo4jDriver | None = None
        self._indexed: set[int] = set()
        self._locks: dict[int, asyncio.Lock] = {}
        self._graphs: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._falkor_client: Any = None  # one connection pool for every group's graph

    def validate(self) -> None:
        """Fail fast on a configuration that cannot work (no I/O)."""
        if self.settings.graph_backend == "neo4j":
            uri = self.settings.neo4j_uri
            if not uri:
                raise RuntimeError(
                    "ENGRAM_GRAPH_BACKEND=neo4j needs ENGRAM_NEO4J_URI (e.g. bolt://host:7687), "
                    "with ENGRAM_NEO4J_USER / ENGRAM_NEO4J_PASSWORD"
                )
            scheme = urllib.parse.urlparse(uri).scheme
            if scheme not in NEO4J_SCHEMES:
                raise RuntimeError(f"ENGRAM_NEO4J_URI must use one of {', '.join(NEO4J_SCHEMES)}, not {scheme!r}")
        elif not self.settings.resolved_graph_url():
            raise RuntimeError("no graph database: set ENGRAM_GRAPH_URL or start one with `engram up`")

    async def exists(self, group_id: str, max_age_s: float = 2.0) -> bool:
        """Whether the group has a graph. Readers ask first: a FalkorDriver for an unknown group
        would create that graph (its constructor builds indices). Neo4j: always True (one
        database; an unknown group just matches nothing)."""
        if self.settings.graph_backend == "neo4j" or group_id in self.falkor:
            return True
        checked, names = self._graphs
        if group_id not in names or time.monotonic() - checked > max_age_s:
            client = await self._client()
            names = frozenset(await client.list_graphs())
            self._graphs = (time.monotonic(), names)
        return group_id in names

    async def _client(self) -> Any:
        """The shared FalkorDB client. Its constructor makes a blocking INFO call (cluster
        detection), so it is built in a thread: a stalled server must not freeze the event loop."""
        if self._falkor_client is None:
            client = await asyncio.to_thread(self._new_client)
            if self._falkor_client is None:
                self._falkor_client = client
        return self._falkor_client

    def _new_client(self) -> Any:
        from falkordb.asyncio import FalkorDB

        url = urllib.parse.urlparse(self.settings.resolved_graph_url())
        return FalkorDB(
            host=url.hostname or "127.0.0.1", port=url.port or 6379, password=url.password,
            socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
        )

    def driver_for(self, group_id: str) -> GraphDriver:
        """The group's driver, created on first use; no graph I/O (see :meth:`driver`)."""
        if self.settings.graph_backend == "neo4j":
            return self._neo4j_driver()
        driver = self.falkor.get(group_id)
        if driver is None:
            if self._falkor_client is None:
                self._falkor_client = self._new_client()  # sync callers only; driver() builds it off-loop
            driver = FalkorDriver(falkor_db=self._falkor_client, database=group_id)
            self.falkor[group_id] = driver
        return driver

    async def driver(self, group_id: str) -> GraphDriver:
        """The group's driver with its indices built."""
        if self.settings.graph_backend != "neo4j":
            await self._client()
        driver = self.driver_for(group_id)
        await self.ensure_indices(driver)
        return driver

    def _neo4j_driver(self) -> Neo4jDriver:
        if self.neo4j is None:
            driver = Neo4jDriver(
                uri=self.settings.neo4j_uri or "", user=self.settings.neo4j_user,
                password=self.settings.neo4j_password.get_secret_value(), database=self.settings.neo4j_database,
            )
            # The constructor schedules the index build as a background task whose failure (server
            # down at that moment) would stick; ensure_indices builds them instead.
            task = getattr(driver, "_init_task", None)
            if task is not None:
                task.cancel()  # not started yet: nothing was sent
                driver._init_task = None  # noqa: SLF001
            self.neo4j = driver
        return self.neo4j

    async def ensure_indices(self, driver: GraphDriver) -> None:
        if id(driver) in self._indexed:
            return
        async with self._locks.setdefault(id(driver), asyncio.Lock()):
            if id(driver) in self._indexed:
                return
            init_task = getattr(driver, "_init_task", None)
            try:
                if init_task is not None:
                    await init_task  # FalkorDriver: index creation scheduled by its constructor
                else:
                    await driver.build_indices_and_constraints()  # IF NOT EXISTS: safe to repeat
            except BaseException:
                driver._init_task = None  # noqa: SLF001 - not remembered: the next call builds again
                raise
            self._indexed.add(id(driver))

    async def close(self) -> None:
        if self.neo4j is not None:
            with contextlib.suppress(Exception):
                await self.neo4j.close()
        if self._falkor_client is not None:  # the group drivers share it: close it once
            with contextlib.suppress(Exception):
                await self._falkor_client.aclose()
        self._falkor_client = None
        self.falkor.clear()
        self.neo4j = None
        self._indexed.clear()
        self._locks.clear()
