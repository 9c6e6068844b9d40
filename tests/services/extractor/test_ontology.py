"""Your own ontology (engram/graph/ontology.py, issue 26 item 2): loading the types from Graphiti MCP
server's default set, a YAML file or a Python module, clear errors for specs that cannot load,
and extraction with them (services/extractor/pipeline.py) against a real FalkorDB, through a
scripted model that classifies entities by the prompt's ENTITY TYPES and answers graphiti's
attribute prompt: typed entities are stored with their type's label and attributes, typed facts
under their type's name."""

from __future__ import annotations

import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

from engram.graph.ontology import (
    GRAPHITI_MCP_ENTITY_TYPES,
    Ontologies,
    Ontology,
    OntologyError,
    OntologySettings,
    load_ontology,
)
from engram.schemas.subjects import workspace_group
from engram.services.extractor.pipeline import extract_episode
from tests.services.extractor.test_pipeline import T1, Env, ScriptedLLM, Turn, env  # noqa: F401 - the fixture

YAML = """\
graphiti:                      # a Graphiti MCP server config section, pasted as is
  entity_types:
    - name: Person
      description: A human being named in the conversation.
      attributes:
        role: {type: str, description: Their job or role.}
        years_experience: {type: int, description: Years in that role.}
    - name: Organization
      description: A company or institution.
  edge_types:
    - name: WORKS_FOR
      description: A person is employed by an organization.
  edge_type_map:
    - {source: Person, target: Organization, edge_types: [WORKS_FOR]}
"""


def test_the_default_and_graphiti_mcp_types() -> None:
    assert load_ontology(None).is_default and load_ontology("default").is_default
    mcp = load_ontology("graphiti-mcp")
    assert list(mcp.entity_types) == [name for name, _ in GRAPHITI_MCP_ENTITY_TYPES]
    assert "Person" in mcp.entity_types and not mcp.typed_attributes and not mcp.edge_types
    assert mcp.entity_types["Preference"].__doc__.startswith("A choice")


def test_a_yaml_file_in_graphiti_mcp_shape_with_attributes(tmp_path: Path) -> None:
    path = tmp_path / "ontology.yaml"
    path.write_text(YAML)
    onto = load_ontology(str(path))
    assert list(onto.entity_types) == ["Person", "Organization"] and onto.typed_attributes
    person = onto.entity_types["Person"](role="data engineer")
    assert person.role == "data engineer" and person.years_experience is None  # every attribute optional
    assert onto.graphiti_edge_type_map({}) == {("Person", "Organization"): ["WORKS_FOR"]}
    described = onto.describe()
    assert described["entity_types"][0]["attributes"]["years_experience"] == {"type": "int",
                                                                             "description": "Years in that role."}


