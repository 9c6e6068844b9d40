"""Made-up names for the isolation tests: each group (conversation, user, workspace) names its own,
and no name is a substring of another, so a text naming one proves where it came from."""

from __future__ import annotations

import random

# Words every group uses: the bait for a search that crosses groups.
SHARED_WORDS = ["Paris", "deploy", "pipeline", "spring", "failed", "fix", "Berlin", "release", "coffee", "team"]


def unique_names(n: int, seed: int = 16) -> list[str]:
    """``n`` distinct made-up names (consonant-vowel syllables), none a substring of another."""
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        name = "".join(rng.choice("bdfgklmnprstvz") + rng.choice("aeiou") for _ in range(3)).capitalize()
        if not any(name.lower() in o.lower() or o.lower() in name.lower() for o in out):
            out.append(name)
    return out
