"""The extraction pipeline end to end on graphiti's combined prompt: entities, types, facts, caps."""

from __future__ import annotations


from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction

from engram.models.rules_llm import MAX_ENTITIES_PER_MESSAGE, RulesExtractorClient
from tests.engram.models.rules_llm.helpers import CHAT_TURN, CHAT_TYPES, CODING_TURN, CODING_TYPES, combined_messages, fact_of, triples, type_ids


async def test_combined_extraction_coding_turn() -> None:
    client = RulesExtractorClient()
    response = await client.generate_response(
        combined_messages(CODING_TURN, CODING_TYPES),
        response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    CombinedExtraction.model_validate(response)
    ids = type_ids(CODING_TYPES)
    types = {e["name"]: e["entity_type_id"] for e in response["extracted_entities"]}
    # unnamed speakers are roles, never entities (issue 24, item 6); the fact text names them
    assert not {"User", "Assistant", "user", "assistant"} & set(types)
    expected = {
        "src/app.py": "File",
        "pyproject.toml": "File",
        "/etc/nginx/nginx.conf": "File",
        "pytest": "Tool",
        "pip": "Tool",
        "httpx": "Concept",
        "pydantic": "Concept",
        "pydantic==2.14": "Concept",
        "httpx 0.28": "Concept",
        "ModuleNotFoundError": "Error",
        "OSError: [Errno 98]": "Error",
    }
    for name, type_name in expected.items():
        assert types.get(name) == ids[type_name], (name, types)
    # "Traceback" is only a fallback when no error type is named; the errno message is no name
    assert "Traceback" not in types and "Address" not in types

    got = triples(response)
    assert ("pytest", "RUNS", "src/app.py") in got
    assert ("pydantic", "USES_VERSION", "pydantic==2.14") in got
    assert ("httpx", "USES_VERSION", "httpx 0.28") in got
    assert ("pip", "INSTALLED", "httpx") in got
    assert ("src/app.py", "IMPORTS", "httpx") in got
    assert ("ModuleNotFoundError", "OCCURRED_IN", "src/app.py") in got
    assert ("/etc/nginx/nginx.conf", "RELATES_TO", "OSError: [Errno 98]") in got
    # first person becomes the speaker's role, so each fact stands alone
    assert fact_of(response, "pytest", "RUNS", "src/app.py") == (
        "The user gets ModuleNotFoundError: No module named 'httpx' when the user runs pytest on src/app.py."
    )
    assert fact_of(response, "src/app.py", "IMPORTS", "httpx") == "The assistant fixed src/app.py so it imports httpx lazily."
    assert all(e["episode_indices"] == [0] for e in response["edges"])
    assert client.failures == {} and client.unhandled == {}


async def test_combined_extraction_locomo_chat_turn() -> None:
    client = RulesExtractorClient()
    response = await client.generate_response(combined_messages(CHAT_TURN, CHAT_TYPES), response_model=CombinedExtraction)
    ids = type_ids(CHAT_TYPES)
    types = {e["name"]: e["entity_type_id"] for e in response["extracted_entities"]}
    assert types["Caroline"] == ids["Person"] and types["Melanie"] == ids["Person"]
    assert types["Sweden"] == ids["Place"]
    assert types["LGBTQ support group"] == ids["Entity"]
    assert types["Melanie's kids"] == ids["Person"]
    assert "May 2023" in types and "Google" in types and "painting" in types and "pottery" in types
    got = triples(response)
    assert ("Caroline", "ATTENDED", "LGBTQ support group") in got
    assert ("Melanie", "LIKES", "painting") in got
    assert ("Melanie's kids", "LIKES", "pottery") in got
    assert ("Melanie", "LIVES_IN", "Sweden") in got
    assert ("Melanie", "WORKS_AT", "Google") in got
    # "Wow, that's cool, Caroline!": Caroline is the listener, not an argument -- no fact
    assert not any({s, t} == {"Melanie", "Caroline"} for s, _, t in got)
    assert fact_of(response, "Caroline", "ATTENDED", "LGBTQ support group") == (
        "Caroline went to a LGBTQ support group yesterday and it was so powerful."
    )
    assert fact_of(response, "Melanie", "LIKES", "painting") == "Melanie loves painting and Melanie's kids love pottery."
    assert not any(n in types for n in ("It", "Wow", "I", "We"))


async def test_combined_extraction_without_custom_types_uses_the_default_type() -> None:
    response = await RulesExtractorClient().generate_response(combined_messages(CHAT_TURN), response_model=CombinedExtraction)
    assert {e["entity_type_id"] for e in response["extracted_entities"]} == {0}
    assert ("Caroline", "ATTENDED", "LGBTQ support group") in triples(response)


async def test_caps_on_entities_per_message_and_fact_length() -> None:
    files = " ".join(f"src/mod{i}.py" for i in range(40))
    long_tail = " and then " + "very " * 100 + "long."
    content = f"user: I changed {files} today{long_tail}\n\nassistant: I ran pytest on src/extra.py."
    response = await RulesExtractorClient().generate_response(combined_messages(content), response_model=CombinedExtraction)
    names = [e["name"] for e in response["extracted_entities"]]
    user_files = [n for n in names if n.startswith("src/mod")]
    assert len(user_files) == MAX_ENTITIES_PER_MESSAGE  # an unnamed speaker is no entity, so takes no slot
    assert "src/extra.py" in names and "pytest" in names  # the next message has its own budget
    assert all(len(e["fact"]) <= 300 for e in response["edges"])
    assert any(e["fact"].endswith("...") for e in response["edges"])
