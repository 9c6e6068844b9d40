"""Facts given whole, stored without an extraction pass (issue 26, item 3; Graphiti's
``add_triplet``): MCP ``add_triplet`` and the gateway's ``POST /triplets``.

Why through the episode stream, not straight into the graph: a triplet must be resolved against
the group's entities and facts like an extracted fact (a duplicate merges, a contradiction ends
the older fact, the summary-gate hears of the change), and in the group's order with its turns,
so the same extractor does it (services/extractor/pipeline.py, ``_triplet``: no extraction call;
the dedupe and invalidation calls an extracted fact would make, no more). The episode's id is a
hash of the group and the triplet, so the same triplet sent twice is stored once (the Nats-Msg-Id
and the graph's idempotency marker), as a promotion is.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime

from engram.publishing.promote import publish_episode
from engram.text.secrets import scrub_secrets
from engram.schemas import Episode, TripletFact
from engram.schemas.ids import episode_id_for
from engram.schemas.messages import EpisodeMessage

TRIPLET_SESSION = "triplet"
"""Turn ids of triplet episodes: ``triplet:<hash>``."""


def triplet_episode(group_id: str, triplet: TripletFact, at: datetime, source_description: str = "") -> Episode:
    """The episode that stores ``triplet`` in ``group_id``, said at ``at`` (its facts hold from
    ``triplet.valid_at``, else from then). Secrets in the names or the sentence are replaced
    before anything is published (the extractor scrubs again)."""
    clean = triplet.model_copy(update={
        "source": scrub_secrets(triplet.source).text, "target": scrub_secrets(triplet.target).text,
        "fact": scrub_secrets(triplet.fact).text,
    })
    digest = hashlib.sha256(json.dumps([group_id, clean.model_dump(mode="json")], sort_keys=True).encode()).hexdigest()
    turn_id = f"{TRIPLET_SESSION}:{digest[:24]}"
    return Episode(
        episode_id=episode_id_for(group_id, turn_id),
        group_id=group_id,
        scope="session",
        turn_id=turn_id,
        session_id=group_id,
        reference_time=at,
        content=clean.fact,
        messages=[EpisodeMessage(message_id=turn_id, role="user", timestamp=at)],
        completed_by="promotion",  # published whole, not completed by the turn-detector
        source_description=scrub_secrets(source_description).text[:512] or "engram triplet",
        triplet=clean,
    )


async def publish_triplet(js, episode: Episode, timeout_s: float = 5.0) -> bool:  # noqa: ANN001 - JetStreamContext
    """Publish a triplet's episode and wait for the broker's acknowledgement; False: a duplicate."""
    return await publish_episode(js, episode, timeout_s)
