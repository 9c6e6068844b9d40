"""Token counting shared by the extractor (chunk sizes), recall (context budgets) and the LLM
accounting wrappers (engram/models): real cl100k tokens, offline.

The cl100k encoding file ships in the ``bpe-openai`` package; :func:`token_counter` places it
where tiktoken looks for it, so no process ever downloads it. Lives in engram/ because several
services and engram's own model wrappers use it (arrows point down: services -> engram).
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable
from functools import cache
from importlib import resources

logger = logging.getLogger("engram.tokens")

CountTokens = Callable[[str], int]


#: tiktoken's source of the cl100k encoding; its cache file is named by the sha1 of this URL.
CL100K_URL = "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken"
#: sha256 of the decompressed encoding file (tiktoken checks the same hash).
CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
#: fallback estimate when the tokenizer cannot be prepared.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    """Fallback token estimate: ``ceil(len(text) / 4)`` characters per token (0 for "")."""
    return -(-len(text) // CHARS_PER_TOKEN)


def tiktoken_cache_dir() -> str:
    """The directory tiktoken reads cached encodings from (same resolution as tiktoken):
    ``TIKTOKEN_CACHE_DIR``, else ``DATA_GYM_CACHE_DIR``, else ``<tmp>/data-gym-cache``."""
    for var in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR"):
        if var in os.environ:
            return os.environ[var]
    return os.path.join(tempfile.gettempdir(), "data-gym-cache")


def _prepare_cl100k_cache() -> str:
    """Make sure tiktoken's cache holds the cl100k file, decompressed from bpe-openai's copy.

    Returns the cache file path. Raises (OSError, ValueError, ImportError ...) on failure.
    """
    cache_dir = tiktoken_cache_dir()
    if not cache_dir:
        raise ValueError("tiktoken caching is disabled (empty TIKTOKEN_CACHE_DIR)")
    path = os.path.join(cache_dir, hashlib.sha1(CL100K_URL.encode()).hexdigest())
    try:
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() == CL100K_SHA256:
                return path
    except OSError:
        pass
    packed = resources.files("bpe_openai").joinpath("data", "cl100k_base.tiktoken.gz").read_bytes()
    data = gzip.decompress(packed)
    if hashlib.sha256(data).hexdigest() != CL100K_SHA256:
        raise ValueError("bpe-openai's cl100k_base file does not match tiktoken's expected hash")
    os.makedirs(cache_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cache_dir, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: concurrent preparers never expose a partial file
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


@cache
def token_counter() -> CountTokens:
    """A callable counting cl100k tokens, prepared once per process and with no network.

    The encoding file comes from the ``bpe-openai`` package and is placed where tiktoken looks
    for it (:func:`tiktoken_cache_dir`, file named by the sha1 of :data:`CL100K_URL`). If that
    fails, a warning is logged and :func:`estimate_tokens` (characters / 4) is returned instead.
    Special-token text such as ``<|endoftext|>`` is counted as ordinary text.
    """
    try:
        _prepare_cl100k_cache()
        import tiktoken

        encoding = tiktoken.get_encoding("cl100k_base")
        encoding.encode_ordinary("warm up")
    except Exception as exc:  # any failure means: no exact tokenizer here
        logger.warning(
            "cl100k tokenizer unavailable (%s: %s); estimating tokens as characters/%d",
            type(exc).__name__,
            exc,
            CHARS_PER_TOKEN,
        )
        return estimate_tokens

    def count_cl100k(text: str) -> int:
        return len(encoding.encode_ordinary(text))

    return count_cl100k
