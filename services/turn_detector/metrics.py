"""Prometheus metrics of the turn-detector (labels are small fixed vocabularies, never ids)."""

from prometheus_client import Counter, Histogram

MESSAGES = Counter(
    "engram_turn_detector_messages_total",
    "Input events handled, by outcome (accepted, duplicate, excluded, late, flushed, dead_lettered, ...).",
    ["outcome"],
)
SEGMENTS_CLOSED = Counter(
    "engram_turn_detector_segments_closed_total",
    "Session segments closed (SessionSegmentClosed published), by reason: token_limit (rotation), idle, explicit.",
    ["reason"],
)
TURNS = Counter("engram_turn_detector_turns_total", "Turns completed.", ["completed_by"])
EPISODES = Counter("engram_turn_detector_episodes_total", "Episodes published (one per turn and scope).", ["scope"])
SECRETS = Counter("engram_secrets_scrubbed_total", "Secrets replaced by a typed placeholder.", ["kind"])
REDUCTIONS = Counter("engram_turn_detector_reductions_total", "Noise reductions applied to messages.", ["kind"])
RETRIES = Counter("engram_turn_detector_retries_total", "Handler failures answered with a delayed redelivery.")
HANDLE_SECONDS = Histogram(
    "engram_turn_detector_handle_seconds",
    "Time to handle one input event, KV and publishes included.",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
