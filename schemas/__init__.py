"""engram's message contract: pydantic models, subjects, and their generated JSON Schema/AsyncAPI."""

from .memory import MEMORY_MODELS, SessionSegmentClosed
from .messages import (
    ALL_MODELS as MESSAGE_MODELS,
    ChatMessage,
    Episode,
    EpisodeMessage,
    EpisodeStats,
    ExtractionOverride,
    FactRef,
    InvalidatedFact,
    NodeDelta,
    Provenance,
    RecallItem,
    RecallMessage,
    RecallRequest,
    TimeRange,
    TripletFact,
    RecallResponse,
    RecallScopes,
    ScopeKeys,
    SessionClosed,
    SessionIdle,
    SummaryAudit,
    SummaryEvent,
    SummaryTick,
)

ALL_MODELS = MESSAGE_MODELS + MEMORY_MODELS
"""Every model of the contract (schemas/json/ holds one JSON Schema per model)."""

__all__ = [
    "ALL_MODELS",
    "ChatMessage",
    "Episode",
    "EpisodeMessage",
    "EpisodeStats",
    "ExtractionOverride",
    "FactRef",
    "InvalidatedFact",
    "NodeDelta",
    "Provenance",
    "RecallItem",
    "RecallMessage",
    "RecallRequest",
    "TimeRange",
    "TripletFact",
    "RecallResponse",
    "RecallScopes",
    "ScopeKeys",
    "SessionClosed",
    "SessionIdle",
    "SessionSegmentClosed",
    "SummaryAudit",
    "SummaryEvent",
    "SummaryTick",
]
