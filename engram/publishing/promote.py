"""Promotion: store a decision, lesson learned, preference or procedure in the workspace or
user scope, or a task update or repository state in the workspace scope (seed 003's episode
kinds), straight into the episode stream -- it is already a finished "turn", so it skips the
turn-detector and is extracted like any episode, with the canonical relation vocabulary in its
extraction instructions. A task update or repository state is a status at a point in time: its
instructions ask for the status as of that time, so a later update invalidates the earlier
status rather than standing beside it.

The episode id is deterministic (group + kind + text), so promoting the same thing twice stores
it once. Used by `engram promote` and the gateway's POST /promote.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from engram.text.secrets import scrub_secrets
from engram.schemas import Episode, EpisodeMessage, ExtractionOverride, subjects
from engram.schemas.ids import episode_id_for
from engram.schemas.relations import vocabulary_text

PromotionKind = Literal["decision", "lesson_learned", "preference", "procedure", "task_update", "repo_state"]
WORKSPACE_ONLY_KINDS = frozenset({"task_update", "repo_state"})
"""A task's or a repository's state belongs to the workspace it is about (seed 003)."""
PROMOTION_SESSION = "promotion"

INSTRUCTIONS = (
    "This episode is a durable {kind} promoted to long-term memory, not a chat turn. Extract its "
    "subject, what was decided, learned, preferred or prescribed, and the reason when given. "
    "Relation names, when one fits: {vocabulary}."
)
STATUS_INSTRUCTIONS = (
    "This episode is a {kind} promoted to long-term memory, not a chat turn: the state at the time "
    "it was recorded. Extract {what}, each as a fact that holds from that time; a state that "
    "contradicts an earlier one replaces it. Relation names, when one fits: {vocabulary}."
)
STATUS_SUBJECTS = {
    "task_update": "the task, its current status, its plan, what it depends on or is blocked by, and what was done",
    "repo_state": "the repository, its branch and commit, whether it has uncommitted changes, and the key commands "
                  "and their outcome",
}


def instructions_for(kind: PromotionKind) -> str:
    """The extraction instructions of a promoted ``kind``."""
    label = kind.replace("_", " ")
    if kind in STATUS_SUBJECTS:
        return STATUS_INSTRUCTIONS.format(kind=label, what=STATUS_SUBJECTS[kind], vocabulary=vocabulary_text())
    return INSTRUCTIONS.format(kind=label, vocabulary=vocabulary_text())


class Promotion(BaseModel):
    kind: PromotionKind
    text: str = Field(min_length=1, max_length=8000, description="The decision, lesson, preference, procedure, task "
                      "update (plan, status, blockers) or repository state (branch, commit, dirty, key commands).")
    scope: Literal["workspace", "user"] = "workspace"
    key: str = Field(min_length=1, max_length=512, description="The workspace or user key (hashed into the group id).")
    rationale: str | None = Field(None, max_length=4000)
    author: str | None = Field(None, max_length=256)
    at: datetime | None = None

    @model_validator(mode="after")
    def _workspace_only(self) -> Promotion:
        if self.kind in WORKSPACE_ONLY_KINDS and self.scope != "workspace":
            raise ValueError(f"kind {self.kind} is about a workspace: store it in the workspace scope")
        return self


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
        extraction=ExtractionOverride(preprocessing_prompt=instructions_for(promotion.kind), preprocessing_mode="append"),
        scope_key=promotion.key,
    )


async def publish_episode(js, episode: Episode, timeout_s: float | None = None) -> bool:  # noqa: ANN001 - JetStreamContext
    """Publish an episode given whole (a promotion, MCP add_memory text, a triplet) straight to its
    group's episode subject, its id as the Nats-Msg-Id, and wait for the broker's
    acknowledgement; False: the broker already had it (a duplicate)."""
    ack = await js.publish(
        subjects.episode(episode.group_id), episode.model_dump_json().encode(),
        headers={subjects.HDR_MSG_ID: episode.episode_id, "content-type": "application/json"},
        stream=subjects.STREAM_EPISODES, **({"timeout": timeout_s} if timeout_s is not None else {}),
    )
    return not ack.duplicate


async def publish_promotion(js, promotion: Promotion, prefix: str) -> Episode:  # noqa: ANN001 - a nats JetStreamContext
    """Publish the promotion's episode and wait for the broker's acknowledgement."""
    episode = promotion_episode(promotion, prefix)
    await publish_episode(js, episode)
    return episode
