"""Build the engram-client wheel (clients/python/: `engram_client` with engram's contract inside, no more).

    python tools/build_client.py [--out dist/]

pip builds clients/python in place, following its symlink into the repository root, so the
thin client always ships the very schemas engram runs on. Prints the wheel's path.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLIENT = ROOT / "clients" / "python"
ALLOWED = ("engram_client/", "engram_client-")  # engram_client-<version>.dist-info/


def build(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("engram_client-*.whl"))
    try:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(out),
                        str(CLIENT)], check=True)
    finally:  # setuptools' in-place leftovers, not part of the source tree
        for leftover in (CLIENT / "build", *CLIENT.glob("*.egg-info")):
            shutil.rmtree(leftover, ignore_errors=True)
    built = sorted(set(out.glob("engram_client-*.whl")) - before) or sorted(out.glob("engram_client-*.whl"))
    wheel = built[-1]
    names = zipfile.ZipFile(wheel).namelist()
    stray = [n for n in names if not n.startswith(ALLOWED)]
    if stray or not any(n.startswith("engram_client/schemas/") for n in names):
        raise SystemExit(f"{wheel.name} holds more or less than engram_client and its schemas: {stray[:5]}")
    return wheel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
