"""extractor service: a thin FastStream app around pipeline.py and deltas.py.

Per episode (strictly in order per group: one shared durable whose deliveries wake a group's
chain, engram/runtime/group_order.py; a group's episodes run one at a time, any number of groups at
once up to the replicas' slots):
1. parse the Episode; a bad payload goes to ``engram.dlq.extractor`` with its reason;
2. extract it into the group's graph with the resolved preprocessing instructions; an episode
   already in the graph costs no LLM call. FalkorDB: one graph (database = group id) and one
   driver per group. Neo4j (ENGRAM_GRAPH_BACKEND=neo4j, ENGRAM_NEO4J_URI/USER/PASSWORD/DATABASE):
   Community has one database, so all groups share one driver on ``neo4j_database`` and are
   kept apart by graphiti's ``group_id`` property: written on every node and edge, filtered on
   by every search and name lookup; lookups by uuid need no filter (uuids are unique, and
   episode ids are uuid5(group id, turn id));
3. publish one NodeDelta per touched entity to ``engram.delta.<group>`` (Nats-Msg-Id =
   episode id + node uuid, so re-publishing after a crash between graph write and publish
   duplicates nothing); then ack.
Failures are retried with a delay and dead-lettered after ``max_deliveries`` attempts (counted
in the group's record, not by deliveries).

Pulling (engram/runtime/service.py ``CapacityPuller``): a replica asks for a delivery only when one of
its ``extractor_concurrency`` slots is free, with short no-wait pull requests; a delivery whose
group is done or owned elsewhere is acked at once and frees the slot, one that starts a chain
keeps it until the group has nothing left. Idle replicas poll with a bounded backoff and wake at
once on a new episode (core subscription on ``engram.episode.*``). Stop: no new pulls, chains get
``stop_grace_s`` to finish, the rest hand their group back and are nacked for immediate
redelivery. A chain's trigger goes through the FastStream subscriber (middlewares,
engram_faststream_* metrics, tracing); the episodes it reads after it are handled directly.

Models come from ENGRAM_LLM_* / ENGRAM_EMBEDDER_* (engram/models/factory.py): the offline rules
extractor and hashing embedder by default, the local MiniLM embedder or any OpenAI-compatible
endpoint by settings.
Graph drivers come from engram/graph/drivers.py (shared with the other services): indices are built
once per driver on its first episode, so a graph database that is down at start only delays
extraction.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from graphiti_core.cross_encoder.client import CrossEncoderClient
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.llm_client.client import LLMClient
from nats.js import JetStreamContext
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from engram.runtime import dlq
from engram.observability import graphiti_tracing
from engram.graph.ontology import Ontologies, OntologySettings
from engram.graph.drivers import GraphDrivers
from engram.runtime.stream_retention import StreamKeeper
from engram.observability.pipeline_metrics import BacklogMonitor, observe_freshness
from engram.models.embedding_cache import BatchingEmbedder
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm, vector_dim
from engram.runtime.group_order import GroupOrder, StoredMessage
from engram.runtime.service import (
    CapacityPuller,
    ServiceApp,
    failure_decision,
    jetstream,
    make_broker,
    start_pulling,
    subscribe_partitions_with_capacity,
)
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import Episode, NodeDelta, subjects
from engram.schemas.validation import error_locations
from engram.services.extractor.deltas import build_node_deltas, delta_message_id
from engram.services.extractor.pipeline import (
    TripletRejected,
    deltas_for_existing_episode,
    extract_episode,
    record_group_name,
)
from engram.services.extractor.preprocessing import (
    ExtractionSettings,
    PrependingLLMClient,
    instructions_for_episode,
    validate_at_startup,
)
from engram.services.extractor.restatement import similarity_threshold
from engram.services.extractor.scrub import scrubbed_episode

STAGE = "extractor"
log = logging.getLogger("engram.extractor")

EPISODES = Counter("engram_extractor_episodes_total", "Episodes handled, by outcome.", ["outcome"])
DELTAS = Counter("engram_extractor_deltas_total", "NodeDeltas published.")
EPISODE_SECONDS = Histogram(
    "engram_extractor_episode_seconds",
    "Time to extract one episode and publish its deltas.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
STAGE_SECONDS = Histogram(
    "engram_extractor_stage_seconds",
    "Time per extraction stage (lookup, previous_episodes, extract, resolve_nodes, resolve_edges, embed, save).",
    ["stage"],
    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
)


class NoRerank(CrossEncoderClient):
    """Extraction never reranks; graphiti's clients bundle still needs a cross encoder."""

    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        return [(p, 0.0) for p in passages]


