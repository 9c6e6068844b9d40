"""Your own ontology (issue 26, item 2): the entity and edge types graphiti extracts with.

By default engram extracts with graphiti's one ``Entity`` type and free relation names, through
its own lean prompt (services/extractor/extraction_prompt.py). An :class:`Ontology` hands
graphiti custom types instead, the way ``Graphiti.add_episode`` takes them: ``entity_types``
and ``edge_types`` (pydantic models: the docstring is the type's description, the fields are
its attributes), ``edge_type_map`` (which edge types may join which entity types; ``Entity``
stands for any) and ``excluded_entity_types``. Extraction then uses graphiti's own combined
prompt, which lists the types; an entity is stored with its type as a label next to
``Entity``, a typed fact under its type's name, and an entity type with fields gets its
attributes from graphiti's attribute prompt (one small call per typed entity of the turn).

Where an ontology comes from (:func:`load_ontology`, ``ENGRAM_ONTOLOGY``):

* ``default`` (or unset): graphiti's ``Entity`` only;
* ``graphiti-mcp``: the entity types Graphiti's MCP server configures by default (Preference,
  Requirement, Procedure, Location, Event, Organization, Document, Topic, Person, Object), in
  engram's words, no attributes;
* a YAML or JSON file (``*.yaml``, ``*.yml``, ``*.json``), in the shape of Graphiti MCP server's
  ``graphiti:`` config section, so such a section can be pasted as is::

      entity_types:
        - name: Person
          description: A human being named in the conversation.
          attributes:                       # engram's addition: the type's fields
            role: {type: str, description: Their job or role.}
      edge_types:
        - name: WORKS_FOR
          description: Employment of a person by an organization.
      edge_type_map:
        - {source: Person, target: Organization, edge_types: [WORKS_FOR]}
      excluded_entity_types: [Topic]

  attribute types: ``str``, ``int``, ``float``, ``bool``, ``date``, ``datetime``, ``list[str]``;
  every attribute is optional (the model fills what the turn says);
* a Python module, ``package.module`` (import path): its ``ENTITY_TYPES``, ``EDGE_TYPES``,
  ``EDGE_TYPE_MAP`` and ``EXCLUDED_ENTITY_TYPES``, as graphiti's own examples define them.

Per workspace: ``ENGRAM_ONTOLOGY_WORKSPACES`` maps a workspace key to such a spec; episodes of that
workspace's group use it, every other group the deployment's (:class:`Ontologies`). A spec that
cannot be loaded stops the extractor at start with the reason (:class:`OntologyError`): an
ontology silently ignored would store untyped memory for days.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from pathlib import Path
from typing import Any, Optional

from pydantic import BaseModel, Field, create_model
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.schemas.subjects import workspace_group

DEFAULT = "default"
GRAPHITI_MCP = "graphiti-mcp"
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")
ATTRIBUTE_TYPES: dict[str, Any] = {
    "str": str, "int": int, "float": float, "bool": bool, "date": date, "datetime": datetime, "list[str]": list[str],
}
# graphiti's EntityNode / EntityEdge fields: an attribute of that name would overwrite the node's own.
_RESERVED_ATTRIBUTES = frozenset({
    "uuid", "name", "group_id", "labels", "created_at", "name_embedding", "summary", "attributes",
    "source_node_uuid", "target_node_uuid", "fact", "fact_embedding", "episodes", "expired_at", "valid_at",
    "invalid_at", "reference_time",
})

# Graphiti MCP server's default entity types (its config.yaml), described in engram's words.
GRAPHITI_MCP_ENTITY_TYPES: tuple[tuple[str, str], ...] = (
    ("Preference", "A choice, liking, opinion or selection the user states. Prefer this type over the others "
                   "below except Person."),
    ("Requirement", "Something that must be fulfilled: a need, a feature, a constraint."),
    ("Procedure", "A standard way of doing something: ordered steps or instructions."),
    ("Location", "A physical or virtual place where something happens."),
    ("Event", "Something that happens at a time: an activity, an occurrence, an experience."),
    ("Organization", "A company, institution, team or other formal group."),
    ("Document", "A piece of information content: a book, article, report, page or file."),
    ("Topic", "A subject of conversation, interest or knowledge (only when no other type fits)."),
    ("Person", "An individual human named in the conversation."),
    ("Object", "A physical item, tool, device or possession (only when no other type fits)."),
)


class OntologyError(ValueError):
    """An ontology spec engram cannot load (the message says which part and why)."""


@dataclass(frozen=True)
class Ontology:
    """Types handed to graphiti's extraction (see the module docstring); empty: the default."""

    name: str = DEFAULT
    entity_types: dict[str, type[BaseModel]] = field(default_factory=dict)
    edge_types: dict[str, type[BaseModel]] = field(default_factory=dict)
    edge_type_map: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    excluded_entity_types: tuple[str, ...] = ()

    @property
    def is_default(self) -> bool:
        return not (self.entity_types or self.edge_types or self.excluded_entity_types)

    @property
    def typed_attributes(self) -> bool:
        """Whether some entity type has fields (their values need graphiti's attribute prompt)."""
        return any(model.model_fields for model in self.entity_types.values())

    def excluding(self, names: list[str] | tuple[str, ...]) -> Ontology:
        """This ontology with ``names`` excluded as well (an episode's ``excluded_entity_types``)."""
        if not names:
            return self
        return dataclasses.replace(self, excluded_entity_types=tuple(dict.fromkeys((*self.excluded_entity_types,
                                                                                     *names))))

    def graphiti_entity_types(self) -> dict[str, type[BaseModel]] | None:
        return dict(self.entity_types) or None

    def graphiti_edge_types(self) -> dict[str, type[BaseModel]] | None:
        return dict(self.edge_types) or None

    def graphiti_excluded(self) -> list[str] | None:
        return list(self.excluded_entity_types) or None

    def graphiti_edge_type_map(self, default: dict[tuple[str, str], list[str]]) -> dict[tuple[str, str], list[str]]:
        """The map graphiti's edge stages read: the ontology's, or every edge type between any two
        entities when it names none, or ``default`` (graphiti's) without edge types."""
        if self.edge_type_map:
            return dict(self.edge_type_map)
        if self.edge_types:
            return {("Entity", "Entity"): list(self.edge_types)}
        return default

    def describe(self) -> dict[str, Any]:
        """The types as JSON (names, descriptions, attributes), for people and the explorer."""
        def one(name: str, model: type[BaseModel]) -> dict[str, Any]:
            return {"name": name, "description": (model.__doc__ or "").strip(),
                    "attributes": {f: {"type": _type_name(info.annotation), "description": info.description or ""}
                                   for f, info in model.model_fields.items()}}

        return {
            "name": self.name,
            "entity_types": [one(n, m) for n, m in self.entity_types.items()],
            "edge_types": [one(n, m) for n, m in self.edge_types.items()],
            "edge_type_map": [{"source": s, "target": t, "edge_types": list(types)}
                              for (s, t), types in self.edge_type_map.items()],
            "excluded_entity_types": list(self.excluded_entity_types),
        }


