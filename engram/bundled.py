"""Files engram ships beside its code: the extraction templates and the demo's example session.

The repository keeps them at its root, ``templates/`` and ``examples/``. ``engram/templates`` and
``engram/examples`` are symlinks to those directories, so setuptools packs both, whole, into the
wheel as package data of ``engram`` (pyproject.toml ``[tool.setuptools.package-data]``) and an
editable install reads the very same files through the links. Either way they sit next to this
module: no lookup depends on the source tree or on the working directory.

``engram`` is a namespace package (no ``__init__.py``), which ``importlib.resources.files`` would
merge across every ``engram`` directory on ``sys.path``; this module's own location is exact.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
TEMPLATES_DIR = (PACKAGE_DIR / "templates").resolve()
"""Built-in extraction preprocessing templates (the last level of the template lookup)."""
EXAMPLES_DIR = (PACKAGE_DIR / "examples").resolve()
"""Example conversations (`engram demo` ingests ``coding-session.jsonl``)."""
