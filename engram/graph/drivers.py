"""Graph drivers for every service: one place that knows FalkorDB vs Neo4j.

* FalkorDB (default): one graph per group (database = group id) and one graphiti FalkorDriver
  per group -- graphiti otherwise clones a driver and re-creates indices on every call.
* Neo4j (ENGRAM_GRAPH_BACKEND=neo4j): Community has one database, so all groups share one
  driver on ``neo4j_database`` and are kept apart by graphiti's ``group_id`` property (written
  on every node and edge, filtered on by every search and name lookup).

Indices are built once per driver, on first use rather than at start-up: a graph database that
is down at start only delays work, and a failed build is retried by the next call.

Vector index (FalkorDB, when ``embedding_dim`` is given -- services pass
``engram.models.factory.embedding_dim(EmbedderSettings())``): graphiti 0.31 has none and computes
cosine against every RELATES_TO edge of the group on each search. ``ensure_indices`` adds an HNSW
index on ``RELATES_TO.fact_embedding`` (cosine, the embedder's dimension, efRuntime 200) that
``engram.services.recall.vector`` queries. An index has one dimension: one with other options (the
embedder changed) is dropped and recreated, with a warning -- two processes configured with
different embedders swap it at each start. FalkorDB builds it in the background (~4 s for 10k
facts on 2 cores) while the label's previous index keeps answering fulltext and range queries;
until it is built, vector queries fail and recall falls back to graphiti's search. A second HNSW
index, on ``Episodic.engram_embedding`` (each past turn's vector, written by the extractor), is
made the same way: recall's past-turn search (``engram.services.recall.turns``) queries it. Neo4j: no
vector index is created (graphiti 0.31 creates none there either; its edge search stays brute
force).

Fulltext queries (FalkorDB): every group driver is an :class:`EngramFalkorDriver`. graphiti
builds a RediSearch query from the words of a fact, a name or a recall query and strips only
ASCII punctuation, so a lone ``_`` (markdown ``\\_\\_\\_\\_`` in a pasted quiz) or an ASCII
control character reaches RediSearch as a term and the whole query is a syntax error -- the same
error at every retry, so the episode was dead-lettered. The driver keeps only word tokens that
hold a letter or digit (:func:`fulltext_words`), and a fulltext lookup that FalkorDB still
rejects is answered as "no hits" (counted in ``engram_graph_fulltext_rejected_total{index}``,
logged without the query) instead of failing the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import re
import time
import urllib.parse
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from graphiti_core.driver.driver import GraphDriver
from graphiti_core.driver.falkordb.fulltext import build_falkor_fulltext_query
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.driver.neo4j_driver import Neo4jDriver
from prometheus_client import Counter
from redis.exceptions import ResponseError

from engram.compat import driver_database, falkor_graph, take_index_build
from engram.settings import EngramSettings

log = logging.getLogger("engram.graph")

FULLTEXT_REJECTED = Counter(
    "engram_graph_fulltext_rejected_total",
    "Fulltext lookups FalkorDB rejected (RediSearch query error), answered as no hits; by index label.",
    ["index"],
)
# A word token of a fulltext query: letters, digits and underscores. RediSearch rejects a term made
# only of underscores when it is one character long ("_"), and ASCII control characters anywhere;
# every other letter/digit of Unicode was checked to pass (as a term and inside one, FalkorDB 4.16).
_WORD = re.compile(r"\w+")
_FULLTEXT_CALL = re.compile(r"db\.idx\.fulltext\.query(?:Nodes|Relationships)\(\s*'(\w+)'")
_REJECTION_REASON = re.compile(r"(RediSearch: [A-Za-z ]+)")
_GRAPHITI_FALKOR_LOG = logging.getLogger("graphiti_core.driver.falkordb_driver")
_quiet_rejections: contextvars.ContextVar[bool] = contextvars.ContextVar("engram_quiet_fulltext", default=False)


def fulltext_words(text: str) -> str:
    """``text`` reduced to what may reach RediSearch's query syntax: its word tokens (letters,
    digits, underscores) that hold at least one letter or digit, joined by spaces. Every
    RediSearch operator (``| - ~ * % @ : " ' ( ) [ ] { } $ => \\`` ...), lone punctuation and
    control characters become separators. Underscores inside a word stay (``snake_case`` is one
    indexed term in RediSearch); non-ASCII punctuation splits a word where RediSearch's indexer
    may not (``don’t``), which costs a match, never an error."""
    return " ".join(w for w in _WORD.findall(text) if any(c.isalnum() for c in w))


class _DropQuietRejections(logging.Filter):
    """graphiti's FalkorDriver logs a failed query at ERROR with its parameters, i.e. the message
    text. While an :class:`EngramFalkorDriver` fulltext lookup runs (a context variable: per task,
    so concurrent queries are unaffected), its RediSearch rejection is logged by engram instead,
    without content. Installed once on graphiti's FalkorDB driver logger; it drops nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_quiet_rejections.get() and "RediSearch" in record.getMessage())


_GRAPHITI_FALKOR_LOG.addFilter(_DropQuietRejections())


class EngramFalkorDriver(FalkorDriver):
    """graphiti's FalkorDriver whose fulltext lookups cannot fail a turn on content.

    * :meth:`build_fulltext_query` (what graphiti's ``search_utils.fulltext_query`` calls for
      every fact, node, episode and community fulltext search, and recall's BM25 half) builds
      graphiti's query from :func:`fulltext_words` of the text, so no operator or stray
      character reaches RediSearch's syntax, and leaves out the filter on the graph's own group,
      which RediSearch cannot match for a group id with a hyphen;
    * :meth:`execute_query` answers a fulltext procedure call that FalkorDB still rejects with a
      RediSearch error as an empty result (``[], [], None``: graphiti's shape) and counts it.
      graphiti's fulltext searches each run alone, so only that lookup is lost (its search's
      vector half still answers); ``get_relevant_nodes``, which joins both in one query, would
      lose both, but nothing engram calls uses it in graphiti 0.31. Other errors propagate.
    """

    def sanitize(self, query: str) -> str:
        return fulltext_words(query)

    def build_fulltext_query(self, query: str, group_ids: list[str] | None = None, max_query_length: int = 128) -> str:
        # One FalkorDB graph holds one group (database = group_id), so a filter on this graph's
        # own group adds nothing -- and RediSearch never matches the escaped group id graphiti
        # writes for an id with a hyphen (``@group_id:"a\-b"``): every fulltext lookup of such a
        # group (a hyphenated ENGRAM_GROUP_PREFIX) found nothing. The Cypher around the call still
        # filters on group_id.
        if group_ids and set(group_ids) == {driver_database(self)} and any("-" in g for g in group_ids):
            group_ids = None  # only then: with the filter, RediSearch's scores (and so its order) differ
        return build_falkor_fulltext_query(fulltext_words(query), group_ids, max_query_length)

    def clone(self, database: str) -> GraphDriver:
        if database == driver_database(self):
            return self
        return EngramFalkorDriver(falkor_db=self.client, database=database)

    async def execute_query(self, cypher_query_: str, **kwargs: Any) -> Any:
        match = _FULLTEXT_CALL.search(cypher_query_) if isinstance(cypher_query_, str) else None
        if match is None:
            return await super().execute_query(cypher_query_, **kwargs)
        token = _quiet_rejections.set(True)
        try:
            return await super().execute_query(cypher_query_, **kwargs)
        except ResponseError as exc:
            if "RediSearch" not in str(exc):
                raise
            FULLTEXT_REJECTED.labels(index=match.group(1)).inc()
            reason = _REJECTION_REASON.search(str(exc))  # the words only: "... near <query word>" is content
            log.warning("graph %s: FalkorDB rejected a fulltext query on %s (%s); continuing without that lookup",
                        driver_database(self), match.group(1), reason.group(1).strip() if reason else "RediSearch error")
            return [], [], None
        finally:
            _quiet_rejections.reset(token)


async def query_rows(driver: GraphDriver, query: str, **params: Any) -> list[dict[str, Any]]:
    """Rows of a Cypher query as dicts, whatever the driver returns (FalkorDriver: a tuple of
    records, header, summary; Neo4jDriver: an EagerResult)."""
    result = await driver.execute_query(query, **params)
    records = result[0] if isinstance(result, tuple) else result.records
    return [dict(r) for r in records]


def as_utc(value: Any) -> datetime | None:
    """A stored time as an aware datetime: FalkorDB keeps ISO strings, Neo4j its own DateTime;
    naive times are UTC. None for None or a value that is no time; a malformed string raises."""
    if value is None:
        return None
    if hasattr(value, "to_native"):  # neo4j.time.DateTime
        value = value.to_native()
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


SOCKET_CONNECT_TIMEOUT_S = 5.0
SOCKET_TIMEOUT_S = 120.0  # a stalled graph fails the call (retried) instead of hanging forever
NEO4J_SCHEMES = ("bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc")
# FalkorDB (4.16) has no IF NOT EXISTS for vector indices: a second CREATE fails "already indexed".
# efRuntime: HNSW candidate list per query. FalkorDB's default (10) finds 81% of the exact cosine
# top 20 on the 10k-fact bench graph (hashing 256-d and 384-d); 200 finds 99% for ~0.5 ms more.
VECTOR_INDEX_OPTIONS = {"similarityFunction": "cosine", "efRuntime": 200}


@dataclass(frozen=True)
class VectorIndex:
    """A FalkorDB vector index engram keeps: on a relationship type's or a node label's property."""

    label: str
    property: str
    entity: str  # "RELATIONSHIP" or "NODE", as db.indexes() names them
    what: str  # for logs

    @property
    def pattern(self) -> str:
        return f"()-[e:{self.label}]-()" if self.entity == "RELATIONSHIP" else f"(e:{self.label})"

    @property
    def drop(self) -> str:
        return f"DROP VECTOR INDEX FOR {self.pattern} ON (e.{self.property})"

    def create(self, dim: int) -> str:
        options = ", ".join(f"{k}: {v!r}" for k, v in {"dimension": int(dim), **VECTOR_INDEX_OPTIONS}.items())
        return f"CREATE VECTOR INDEX FOR {self.pattern} ON (e.{self.property}) OPTIONS {{{options}}}"


# Facts' embeddings (services/recall/vector.py) and past turns' (services/recall/turns.py: the
# extractor stores each turn's vector as vecf32 in ``engram_embedding``, EMBEDDING_PROPERTY of
# services/extractor/pipeline.py, not imported here: the pipeline imports this module).
FACT_VECTOR_INDEX = VectorIndex("RELATES_TO", "fact_embedding", "RELATIONSHIP", "facts")
TURN_VECTOR_INDEX = VectorIndex("Episodic", "engram_embedding", "NODE", "past turns")
VECTOR_INDEXES = (FACT_VECTOR_INDEX, TURN_VECTOR_INDEX)
VECTOR_INDEX_LABEL, VECTOR_INDEX_PROPERTY = FACT_VECTOR_INDEX.label, FACT_VECTOR_INDEX.property
DROP_VECTOR_INDEX = FACT_VECTOR_INDEX.drop


def create_vector_index_query(dim: int, index: VectorIndex = FACT_VECTOR_INDEX) -> str:
    return index.create(dim)


async def vector_index_options(graph: Any, index: VectorIndex = FACT_VECTOR_INDEX) -> dict[str, Any] | None:
    """The options ({dimension, similarityFunction, M, efConstruction, efRuntime}) of ``index``
    (default the RELATES_TO.fact_embedding vector index) of a raw FalkorDB graph, None when there
    is none.

    While FalkorDB rebuilds a label's index (after any CREATE or DROP on it) ``db.indexes()``
    lists the label twice: the index in use (OPERATIONAL) and the one being built (UNDER
    CONSTRUCTION). The one being built is what the graph is going to have: it is the one read."""
    result = await graph.query("CALL db.indexes() YIELD label, types, options, entitytype, status "
                               "RETURN label, types, options, entitytype, status")
    rows = [(types, options, status) for label, types, options, entitytype, status in result.result_set
            if label == index.label and entitytype == index.entity]
    rows.sort(key=lambda row: "OPERATIONAL" in str(row[2]))  # the one being built first
    for types, options, _ in rows[:1]:
        if "VECTOR" in (types or {}).get(index.property, []):
            return dict((options or {}).get(index.property) or {})
    return None


async def ensure_vector_index(graph: Any, dim: int, index: VectorIndex = FACT_VECTOR_INDEX) -> str:
    """Create ``index`` (default RELATES_TO.fact_embedding) of ``dim`` dimensions (cosine) on a raw
    FalkorDB graph, or drop and recreate one of other options (dimension, similarity, efRuntime).
    Returns what it did: "exists", "created" or "recreated". FalkorDB builds the index in the
    background; the label's previous index (fulltext and range) answers meanwhile."""
    wanted = {"dimension": int(dim), **VECTOR_INDEX_OPTIONS}
    options = await vector_index_options(graph, index)
    if options is not None and all(options.get(k) == v for k, v in wanted.items()):
        return "exists"
    action = "created"
    if options is not None:
        log.warning("graph %s: vector index on %s.%s has %s, wanted %s: dropping and recreating it",
                    getattr(graph, "name", "?"), index.label, index.property,
                    {k: options.get(k) for k in wanted}, wanted)
        await graph.query(index.drop)
        action = "recreated"
    try:
        await graph.query(index.create(dim))
    except Exception as exc:
        if "already indexed" not in str(exc):
            raise
        return "exists"  # another process created it between our check and create
    return action


class GraphDrivers:
    def __init__(self, settings: EngramSettings, *, embedding_dim: int | None = None) -> None:
        """``embedding_dim``: the configured embedder's vector size; with it, FalkorDB graphs get a
        vector index on facts (see the module docstring). None: no vector index is created."""
        if embedding_dim is not None and embedding_dim < 1:
            raise ValueError(f"embedding_dim must be positive, not {embedding_dim}")  # FalkorDB would take -3 as 2**32-3
        self.settings = settings
        self.embedding_dim = embedding_dim
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
        from redis.asyncio import BlockingConnectionPool

        url = urllib.parse.urlparse(self.settings.resolved_graph_url())
        # A blocking pool: a query beyond ENGRAM_GRAPH_MAX_CONNECTIONS waits for a free connection
        # (up to ENGRAM_GRAPH_POOL_TIMEOUT_S) instead of failing with "Too many connections", as
        # redis-py's default pool does. graphiti runs up to SEMAPHORE_LIMIT queries of one episode
        # at once, times the extractor's concurrency: 30 groups ingested together hit the default
        # pool's 100 (issue 16, bench/load.py). The pool also bounds this process's graph queries.
        pool = BlockingConnectionPool(
            host=url.hostname or "127.0.0.1", port=url.port or 6379, password=url.password,
            socket_connect_timeout=SOCKET_CONNECT_TIMEOUT_S, socket_timeout=SOCKET_TIMEOUT_S,
            decode_responses=True,  # FalkorDB's client expects str replies (it sets this itself without a pool)
            max_connections=self.settings.graph_max_connections, timeout=self.settings.graph_pool_timeout_s,
        )
        return FalkorDB(connection_pool=pool)

    def driver_for(self, group_id: str) -> GraphDriver:
        """The group's driver, created on first use; no graph I/O (see :meth:`driver`)."""
        if self.settings.graph_backend == "neo4j":
            return self._neo4j_driver()
        driver = self.falkor.get(group_id)
        if driver is None:
            if self._falkor_client is None:
                self._falkor_client = self._new_client()  # sync callers only; driver() builds it off-loop
            driver = EngramFalkorDriver(falkor_db=self._falkor_client, database=group_id)
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
            task = take_index_build(driver)
            if task is not None:
                task.cancel()  # not started yet: nothing was sent
            self.neo4j = driver
        return self.neo4j

    async def ensure_indices(self, driver: GraphDriver) -> None:
        if id(driver) in self._indexed:
            return
        async with self._locks.setdefault(id(driver), asyncio.Lock()):
            if id(driver) in self._indexed:
                return
            # FalkorDriver: index creation scheduled by its constructor, taken from the driver so
            # that a failed build is not remembered: the next call builds again.
            init_task = take_index_build(driver)
            if init_task is not None:
                await init_task
            else:
                await driver.build_indices_and_constraints()  # IF NOT EXISTS: safe to repeat
            if self.embedding_dim and isinstance(driver, FalkorDriver):
                await self._ensure_vector_index(driver, self.embedding_dim)
            self._indexed.add(id(driver))

    async def _ensure_vector_index(self, driver: FalkorDriver, dim: int) -> None:
        """Connection errors propagate (the next call tries again); an error the server answers
        with is logged and not retried: recall then falls back to graphiti's search."""
        graph = falkor_graph(driver)  # raw graph: the driver logs every failure as an error
        for index in VECTOR_INDEXES:
            try:
                action = await ensure_vector_index(graph, dim, index)
            except ResponseError as exc:
                log.warning("graph %s: vector index on %s not created (%s); recall falls back without it",
                            graph.name, index.what, exc)
                continue
            if action != "exists":
                log.info("graph %s: vector index on %s %s (%d dimensions, cosine)", graph.name, index.what, action, dim)

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
