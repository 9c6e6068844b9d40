"""schemas/asyncapi.yaml names every subject the code publishes, subscribes or requests on.

The check reads the source (services/ and engram/) rather than a list: every reference to a
subject constant or helper of schemas/subjects.py, and every literal ``engram.*`` subject handed to
a publish/subscribe/request call, must match a channel address of the generated document. A
literal in the *stored* form of a partitioned stream (``engram.episode.<p>.<group>``, made by a
subject transform in engram/runtime/topology.py) counts as the published subject it was made from.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from engram.settings import EngramSettings
from engram.runtime.topology import Topology
from engram.schemas import subjects
from engram.schemas.export import ASYNCAPI_FILE, CHANNELS, asyncapi_document, missing_channels, subject_constants

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("services", "engram")
# Functions and methods that take a subject as first argument (or subject=...).
SUBJECT_CALLS = {"publish", "subscribe", "subscriber", "pull_subscribe", "publisher", "request", "ask",
                 "_ask_memory", "_admin", "_delete", "_publish"}


@dataclass(frozen=True)
class Use:
    subject: str  # a template ("engram.in.message.{session}") or a literal with * for f-string parts
    where: str  # path:line


def _helper_templates() -> dict[str, str]:
    """subjects.<helper> -> the template it formats (found by calling it with a token)."""
    out = {}
    templates = subject_constants().values()
    for name, fn in vars(subjects).items():
        if not inspect.isfunction(fn) or fn.__module__ != subjects.__name__:
            continue
        params = inspect.signature(fn).parameters
        try:
            result = fn(*["tok"] * len(params))
        except (TypeError, ValueError, AttributeError):
            continue
        if not isinstance(result, str) or not result.startswith("engram."):
            continue
        for template in templates:
            if re.fullmatch(re.sub(r"\\\{[a-z_]+\\\}", "[^.]+", re.escape(template)), result):
                out[name] = template
    return out


def _tuple_constants() -> dict[str, tuple[str, ...]]:
    return {name: value for name, value in vars(subjects).items()
            if name.isupper() and isinstance(value, tuple) and value and all(
                isinstance(v, str) and v.startswith("engram.") for v in value)}


def _literal(node: ast.expr) -> str | None:
    """A string or f-string argument as a subject pattern (f-string parts become ``*``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
    return None


def _call_name(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def subject_uses(source: str, where: str) -> list[Use]:
    """Subjects one module uses: references to engram.schemas.subjects names, and literal ``engram.*``
    subjects passed to a publish/subscribe/request call."""
    constants, helpers, tuples = subject_constants(), _helper_templates(), _tuple_constants()
    tree = ast.parse(source)
    imported: dict[str, str] = {}  # local name -> subjects attribute, for `from engram.schemas.subjects import X`
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "engram.schemas.subjects":
            imported.update({a.asname or a.name: a.name for a in node.names})
    uses: list[Use] = []

    def add(name: str, line: int) -> None:
        at = f"{where}:{line}"
        if name in constants:
            uses.append(Use(constants[name], at))
        elif name in helpers:
            uses.append(Use(helpers[name], at))
        elif name in tuples:
            uses.extend(Use(t, at) for t in tuples[name])

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "subjects":
            add(node.attr, node.lineno)
        elif isinstance(node, ast.Name) and node.id in imported:
            add(imported[node.id], node.lineno)
        elif isinstance(node, ast.Call) and _call_name(node) in SUBJECT_CALLS:
            args = list(node.args[:1]) + [k.value for k in node.keywords if k.arg == "subject"]
            for arg in args:
                text = _literal(arg)
                if text is not None and text.startswith("engram."):
                    uses.append(Use(text, f"{where}:{node.lineno}"))
    return uses


def scan(roots: list[Path]) -> list[Use]:
    uses = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            uses.extend(subject_uses(path.read_text(), str(path.relative_to(ROOT))))
    return uses


def _tokens_match(a: list[str], b: list[str]) -> bool:
    """Two subject patterns can name the same subject ({param} and * are one token, > the rest)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x == ">" or y == ">":
            return True
        if x != y and not (x == "*" or y == "*" or x.startswith("{") or y.startswith("{")):
            return False
    return len(a) == len(b)


def _stored_forms() -> list[tuple[list[str], list[str]]]:
    """(stored pattern, published pattern) of every stream subject transform in engram/runtime/topology.py."""
    out = []
    for cfg in Topology.from_settings(EngramSettings()).streams():
        t = cfg.subject_transform
        if t is not None:
            stored = ["*" if "{{" in tok else tok for tok in t.dest.split(".")]
            out.append((stored, t.src.split(".")))
    return out


def missing_from(doc: dict, uses: list[Use]) -> dict[str, list[str]]:
    """Used subjects that no channel address of ``doc`` matches: subject -> where it is used."""
    addresses = [c["address"].split(".") for c in doc["channels"].values()]
    stored = _stored_forms()
    missing: dict[str, list[str]] = {}
    for use in uses:
        candidates = [use.subject.split(".")]
        candidates += [published for pattern, published in stored if _tokens_match(candidates[0], pattern)
                       and len(candidates[0]) == len(pattern)]
        if not any(_tokens_match(c, a) for c in candidates for a in addresses):
            missing.setdefault(use.subject, []).append(use.where)
    return missing


def _document() -> dict:
    return yaml.safe_load(ASYNCAPI_FILE.read_text())


def test_every_subject_the_code_uses_is_in_asyncapi() -> None:
    uses = scan([ROOT / d for d in SCANNED])
    found = {u.subject for u in uses}
    # the scan really sees the code: subjects only one service uses, via constant and via helper
    assert {subjects.SCHED_IDLE, subjects.CTL_FORGET_SESSIONS, subjects.GRAPH_GROUP_DELETE,
            subjects.MEMORY_NOTE_SAVE, subjects.SESSION_CLOSED, subjects.CONTEXT} <= found
    assert not missing_from(_document(), uses), "add a channel in schemas/export.py CHANNELS and regenerate"


def test_the_check_fails_when_a_used_subject_has_no_channel() -> None:
    """The same check against a copy of the document without two channels names both, with where
    the code uses them."""
    doc = _document()
    for cid in ("schedIdle", "ctlForgetSessions"):
        del doc["channels"][cid]
    missing = missing_from(doc, scan([ROOT / d for d in SCANNED]))
    assert set(missing) == {subjects.SCHED_IDLE, subjects.CTL_FORGET_SESSIONS}
    assert any(w.startswith("services/turn_detector/app.py:") for w in missing[subjects.SCHED_IDLE])
    assert any(w.startswith("services/recall/admin.py:") for w in missing[subjects.CTL_FORGET_SESSIONS])


def test_literal_subjects_are_checked_too() -> None:
    source = '''
async def f(js, nc, broker, sid, group):
    await js.publish("engram.bogus.created", b"")
    await nc.request(f"engram.graph.{sid}.export", b"")
    await js.publish(f"engram.in.message.{sid}", b"")            # a channel: fine
    await js.subscribe(f"engram.episode.*.{group}")              # the stored, partitioned form: fine
    log.info("engram.not.a.subject")                             # not a subject call
    @broker.subscriber(subject="engram.ctl.other")
    async def h(m): ...
'''
    missing = missing_from(_document(), subject_uses(source, "example.py"))
    assert set(missing) == {"engram.bogus.created", "engram.graph.*.export", "engram.ctl.other"}
    assert missing["engram.bogus.created"] == ["example.py:3"]


def test_export_refuses_a_subject_constant_without_a_channel() -> None:
    table = {cid: spec for cid, spec in CHANNELS.items() if cid != "schedIdle"}
    assert missing_channels(table) == {"SCHED_IDLE": subjects.SCHED_IDLE}
    with pytest.raises(ValueError, match="SCHED_IDLE"):
        asyncapi_document(table)
    assert missing_channels() == {}