class Extractor:
    def __init__(self, settings: EngramSettings, broker: NatsBroker, llm: LLMClient | None = None,
                 embedder_settings: EmbedderSettings | None = None, ontologies: Ontologies | None = None) -> None:
        self.settings = settings
        self.broker = broker
        self.extraction = ExtractionSettings()
        # ENGRAM_ONTOLOGY / _WORKSPACES: loaded here, so a spec that cannot load stops the start
        self.ontologies = ontologies or Ontologies.from_settings(OntologySettings(), settings.group_prefix)
        self.named_groups: set[str] = set()  # groups whose name (scope and key) this process recorded
        self.llm = llm or build_llm(LLMSettings(), nats=lambda: broker.connection)  # the shared rate limit's KV
        # graphiti's own spans (graphiti.llm.generate, ...), content stripped (engram/observability/tracing.py)
        self.tracer = graphiti_tracing.graphiti_tracer("extractor")
        self.llm.set_tracer(self.tracer)
        embedder_settings = embedder_settings or EmbedderSettings()
        self.embedder = build_embedder(embedder_settings)
        # What graphiti and the pipeline ask the embedder for: each text once, recent vectors kept
        # across episodes (entity names recur), a turn's misses in one call (engram/models/embedding_cache.py)
        self.batching_embedder = BatchingEmbedder(self.embedder)
        # An invalidation by a restatement of the invalidated fact is rejected (issue 10 item 6).
        self.restatement_similarity = similarity_threshold(
            self.extraction.restatement_similarity, embedder_settings.provider
        )
        # FalkorDB: a driver per group; Neo4j: one shared driver. The vector index on facts is made
        # with the group's graph, so recall can use it from the first fact on.
        self.graph = GraphDrivers(settings, embedding_dim=vector_dim(self.embedder))
        self.js: JetStreamContext | None = None
        self.configured_prompt: str | None = None
        self.previous_window = self.extraction.previous_window
        self.max_deliveries = settings.turn.max_deliveries
        # Per-replica capacity. The puller only pulls when one of its slots is free, so an
        # episode does not wait here in normal operation; this stays the hard bound on in-flight
        # LLM work (a late, unsolicited delivery waits here with its heartbeat running): the
        # slots plus as many lent by stalled chains (engram/runtime/slots.py), which would otherwise
        # queue here behind the very call that stalled.
        self.in_flight_bound = 2 * settings.extractor_concurrency
        self.capacity = asyncio.Semaphore(self.in_flight_bound)
        self.puller: CapacityPuller | None = None  # set by build()
        self.stop_grace_s = 15.0  # in-flight episodes get this long at stop, then are nacked
        # processed messages leave after ENGRAM_PROCESSED_RETENTION_S; the stream's fill is reported
        self.keeper = StreamKeeper([subjects.STREAM_EPISODES], settings.processed_retention_s)
        self.backlog = BacklogMonitor(STAGE, subjects.STREAM_EPISODES, [Topology.EXTRACTOR_DURABLE])
        self.order = GroupOrder(
            stage=STAGE, stream=subjects.STREAM_EPISODES, group_filter=lambda group: f"engram.episode.*.{group}",
            process=self._process_stored, dead_letter=self._dead_letter_failed, lease_s=settings.ack_wait_s,
            decide=lambda exc, attempt: failure_decision(exc, attempt, max_deliveries=self.max_deliveries, logger=log),
        )

    async def start(self) -> None:
        self.graph.validate()
        self.configured_prompt = validate_at_startup(self.extraction)  # fail fast on a bad template
        await self.broker.connect()
        self.js = jetstream(self.broker)
        await ensure_topology(self.js, Topology.from_settings(self.settings))
        await self.order.start(self.js)
        self.backlog.start(self.js)
        self.keeper.start(self.js)

    async def stop(self) -> None:
        await self.backlog.stop()
        await self.keeper.stop()
        if self.puller is not None:  # before the graph closes: in-flight episodes still use it
            await self.puller.stop(self.stop_grace_s)
        await self.graph.close()

    async def _clients(self, group_id: str, prefix: str = "") -> GraphitiClients:
        """The graphiti clients for ``group_id`` with its driver's indices built (engram/graph/drivers.py).
        ``prefix``: preprocessing text put before graphiti's instructions (mode ``prepend``)."""
        driver = await self.graph.driver(group_id)
        llm = PrependingLLMClient(self.llm, prefix) if prefix else self.llm
        return GraphitiClients(
            driver=driver, llm_client=llm, embedder=self.batching_embedder, cross_encoder=NoRerank(), tracer=self.tracer
        )

    async def handle(self, msg: Any) -> None:
        """``msg`` is the NatsMessage (see engram.runtime.service.message_itself): a doorbell of the group
        order, which acks it or runs the group's chain through :meth:`_process_stored`."""
        await self.order.deliver(msg.raw_message)

    async def _process_stored(self, stored: StoredMessage) -> None:
        """One episode of a group's chain; raises on a failure worth retrying (bad input is
        dead-lettered here and returns)."""
        started = time.perf_counter()
        try:
            episode = Episode.model_validate_json(stored.data)
        except ValidationError as exc:
            await self._dead_letter(stored, "schema", error_locations(exc, 10))
            EPISODES.labels(outcome="dead_lettered").inc()
            return
        if episode.group_id != dlq.subject_token(stored.subject):
            # the subject's group chose the chain (the group's order): a body naming another
            # group would be written outside that group's order, into a group it was not sent to
            await self._dead_letter(stored, "group_mismatch", "group_id in body differs from the subject's group token")
            EPISODES.labels(outcome="dead_lettered").inc()
            return
        episode = scrubbed_episode(episode)
        try:
            async with self.capacity:
                outcome = await self._process(episode)
        except TripletRejected as exc:  # bad input: no retry makes it storable
            await self._dead_letter(stored, "invalid_triplet", str(exc))
            EPISODES.labels(outcome="dead_lettered").inc()
            return
        EPISODES.labels(outcome=outcome).inc()
        EPISODE_SECONDS.observe(time.perf_counter() - started)

    async def _dead_letter_failed(self, stored: StoredMessage, reason: str, detail: str) -> None:
        await self._dead_letter(stored, reason, detail)
        EPISODES.labels(outcome="dead_lettered").inc()

    async def _process(self, episode: Episode) -> str:
        instructions = instructions_for_episode(episode.extraction, self.configured_prompt, self.extraction)
        clients = await self._clients(episode.group_id, instructions.before_graphiti)
        result = await extract_episode(
            clients, episode, custom_instructions=instructions.graphiti_custom, previous_window=self.previous_window,
            chunking=self.extraction.chunking if self.extraction.chunking_enabled else None,
            restatement_similarity=self.restatement_similarity, known_facts=self.extraction.known_facts,
            ontology=self.ontologies.for_group(episode.group_id).excluding(
                episode.extraction.excluded_entity_types if episode.extraction else ()),
        )
        if episode.scope_key and episode.group_id not in self.named_groups:  # once per group and process
            await record_group_name(clients.driver, episode)
            self.named_groups.add(episode.group_id)
        for name, ms in result.timings.items():
            if name != "total_ms":
                STAGE_SECONDS.labels(stage=name.removesuffix("_ms")).observe(ms / 1000)
        if not result.already_present:
            observe_freshness("graph", episode.first_published_at)
        if result.already_present:
            # Written before a crash or redelivery: its deltas may not all have been published.
            deltas = await deltas_for_existing_episode(clients, episode)
        else:
            deltas = build_node_deltas(episode, result)
        await self._publish(deltas)
        return "already_present" if result.already_present else "extracted"

    async def _publish(self, deltas: list[NodeDelta]) -> None:
        for delta in deltas:
            await self.broker.publish(
                delta.model_dump_json().encode(),
                subjects.delta(delta.group_id),
                headers={subjects.HDR_MSG_ID: delta_message_id(delta), "content-type": "application/json"},
                stream=subjects.STREAM_DELTAS,
            )
            DELTAS.inc()

    async def _dead_letter(self, stored: StoredMessage, reason: str, detail: str) -> None:
        assert self.js is not None
        await dlq.dead_letter(
            self.js, stage=STAGE, reason=reason, detail=detail, subject=stored.subject, payload=stored.data,
            headers=stored.headers, source_id=f"{subjects.STREAM_EPISODES}:{stored.seq}",
        )


def build(settings: EngramSettings | None = None, llm: LLMClient | None = None,
          embedder_settings: EmbedderSettings | None = None, ontologies: Ontologies | None = None) -> ServiceApp:
    """``embedder_settings``: the embedder and its thresholds (default: ENGRAM_EMBEDDER_*);
    ``ontologies``: the entity and edge types (default: ENGRAM_ONTOLOGY, ENGRAM_ONTOLOGY_WORKSPACES)."""
    settings = settings or EngramSettings()
    broker = make_broker(settings, service="extractor")
    extractor = Extractor(settings, broker, llm, embedder_settings, ontologies)
    topology = Topology.from_settings(settings)
    extractor.puller = subscribe_partitions_with_capacity(
        broker, subjects.STREAM_EPISODES, [topology.extractor_consumer()], extractor.handle, title="extractor",
        capacity=settings.extractor_concurrency, wake_subject=subjects.EPISODE.format(group="*"), idle_max_s=0.2,
    )
    app = ServiceApp(name="extractor", broker=broker, on_startup=[extractor.start],
                     after_startup=[start_pulling(broker, extractor.puller)], on_shutdown=[extractor.stop])
    app.extractor = extractor  # type: ignore[attr-defined]
    return app