def _type_name(annotation: Any) -> str:
    for name, kind in ATTRIBUTE_TYPES.items():
        if annotation in (kind, Optional[kind]):
            return name
    return getattr(annotation, "__name__", str(annotation))


def _model(kind: str, name: Any, description: Any, attributes: Any) -> type[BaseModel]:
    if not isinstance(name, str) or not _NAME.match(name):
        raise OntologyError(f"{kind} name {name!r}: a letter, then letters, digits or _ (at most 64)")
    if name == "Entity":
        raise OntologyError(f"{kind} name 'Entity' is graphiti's base type: name yours differently")
    if description is not None and not isinstance(description, str):
        raise OntologyError(f"{kind} {name}: description must be text")
    if attributes is None:
        attributes = {}
    if not isinstance(attributes, dict):
        raise OntologyError(f"{kind} {name}: attributes must map a field name to {{type, description}}")
    fields: dict[str, Any] = {}
    for field_name, spec in attributes.items():
        if not isinstance(field_name, str) or not field_name.isidentifier() or field_name.startswith("_"):
            raise OntologyError(f"{kind} {name}: attribute {field_name!r} is not a field name")
        if field_name in _RESERVED_ATTRIBUTES:
            raise OntologyError(f"{kind} {name}: attribute {field_name!r} is a name graphiti uses for the node itself")
        spec = {"type": spec} if isinstance(spec, str) else (spec or {})
        type_name = spec.get("type", "str")
        if type_name not in ATTRIBUTE_TYPES:
            raise OntologyError(f"{kind} {name}.{field_name}: type {type_name!r}, expected one of "
                                f"{', '.join(ATTRIBUTE_TYPES)}")
        fields[field_name] = (Optional[ATTRIBUTE_TYPES[type_name]],
                              Field(None, description=str(spec.get("description") or "")))
    model = create_model(name, __doc__=(description or name), **fields)
    return model


