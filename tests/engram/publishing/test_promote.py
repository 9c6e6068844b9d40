"""Promotion (engram/publishing/promote.py): a decision stored in the workspace scope is extracted with the
canonical relation vocabulary and comes back from recall; promoting it twice stores it once."""

from __future__ import annotations

import nats
import pytest

from engram.models.rules_llm import RulesExtractorClient
from engram.publishing.promote import Promotion, promotion_episode, publish_promotion
from engram.settings import EngramSettings
from engram.schemas import RecallRequest, RecallResponse, RecallScopes, subjects
from engram.schemas.relations import CANONICAL_RELATIONS
from engram.services.extractor import app as ex_app
from engram.services.recall import app as rc_app
from tests.services.turn_detector.helpers import read_all, wait_for


def test_promotion_episode_is_deterministic_and_scoped() -> None:
    p = Promotion(kind="decision", text="Use FastAPI for the billing API.", key="/home/me/repo", rationale="pydantic")
    a, b = promotion_episode(p, "engram"), promotion_episode(p.model_copy(update={"rationale": "other"}), "engram")
    assert a.episode_id == b.episode_id and a.group_id == subjects.workspace_group("engram", "/home/me/repo")
    assert a.kind == "decision" and a.completed_by == "promotion" and a.scope == "workspace"
    assert "Rationale: pydantic" in a.content and "/home/me" not in a.group_id
    assert all(name in (a.extraction.preprocessing_prompt or "") for name in CANONICAL_RELATIONS)
    user = promotion_episode(p.model_copy(update={"scope": "user", "key": "me@example.org"}), "engram")
    assert user.group_id == subjects.user_group("engram", "me@example.org") and user.scope == "user"


async def test_promoted_decision_is_extracted_and_recalled(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, group_prefix="promo")
    llm = RulesExtractorClient()
    extractor, recall = ex_app.build(settings, llm=llm), rc_app.build(settings)
    await extractor.start()
    await recall.start()
    nc = await nats.connect(clean_nats)
    try:
        js = nc.jetstream()
        promotion = Promotion(kind="decision", text="We use FastAPI for the billing API because pydantic models carry over.",
                              key="billing-repo", author="Ada")
        await publish_promotion(js, promotion, settings.group_prefix)
        await publish_promotion(js, promotion, settings.group_prefix)  # twice: stored once
        assert len(await read_all(js, subjects.STREAM_EPISODES)) == 1

        async def recalled() -> RecallResponse | None:
            reply = await nc.request(subjects.RECALL, RecallRequest(
                query="Which framework does the billing API use?", scopes=RecallScopes(workspace="billing-repo"),
            ).model_dump_json().encode(), timeout=5)
            response = RecallResponse.model_validate_json(reply.data)
            return response if response.items else None

        response = await wait_for(recalled, 30)
        assert response and any("FastAPI" in i.fact for i in response.items)
        assert all(i.scope == "workspace" for i in response.items)
    finally:
        await nc.close()
        await recall.stop()
        await extractor.stop()


def test_task_updates_and_repo_states_are_promoted_to_the_workspace_as_states_in_time() -> None:
    from pydantic import ValidationError

    for kind in ("task_update", "repo_state"):
        episode = promotion_episode(Promotion(kind=kind, text="auth migration: step 2 of 4 done", key="/repo"), "engram")
        assert episode.kind == kind and episode.scope == "workspace"
        instructions = episode.extraction.preprocessing_prompt
        assert "state at the time" in instructions and "replaces it" in instructions
        assert all(name in instructions for name in CANONICAL_RELATIONS)
        with pytest.raises(ValidationError, match="workspace scope"):
            Promotion(kind=kind, text="x", key="me@example.org", scope="user")
    decision = promotion_episode(Promotion(kind="decision", text="x", key="/repo"), "engram")
    assert "state at the time" not in decision.extraction.preprocessing_prompt
