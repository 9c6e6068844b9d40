"""Promotion: store a decision, lesson learned, preference or procedure in the workspace or
user scope (seed 003), straight into the episode stream -- it is already a finished "turn", so
it skips the turn-detector and is extracted like any episode, with the canonical relation
vocabulary in its extraction instructions.

The episode id is deterministic (group + kind + text), so promoting the same thing twice stores
it once. Used by `engram promote` and the gateway's POST /promote.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, Field

from engram.secrets import scrub_secrets
from schemas import Episode, EpisodeMessage, ExtractionOverride, subjects
from schemas.ids import episode_id_for
from schemas.relations import vocabulary_text

PromotionKind = Literal["decision", "lesson_learned", "preference", "procedure"]
PROMOTION_SESSION = "promotion"

INSTRUCTIONS = (
    "This episode is a durable {kind} promoted to long-term memory, not a chat turn. Extract its "
    "subject, what was decided, learned, preferred or prescribed, and the reason when given. "
    "Relation names, when one fits: {vocabulary}."
)


class Promotion(BaseModel):
    kind: PromotionKind
    text: str = Field(min_length=1, max_length=8000, description="The decision, lesson, preference or procedure.")
    scope: Literal["workspace", "user"] = "workspace"
    key: str = Field(min_length=1, max_length=512, description="The workspace or user key (hashed into the group id).")
    rationale: str | None = Field(None, max_length=4000)
    author: str | None = Field(None, max_length=256)
    at: datetime | None = None


def promotion_episode(promotion: Promotion, prefix: str) -> Episode:
    group_id = (subjects.workspace_group if promotion.scope == "workspace" else subjects.user_group)(prefix, promotion.key)
    digest = hashlib.sha256(f"{promotion.kind}\0{promotion.text}".encode()).hexdigest()[:24]
    turn_id = f"{PROMOTION_SESSION}:{digest}"
    at = (promotion.at or datetime.now(timezone.utc)).astimezone(timezone.utc)
    label = promotion.kind.replace("_", " ")
    # Rendered like a chat turn ("user (<name>): text", services/turn_detector/pairing.py), so
    # every extractor reads it the same way; the kind travels in source_description.
    author = scrub_secrets(promotion.author).text if promotion.author else None
    speaker = f"user ({author})" if author else "user"
    # Scrubbed like every chat turn: a promotion skips the turn-detector, which is where chat
    # messages lose their secrets, and goes straight into the episode stream and the graph.
    content = f"{speaker}: {scrub_secrets(promotion.text.strip()).text}"
    if promotion.rationale:
        content += f"\nRationale: {scrub_secrets(promotion.rationale.strip()).text}"
    return Episode(
        episode_id=episode_id_for(group_id, turn_id),
        group_id=group_id,
        scope=promotion.scope,
        turn_id=turn_id,
        session_id=PROMOTION_SESSION,
        reference_time=at,
        content=content,
        messages=[EpisodeMessage(message_id=f"{PROMOTION_SESSION}:{digest}", role="user", name=author, timestamp=at)],
        kind=promotion.kind,
        completed_by="promotion",
        source_description=f"engram promotion ({label})",
        extraction=ExtractionOverride(
            preprocessing_prompt=INSTRUCTIONS.format(kind=label, vocabulary=vocabulary_text()), preprocessing_mode="append"
        ),
    )


async def publish_promotion(js, promotion: Promotion, prefix: str) -> Episode:  # noqa: ANN001 - a nats JetStreamContext
    """Publish the promotion's episode and wait for the broker's acknowledgement."""
    episode = promotion_episode(promotion, prefix)
    await js.publish(
        subjects.episode(episode.group_id), episode.model_dump_json().encode(),
        headers={subjects.HDR_MSG_ID: episode.episode_id, "content-type": "application/json"},
        stream=subjects.STREAM_EPISODES,
    )
    return episode