def _named_list(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key) or []
    if isinstance(items, dict):  # {Name: {description, attributes}} is accepted too (the key is the name)
        if not all(isinstance(v, dict) or v is None for v in items.values()):
            raise OntologyError(f"{key}: each type maps to {{description, attributes}}")
        items = [{**(v or {}), "name": k} for k, v in items.items()]
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise OntologyError(f"{key}: a list of {{name, description, attributes}}")
    names = [i.get("name") for i in items]
    twice = sorted({str(n) for n in names if names.count(n) > 1})
    if twice:
        raise OntologyError(f"{key}: {', '.join(twice)} defined more than once")
    return items


def ontology_from_mapping(data: Any, name: str = "custom") -> Ontology:
    """An :class:`Ontology` from the YAML/JSON shape of the module docstring."""
    if not isinstance(data, dict):
        raise OntologyError("an ontology file holds a mapping (entity_types, edge_types, edge_type_map, ...)")
    data = data.get("graphiti", data) if isinstance(data.get("graphiti"), dict) else data  # a whole MCP config
    unknown = set(data) - {"entity_types", "edge_types", "edge_type_map", "excluded_entity_types", "group_id",
                           "episode_id_prefix", "user_id"}
    if unknown:
        raise OntologyError(f"unknown keys {sorted(unknown)}: expected entity_types, edge_types, edge_type_map, "
                            "excluded_entity_types")
    entity_types = {i.get("name"): _model("entity type", i.get("name"), i.get("description"), i.get("attributes"))
                    for i in _named_list(data, "entity_types")}
    edge_types = {i.get("name"): _model("edge type", i.get("name"), i.get("description"), i.get("attributes"))
                  for i in _named_list(data, "edge_types")}
    edge_type_map: dict[tuple[str, str], list[str]] = {}
    rows = data.get("edge_type_map") or []
    if not isinstance(rows, list):
        raise OntologyError("edge_type_map: a list of {source, target, edge_types}")
    for row in rows:
        if not isinstance(row, dict) or not {"source", "target", "edge_types"} <= set(row) \
                or not isinstance(row["edge_types"], list):
            raise OntologyError("edge_type_map: rows of {source, target, edge_types: [names]}")
        for end in (row["source"], row["target"]):
            if end != "Entity" and end not in entity_types:
                raise OntologyError(f"edge_type_map: {end!r} is not an entity type (nor Entity, any type)")
        for edge in row["edge_types"]:
            if edge not in edge_types:
                raise OntologyError(f"edge_type_map: {edge!r} is not an edge type")
        edge_type_map.setdefault((row["source"], row["target"]), []).extend(row["edge_types"])
    excluded = data.get("excluded_entity_types") or []
    if not isinstance(excluded, list) or not all(isinstance(x, str) for x in excluded):
        raise OntologyError("excluded_entity_types: a list of type names")
    return Ontology(name=name, entity_types=entity_types, edge_types=edge_types, edge_type_map=edge_type_map,
                    excluded_entity_types=tuple(excluded))


