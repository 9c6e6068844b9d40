"""The extractor's own secret scrub of an episode, before anything of it is prompted or stored.

Episodes from the turn-detector are scrubbed already (it scrubs every chat message), but an
episode is a public subject (``engram.episode.<group>``): promotions, MCP ``add_memory`` text
episodes and any raw Episode publisher reach the graph without the turn-detector. Scrubbing is
idempotent and its trigger check makes text without a secret's telltale cost one regex search,
so every episode goes through it here, whatever door it came through.
"""

from __future__ import annotations

from engram.text.secrets import scrub_secrets
from engram.schemas import Episode


def _scrubbed(text: str | None) -> tuple[str | None, int]:
    if not text:
        return text, 0
    result = scrub_secrets(text)
    return result.text, sum(result.counts.values())


def scrubbed_episode(episode: Episode) -> Episode:
    """``episode`` with every text the extractor prompts or stores scrubbed: the content, the
    source description, the speakers' names, a per-episode extraction prompt and a triplet's
    names and sentence; the same object
    when none held a secret. The episode's stats count what was found here too."""
    update: dict[str, object] = {}
    found = 0
    for field in ("content", "source_description"):
        text, n = _scrubbed(getattr(episode, field))
        if n:
            update[field], found = text, found + n
    messages = []
    for message in episode.messages:
        name, n = _scrubbed(message.name)
        messages.append(message.model_copy(update={"name": name}) if n else message)
        found += n
    if any(m is not o for m, o in zip(messages, episode.messages, strict=True)):
        update["messages"] = messages
    override = episode.extraction
    if override is not None and isinstance(override.preprocessing_prompt, str):
        prompt, n = _scrubbed(override.preprocessing_prompt)
        if n:
            update["extraction"], found = override.model_copy(update={"preprocessing_prompt": prompt}), found + n
    if episode.triplet is not None:  # a fact given whole is stored as given: its names and sentence too
        triplet_update: dict[str, object] = {}
        for field in ("source", "target", "fact"):
            text, n = _scrubbed(getattr(episode.triplet, field))
            if n:
                triplet_update[field], found = text, found + n
        if triplet_update:
            update["triplet"] = episode.triplet.model_copy(update=triplet_update)
    if not found:
        return episode
    update["stats"] = episode.stats.model_copy(update={"secrets_scrubbed": episode.stats.secrets_scrubbed + found})
    return episode.model_copy(update=update)
