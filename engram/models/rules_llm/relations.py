"""Verbs -> relations: :data:`VERB_RELATIONS` (the SCREAMING_SNAKE_CASE relation a verb phrase
gives), and the negation (``NOT_``, ``NO_LONGER_``) and change ("switched from X to Y") cues
that :mod:`.facts` and :mod:`.dedupe` read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


#: (regex, relation, passive). Matched case-insensitively on the clause with entity mentions
#: masked; the nearest match before a target gives its relation. Order breaks ties at one
#: position (longer, more specific phrases first).
VERB_RELATIONS: list[tuple[str, str, bool]] = [
    (r"(?:is|are|was|were|been|being|got|gets) caused by|caused by|due to|because of", "CAUSES", True),
    (r"(?:is|are|was|were|been|being|got|gets) fixed by|fixed by|solved by|resolved by", "FIXES", True),
    (r"(?:is|are|was|were|been|being|got|gets) (?:tested|covered) (?:by|with)|tested with|tested by", "TESTED_BY", False),
    (r"(?:is|are|was|were|been) (?:used|required|imported) by|used by", "USES", True),
    (r"(?:is|are|was|were|been) (?:created|made|written|built|painted|drawn) by", "CREATED", True),
    (r"depends? on|depended on|depending on|relies on|relied on|rely on|requires?|required|requiring|needs|needed", "DEPENDS_ON", False),
    (r"causes?|caused|causing|triggers?|triggered|triggering|leads? to|led to|results? in|resulted in|breaks|broke", "CAUSES", False),
    (r"fix(?:es|ed|ing)?|resolve[sd]?|resolving|solved?|solves|patch(?:es|ed)?|repaired", "FIXES", False),
    (r"decided|decides?|deciding|chose|chosen|chooses?|choosing|opted|opts? for|picked|settled on|went with|going with|go with", "DECIDED", False),
    (r"tested|tests|testing", "TESTED_BY", False),
    (r"(?:moved|moving|moves|move|relocated|relocating|relocates?) (?:back )?to", "LIVES_IN", False),
    (r"(?:lives?|lived|living|resides?|resided|residing|(?:is|am|are|was) based) in|(?:is|am|are|was) from|grew up in", "LIVES_IN", False),
    (r"(?:works?|worked|working|employed|interning|interns?) (?:at|for|with)|joined|joins|hired (?:at|by)", "WORKS_AT", False),
    (r"(?<!looks )(?<!look )(?<!seems )(?<!sounds )(?<!feels )(?<!feel )(?<!just )(?<!more )(?<!would )(?<!'d )"
     r"(?:likes?|liked|loves?|loved|loving|enjoys?|enjoyed|enjoying|prefers?|preferred|(?:a )?(?:big |huge )?fan of|adores?|adored|passionate about)", "LIKES", False),
    (r"went to|goes to|go to|gone to|going to(?= (?:a|an|the|my|our|this|that|(?-i:[A-Z])))|attended|attends?|attending|visited|visits?|visiting|took part in|participated in|joined in", "ATTENDED", False),
    (r"painted|paints?|made|makes|making|created|creates?|creating|built|builds|wrote|writes|written|drew|draws|drawn|designed|designs|baked|knitted|composed|published", "CREATED", False),
    (r"(?:pinned|pins?|pinning|upgraded|upgrades?|upgrading|downgraded|downgrades?|downgrading|bumped|bumps?|bumping)", "USES_VERSION", False),
    (r"(?:switched|switching|switch(?:es)?|migrated|migrating|migrates?|moved|moving|changed|changing|went) (?:over )?(?:from\b.*?)?to", "USES", False),
    (r"uses?|used|using|utili[sz](?:es?|ed|ing)|runs? on|ran on|running on|adopted|adopts?", "USES", False),
    (r"installed|installs?|installing", "INSTALLED", False),
    (r"raises?|raised|raising|throws?|threw|thrown|fails? with|failed with|crash(?:es|ed)? with|errors? (?:out )?with|errored", "RAISES", False),
    (r"imports?|imported|importing", "IMPORTS", False),
    (r"ran|runs|run|running|executed|executes?|launched|started", "RUNS", False),
    # an activity and its end, so "Mo plays golf" and "Mo doesn't play golf any more" /
    # "Lena quit swimming" / "Raj gave up the violin" name the activity (a lower-case object);
    # "go"/"stop" only before a gerund ("goes climbing", "stopped swimming", not "stopped the
    # server"; "#" is a gerund already masked as an entity)
    (r"plays?|played|playing|practi[sc](?:es?|ed|ing)|(?:go|goes|going|went|gone)(?= (?:[a-z]+ing\b|#))", "DOES", False),
    (r"quits?|quitting|gave up|gives? up|giving up|stop(?:s|ped|ping)?(?= (?:[a-z]+ing\b|#))", "QUIT", False),
]
_VERB_RES = [(re.compile(rf"(?<![\w#'-])(?:{rx})(?![\w#])", re.I), rel, passive) for rx, rel, passive in VERB_RELATIONS]
_OBJECT_RELATIONS = {"LIKES", "ATTENDED", "CREATED", "USES", "LIVES_IN", "WORKS_AT", "DOES", "QUIT"}
#: Relations whose object may be one lower-case word ("loves painting", "plays golf", "quit
#: swimming"); after the others a single word is too often no thing ("uses it", "runs tests").
_ONE_WORD_OBJECT_RELATIONS = {"LIKES", "DOES", "QUIT"}

_NEG_NOT = re.compile(r"(?<![\w'])(?:not|never|n't|cannot|no)(?![\w'])|\w+n't\b", re.I)
_NEG_STOP = re.compile(r"\b(?:no longer|stopped|stops|stop|quit|quits|gave up|give up|not anymore|no more)\b", re.I)
#: "any more" after a negated verb makes it an ending: "doesn't play golf any more" -> NO_LONGER_.
_ANY_MORE = re.compile(r"\bany ?more\b", re.I)
_SWITCH_RES = [
    re.compile(
        r"\b(?P<verb>switch(?:ed|es|ing)?|migrat(?:ed|es|ing|e)|mov(?:ed|es|ing|e)|chang(?:ed|es|ing|e)|went|go(?:es|ing)?|relocat(?:ed|es|ing|e))"
        r"(?: over| back)? from (?P<old>.+?) (?:to|for) (?P<new>.+?)(?=[.,;!?]|$| because| since| so | after| when)",
        re.I,
    ),
    re.compile(r"\breplac(?:ed|es|ing|e) (?P<old>.+?) with (?P<new>.+?)(?=[.,;!?]|$| because| since| so )", re.I),
    re.compile(r"\b(?P<new>[\w.=+/-]+(?: [\w.=+/-]+){0,2}) (?:instead of|rather than) (?P<old>.+?)(?=[.,;!?]|$| because| since| so | now\b)", re.I),
]

@dataclass
class _VerbHit:
    start: int
    end: int
    relation: str
    passive: bool


def _find_verbs(masked: str) -> list[_VerbHit]:
    hits: list[_VerbHit] = []
    for rx, rel, passive in _VERB_RES:
        for m in rx.finditer(masked):
            if any(not (m.end() <= h.start or m.start() >= h.end) for h in hits):
                continue
            hits.append(_VerbHit(m.start(), m.end(), rel, passive))
    hits.sort(key=lambda h: h.start)
    return hits