@pytest.mark.parametrize(("text", "why"), [
    ("entity_types: [{name: Entity}]", "graphiti's base type"),
    ("entity_types: [{name: 'no spaces'}]", "a letter, then letters"),
    ("entity_types: [{name: Person, attributes: {summary: str}}]", "a name graphiti uses"),
    ("entity_types: [{name: Person, attributes: {age: {type: decimal}}}]", "type 'decimal'"),
    ("edge_type_map: [{source: Person, target: Org, edge_types: [X]}]", "'Person' is not an entity type"),
    ("entity_types: []\nentities: []", "unknown keys"),
    ("- just a list", "holds a mapping"),
    ("entity_types: [{name: Person}, {name: Person}]", "Person defined more than once"),
    ("edge_types: [{name: USES}]\nedge_type_map: [{source: Entity, target: Entity, edge_types: USES}]", "[names]"),
])
def test_a_spec_that_cannot_load_says_why(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(OntologyError, match=re.escape(why)):
        load_ontology(str(path))


def test_other_bad_specs(tmp_path: Path) -> None:
    with pytest.raises(OntologyError, match="cannot read ontology file"):
        load_ontology(str(tmp_path / "missing.yaml"))
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(OntologyError, match="does not parse"):
        load_ontology(str(tmp_path / "broken.json"))
    with pytest.raises(OntologyError, match="cannot import ontology module"):
        load_ontology("no_such_module_for_engram")
    with pytest.raises(OntologyError, match="expected default"):
        load_ontology("not a spec!")


def test_a_python_module_as_graphiti_examples_define_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "acme_types.py").write_text(textwrap.dedent('''
        from pydantic import BaseModel, Field

        class Product(BaseModel):
            """A product Acme sells."""
            sku: str | None = Field(None, description="Stock keeping unit")

        class Sells(BaseModel):
            """An organization sells a product."""

        ENTITY_TYPES = {"Product": Product}
        EDGE_TYPES = {"SELLS": Sells}
        EDGE_TYPE_MAP = {("Entity", "Product"): ["SELLS"]}
        EXCLUDED_ENTITY_TYPES = []
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    onto = load_ontology("acme_types")
    assert list(onto.entity_types) == ["Product"] and onto.typed_attributes
    assert onto.graphiti_edge_type_map({}) == {("Entity", "Product"): ["SELLS"]}
    (tmp_path / "bad_types.py").write_text("ENTITY_TYPES = {'X': dict}\n")
    with pytest.raises(OntologyError, match="not a pydantic model class"):
        load_ontology("bad_types")
    sys.modules.pop("acme_types", None)
    sys.modules.pop("bad_types", None)


def test_a_workspace_has_its_own_ontology(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_ONTOLOGY", "graphiti-mcp")
    monkeypatch.setenv("ENGRAM_ONTOLOGY_WORKSPACES", '{"plain-ws": "default"}')
    ontologies = Ontologies.from_settings(OntologySettings(), "engram")
    assert ontologies.for_group(workspace_group("engram", "plain-ws")).is_default
    assert ontologies.for_group("engram_session_x").name == "graphiti-mcp"


# --------------------------------------------------------------------------- extraction with types
@dataclass
class TypingLLM(ScriptedLLM):
    """Classifies each scripted entity with the type ``types`` names (looked up in the prompt's
    ENTITY TYPES block, as a model reads it) and answers the attribute prompt of ``Person``."""

    types: dict[str, str] = field(default_factory=dict)
    attributes: dict[str, dict[str, Any]] = field(default_factory=dict)

    def _answer_CombinedExtraction(self, text: str) -> dict[str, Any]:
        answer = super()._answer_CombinedExtraction(text)
        block = re.search(r"<ENTITY TYPES>\s*(.*?)\s*</ENTITY TYPES>", text, re.S)
        if block is None:  # engram's lean prompt: the one default type
            return answer
        ids = {name: int(i) for i, name in
               re.findall(r"'entity_type_id': (\d+), 'entity_type_name': '(\w+)'", block.group(1))}
        # a type the prompt does not list (excluded) is not one the model can answer with: the entity is left out
        answer["extracted_entities"] = [
            {**e, "entity_type_id": ids[self.types.get(e["name"], "Entity")]} for e in answer["extracted_entities"]
            if self.types.get(e["name"], "Entity") in ids]
        kept = {e["name"] for e in answer["extracted_entities"]}  # and no fact about what it left out
        answer["edges"] = [e for e in answer["edges"]
                           if e["source_entity_name"] in kept and e["target_entity_name"] in kept]
        return answer

    def _answer_Person(self, text: str) -> dict[str, Any]:
        name = re.search(r"'name': '([^']+)'", text).group(1)
        return self.attributes.get(name, {})


TYPED_TEXT = "user(Sam): I'm a data engineer at Acme, eight years now."


async def test_typed_entities_facts_and_attributes_are_stored(env: Env, tmp_path: Path) -> None:  # noqa: F811
    path = tmp_path / "ontology.yaml"
    path.write_text(YAML)
    ontology = load_ontology(str(path))
    llm = TypingLLM(world={TYPED_TEXT: Turn(["Sam", "Acme"], [("Sam", "Acme", "WORKS_FOR", "Sam works for Acme.")])},
                    types={"Sam": "Person", "Acme": "Organization"},
                    attributes={"Sam": {"role": "data engineer", "years_experience": 8}})
    clients = env.clients.model_copy(update={"llm_client": llm})
    result = await extract_episode(clients, env.episode("s1:t1", TYPED_TEXT, T1), custom_instructions="",
                                   previous_window=5, ontology=ontology)
    assert {n.name: sorted(n.labels) for n in result.nodes} == {"Sam": ["Entity", "Person"],
                                                               "Acme": ["Entity", "Organization"]}
    # stored: the type's label, its attributes as the node's properties, the fact under its type
    records, _, _ = await env.driver.execute_query(
        "MATCH (p:Person) RETURN p.name AS name, p.role AS role, p.years_experience AS years")
    assert [(r["name"], r["role"], r["years"]) for r in records] == [("Sam", "data engineer", 8)]
    records, _, _ = await env.driver.execute_query("MATCH (:Person)-[e:RELATES_TO]->(:Organization) RETURN e.name AS name")
    assert [r["name"] for r in records] == ["WORKS_FOR"]
    # graphiti's prompt listed the types; one attribute call for the one typed entity with fields
    assert "Person" in llm.prompts("CombinedExtraction")[0] and "A company or institution." in llm.prompts(
        "CombinedExtraction")[0]
    assert llm.names()["Person"] == 1 and "Organization" not in llm.names()
    assert result.timings["attributes_ms"] >= 0


async def test_the_default_ontology_makes_no_attribute_call_and_uses_engrams_prompt(env: Env) -> None:  # noqa: F811
    llm = TypingLLM(world={TYPED_TEXT: Turn(["Sam", "Acme"], [("Sam", "Acme", "WORKS_FOR", "Sam works for Acme.")])})
    clients = env.clients.model_copy(update={"llm_client": llm})
    result = await extract_episode(clients, env.episode("s1:t1", TYPED_TEXT, T1), custom_instructions="",
                                   previous_window=5, ontology=Ontology())
    assert {tuple(sorted(n.labels)) for n in result.nodes} == {("Entity",)}
    assert "attributes_ms" not in result.timings and "Person" not in llm.names()
    assert "<ENTITY TYPES>" not in llm.prompts("CombinedExtraction")[0]  # engram's lean prompt


async def test_the_offline_rules_model_extracts_with_graphiti_mcp_types(env: Env) -> None:  # noqa: F811
    """The default offline model reads graphiti's typed prompt too (it answers the default type)."""
    from engram.models.rules_llm import RulesExtractorClient

    clients = env.clients.model_copy(update={"llm_client": RulesExtractorClient()})
    text = "user (Ada): I moved to Austin and I use FastAPI at work.\n\nassistant: Noted."
    result = await extract_episode(clients, env.episode("s1:t1", text, T1), custom_instructions="",
                                   previous_window=5, ontology=load_ontology("graphiti-mcp"))
    assert "Ada" in {n.name for n in result.nodes} and result.new_edges


async def test_an_episode_excludes_entity_types(env: Env, tmp_path: Path) -> None:  # noqa: F811
    """Graphiti's excluded_entity_types, per episode (ExtractionOverride, from MCP add_memory and
    POST /episodes): the excluded type is not offered to the model, its entities are not stored."""
    from datetime import datetime, timezone

    from engram.services.gateway.mapping import text_episode

    path = tmp_path / "ontology.yaml"
    path.write_text(YAML)
    episode = text_episode(env.group_id, "note", TYPED_TEXT, "text", "", None, T1, None, door="rest",
                           excluded_entity_types=["Organization"])
    assert episode.extraction is not None and episode.extraction.excluded_entity_types == ["Organization"]
    assert episode.extraction.preprocessing_prompt is None  # the configured prompt stays
    ontology = load_ontology(str(path)).excluding(episode.extraction.excluded_entity_types)
    assert ontology.excluded_entity_types == ("Organization",)
    llm = TypingLLM(world={TYPED_TEXT: Turn(["Sam", "Acme", "Python"], [
        ("Sam", "Acme", "WORKS_FOR", "Sam works for Acme."), ("Sam", "Python", "USES", "Sam uses Python.")])},
        types={"Sam": "Person", "Acme": "Organization"}, attributes={"Sam": {"role": "data engineer"}})
    clients = env.clients.model_copy(update={"llm_client": llm})
    result = await extract_episode(clients, episode.model_copy(update={"reference_time": datetime.now(timezone.utc)}),
                                   custom_instructions="", previous_window=5, ontology=ontology)
    assert sorted(n.name for n in result.nodes) == ["Python", "Sam"]
    assert "Organization" not in re.search(r"<ENTITY TYPES>(.*?)</ENTITY TYPES>", llm.prompts("CombinedExtraction")[0],
                                           re.S).group(1)
