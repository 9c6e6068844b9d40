"""A tiny language guess for the session layer: Turkish or English (seed 004's users write Turkish).

Not a language identifier: it tells Turkish from English (the two languages the session close
stage's fixed words exist in) by Turkish-only letters and common function words, and says
English otherwise. Used by the offline rules model to answer in the conversation's language and
by the close stage to tag a session record when the model did not say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

SUPPORTED = ("en", "tr")
_TURKISH_LETTERS = set("ğĞşŞıİ")  # ç, ö, ü also occur in German, French...
_WORD = re.compile(r"[^\W\d_]+", re.UNICODE)
_TURKISH_WORDS = frozenset(
    "ve bir bu şu için ile de da ne çok ama gibi mi mı mu mü değil ben sen biz siz onlar evet hayır nasıl "
    "neden daha sonra şimdi henüz olarak var yok ki kadar her hiç bunu şunu bana sana benim senin "
    "merhaba teşekkürler tamam lütfen".split()
)
_ENGLISH_WORDS = frozenset(
    "the and a an is are was were to of in on for with that this it i you we they my your not but "
    "what how why yes no please thanks can will would should have has do does did be".split()
)


def detect_language(texts: Iterable[str]) -> str | None:
    """``"tr"`` or ``"en"`` for the texts together; None when they hold no word at all."""
    turkish = english = words = 0
    letters = 0
    for text in texts:
        letters += sum(1 for ch in text if ch in _TURKISH_LETTERS)
        for word in _WORD.findall(text):
            words += 1
            low = word.casefold()
            if low in _TURKISH_WORDS:
                turkish += 1
            elif low in _ENGLISH_WORDS:
                english += 1
    if words == 0:
        return None
    # each Turkish-only letter counts as half a function word: a Turkish chat without them
    # (ASCII keyboards) is still told by its words, an English one quoting "İstanbul" stays English
    return "tr" if turkish + letters / 2 > english else "en"
