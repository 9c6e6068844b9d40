"""Dates and time expressions: valid_at/invalid_at from facts."""

from __future__ import annotations


import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.extract_edges import BatchEdgeTimestamps, EdgeTimestamps

from engram.models.rules_llm import RulesExtractorClient
from tests.engram.models.rules_llm.helpers import REF


@pytest.mark.parametrize(
    ("fact", "valid_at", "invalid_at"),
    [
        ("Caroline went to a LGBTQ support group yesterday.", "2023-05-07T00:00:00Z", None),
        ("Caroline moved to Sweden on 2022-03-04.", "2022-03-04T00:00:00Z", None),
        ("Caroline moved to Sweden on 8 May 2021.", "2021-05-08T00:00:00Z", None),
        ("Caroline moved to Sweden on May 8, 2021.", "2021-05-08T00:00:00Z", None),
        ("Melanie painted a lake sunrise in May 2022.", "2022-05-01T00:00:00Z", None),
        ("Melanie painted a lake sunrise last year.", "2022-01-01T00:00:00Z", None),
        ("Melanie started pottery 3 weeks ago.", "2023-04-17T00:00:00Z", None),
        ("Melanie worked at Google from 2019-01-01 until March 2021.", "2019-01-01T00:00:00Z", "2021-03-01T00:00:00Z"),
        ("The server is down until 2023-06-01.", None, "2023-06-01T00:00:00Z"),
        ("Melanie loves painting.", None, None),
    ],
)
async def test_edge_timestamps(fact: str, valid_at: str | None, invalid_at: str | None) -> None:
    messages = prompt_library.extract_edges.extract_timestamps({"fact": fact, "reference_time": REF.isoformat()})
    response = await RulesExtractorClient().generate_response(messages, response_model=EdgeTimestamps)
    assert response == {"valid_at": valid_at, "invalid_at": invalid_at}


async def test_batch_edge_timestamps_keep_order_and_per_fact_reference() -> None:
    facts = [
        {"fact": "Caroline went to a support group yesterday.", "reference_time": REF.isoformat()},
        {"fact": "Caroline went to a support group yesterday.", "reference_time": "2020-01-10T08:00:00+00:00"},
        {"fact": "Melanie loves painting.", "reference_time": REF.isoformat()},
        {"fact": "Caroline went to a support group yesterday.", "reference_time": "unknown"},
    ]
    response = await RulesExtractorClient().generate_response(
        prompt_library.extract_edges.extract_timestamps_batch({"facts": facts}), response_model=BatchEdgeTimestamps
    )
    assert [t["valid_at"] for t in response["timestamps"]] == ["2023-05-07T00:00:00Z", "2020-01-09T00:00:00Z", None, None]
