"""Searching one group's graph for recall: graphiti's hybrid edge search (BM25 + cosine, RRF),
expired facts excluded, each fact returned with its provenance (episodes and their source
message ids, which the extractor stores on the Episodic node)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.search.search import search
from graphiti_core.search.search_config import SearchConfig
from graphiti_core.search.search_config_recipes import EDGE_HYBRID_SEARCH_RRF
from graphiti_core.search.search_filters import ComparisonOperator, DateFilter, SearchFilters

from schemas import Provenance, RecallItem
from services.extractor.pipeline import MESSAGE_IDS_PROPERTY
from schemas.relations import canonical_relation

NOT_EXPIRED = SearchFilters(expired_at=[[DateFilter(comparison_operator=ComparisonOperator.is_null)]])


def _utc(value: Any) -> datetime | None:
    if value is None:
        return None
    if hasattr(value, "to_native"):
        value = value.to_native()
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


async def provenance(driver: Any, group_id: str, episode_uuids: list[str]) -> dict[str, list[str]]:
    """episode uuid -> its source message ids (empty for episodes written before they were stored)."""
    if not episode_uuids:
        return {}
    result = await driver.execute_query(
        f"MATCH (e:Episodic) WHERE e.uuid IN $uuids AND e.group_id = $group_id "
        f"RETURN e.uuid AS uuid, e.{MESSAGE_IDS_PROPERTY} AS ids",
        uuids=episode_uuids, group_id=group_id,
    )
    records = result[0] if isinstance(result, tuple) else result.records
    return {r["uuid"]: list(r["ids"] or []) for r in records}


async def search_group(
    clients: GraphitiClients,
    group_id: str,
    scope: str | None,
    query: str,
    limit: int,
    *,
    query_vector: list[float] | None = None,
    config: SearchConfig = EDGE_HYBRID_SEARCH_RRF,
) -> list[RecallItem]:
    """The group's best ``limit`` current facts for ``query``, best first, with provenance."""
    cfg = config.model_copy(update={"limit": limit})
    results = await search(clients, query, [group_id], cfg, NOT_EXPIRED, query_vector=query_vector)
    edges = results.edges[:limit]
    scores = results.edge_reranker_scores or [None] * len(edges)
    sources = await provenance(clients.driver, group_id, sorted({u for e in edges for u in e.episodes}))
    return [
        RecallItem(
            uuid=edge.uuid,
            fact=edge.fact,
            name=canonical_relation(edge.name),
            scope=scope,  # type: ignore[arg-type]
            group_id=group_id,
            valid_at=_utc(edge.valid_at),
            invalid_at=_utc(edge.invalid_at),
            created_at=_utc(edge.created_at),
            expired_at=_utc(edge.expired_at),
            score=score,
            provenance=[Provenance(episode_id=u, message_ids=sources.get(u, [])) for u in edge.episodes],
        )
        for edge, score in zip(edges, scores)
    ]