def _from_module(path: str) -> Ontology:
    try:
        module = importlib.import_module(path)
    except Exception as exc:  # noqa: BLE001 - any import failure is the spec's
        raise OntologyError(f"cannot import ontology module {path!r}: {type(exc).__name__}: {exc}") from exc
    entity_types = dict(getattr(module, "ENTITY_TYPES", {}) or {})
    edge_types = dict(getattr(module, "EDGE_TYPES", {}) or {})
    for kind, types in (("ENTITY_TYPES", entity_types), ("EDGE_TYPES", edge_types)):
        for type_name, model in types.items():
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                raise OntologyError(f"{path}.{kind}[{type_name!r}] is not a pydantic model class")
            if not _NAME.match(str(type_name)) or type_name == "Entity":
                raise OntologyError(f"{path}.{kind}: {type_name!r} is not a type name engram can store")
            clash = _RESERVED_ATTRIBUTES & set(model.model_fields)
            if clash:
                raise OntologyError(f"{path}.{kind}[{type_name!r}]: fields {sorted(clash)} are names graphiti uses")
    if not entity_types and not edge_types:
        raise OntologyError(f"module {path!r} defines neither ENTITY_TYPES nor EDGE_TYPES")
    edge_type_map = {tuple(k): list(v) for k, v in dict(getattr(module, "EDGE_TYPE_MAP", {}) or {}).items()}
    for (source, target), names in edge_type_map.items():
        unknown = [n for n in (source, target) if n != "Entity" and n not in entity_types]
        unknown += [n for n in names if n not in edge_types]
        if unknown:
            raise OntologyError(f"{path}.EDGE_TYPE_MAP names types it does not define: {', '.join(map(str, unknown))}")
    return Ontology(name=path, entity_types=entity_types, edge_types=edge_types,
                    edge_type_map=edge_type_map,  # type: ignore[arg-type]
                    excluded_entity_types=tuple(getattr(module, "EXCLUDED_ENTITY_TYPES", ()) or ()))


def load_ontology(spec: str | None) -> Ontology:
    """The ontology a spec names (module docstring); :class:`OntologyError` when it cannot be loaded."""
    spec = (spec or "").strip()
    if spec in ("", DEFAULT):
        return Ontology()
    if spec == GRAPHITI_MCP:
        return ontology_from_mapping({"entity_types": [{"name": n, "description": d}
                                                       for n, d in GRAPHITI_MCP_ENTITY_TYPES]}, name=GRAPHITI_MCP)
    if spec.endswith((".yaml", ".yml", ".json")):
        path = Path(spec).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise OntologyError(f"cannot read ontology file {path}: {exc.strerror or type(exc).__name__}") from exc
        try:
            if spec.endswith(".json"):
                data = json.loads(text)
            else:
                import yaml

                data = yaml.safe_load(text)
        except Exception as exc:  # noqa: BLE001 - a parse error of the user's file
            raise OntologyError(f"ontology file {path} does not parse: {type(exc).__name__}") from exc
        return ontology_from_mapping(data, name=path.name)
    if re.match(r"^[A-Za-z_][\w.]*$", spec):
        return _from_module(spec)
    raise OntologyError(f"ENGRAM_ONTOLOGY={spec!r}: expected default, {GRAPHITI_MCP}, a .yaml/.json file or a "
                        "Python module path")


class OntologySettings(BaseSettings):
    """The entity and edge types extraction uses (engram/graph/ontology.py)."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_ONTOLOGY_", extra="ignore")

    spec: str = Field(
        DEFAULT, validation_alias="ENGRAM_ONTOLOGY",
        description="The deployment's ontology: default (graphiti's Entity only), graphiti-mcp (Graphiti MCP server's "
        "default entity types), a .yaml/.json file (Graphiti MCP's entity_types/edge_types/edge_type_map shape, "
        "attributes allowed) or a Python module with ENTITY_TYPES/EDGE_TYPES/EDGE_TYPE_MAP.",
    )
    workspaces: dict[str, str] = Field(
        default_factory=dict,
        description="JSON object: workspace key -> ontology spec, for the episodes of that workspace's group "
        "(other groups use ENGRAM_ONTOLOGY).",
    )


@dataclass(frozen=True)
class Ontologies:
    """The deployment's ontology and the workspaces' own, by group id."""

    default: Ontology = field(default_factory=Ontology)
    by_group: dict[str, Ontology] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: OntologySettings, group_prefix: str) -> Ontologies:
        return cls(default=load_ontology(settings.spec),
                   by_group={workspace_group(group_prefix, key): load_ontology(spec)
                             for key, spec in settings.workspaces.items()})

    def for_group(self, group_id: str) -> Ontology:
        return self.by_group.get(group_id, self.default)
