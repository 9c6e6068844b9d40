"""A deterministic rules extractor behind graphiti-core's ``LLMClient`` interface.

**This is not a language model.** :class:`RulesExtractorClient` is engram's offline default
"LLM": it reads the prompt text that graphiti-core 0.31 builds, finds the blocks it needs
(``<CURRENT MESSAGES>``, ``<ENTITY TYPES>``, ``<ENTITIES>``, ``<EXISTING FACTS>``, ...) and
answers with regexes and word lists. No model, no network, no randomness: the same prompt
always gets the same answer. It exists so that engram runs (and its tests run) with no model
at hand; its recall and precision are far below a real LLM's.

Response models answered (dispatched on ``response_model.__name__``):

* ``CombinedExtraction`` (``extract_nodes_and_edges.extract_message``): entities + facts from
  ``<CURRENT MESSAGES>`` in one pass. ``[CONTEXT EPISODE]`` sections and PREVIOUS MESSAGES are
  never extracted from (previous messages only teach speaker names, to type them Person).
* ``ExtractedEntities`` (``extract_nodes.extract_message`` / ``extract_text`` / ``extract_json``)
  and ``ExtractedEdges`` (``extract_edges.edge``; endpoints are only names from the prompt's
  ``<ENTITIES>`` list, ``valid_at``/``invalid_at`` by the timestamp rules against
  ``<REFERENCE_TIME>``): the same logic split in two.
* ``NodeResolutions`` (``dedupe_nodes.nodes``) and ``NodeDuplicate`` (``dedupe_nodes.node``):
  a duplicate is an existing candidate whose name equals the new name case-insensitively after
  stripping punctuation, or differs only by a trailing "s" on the last word; two names whose
  specific types (labels other than ``Entity``) are both set and disjoint are never duplicates.
  Otherwise ``duplicate_candidate_id = -1``.
* ``EdgeDuplicate`` (``dedupe_edges.resolve_edge``): see "Edge resolution" below.
* ``EdgeTimestamps`` / ``BatchEdgeTimestamps``: dates mentioned in the fact text, else nulls.
* ``EntitySummaries`` (engram's summary-gate prompt, services/summary_gate/summarize.py): each
  entity's ``facts`` in the order given (newest first), de-duplicated, joined as sentences and
  cut at a sentence boundary to ``max_chars``; ``no_longer_true`` facts are never used and the
  previous summary is ignored, so the summary is exactly the active facts.
* anything else (summaries, attributes, ``response_model=None``): a minimal valid instance
  built from the pydantic model (defaults, empty lists/strings/dicts, ``None`` for optionals,
  0/False for numbers/bools), counted in ``self.unhandled[<model name>]``.

Entities (regex/heuristics, per speaker block; at most ``max_entities_per_message`` new ones
per block and ``max_entities`` per prompt):

* files and paths: tokens with a known extension (``src/app.py``, ``pyproject.toml``,
  ``/etc/x.conf``, ``.env``), well-known file names (``Dockerfile``, ``Makefile``), paths that
  start with ``/``, ``~/``, ``./`` or a common source directory (``src/``, ``tests/``...);
* tools and commands: a fixed vocabulary of CLIs (``pytest``, ``pip``, ``docker compose``,
  ``git``...) -- words that are also English (``make``, ``go``, ``black``, ``requests``) only in
  backticks or in command position -- the first word of a backticked command, the installer
  and the packages of ``pip install x`` / ``uv add x`` / ``npm install x`` ...;
* libraries (typed ``Concept`` as engram's template asks, else ``Tool``) and versions:
  ``pydantic==2.14``, ``httpx 0.28``, ``Python 3.11``, "upgraded pydantic to 2.15" give the
  package and a version entity (``pydantic==2.14``, ``httpx 0.28``) linked by ``USES_VERSION``;
* errors: ``*Error``/``*Exception``/``*Warning`` names (with ``[Errno N]`` or a short quoted
  message: ``OSError: [Errno 98]``, ``KeyError: 'group_id'``), errno codes, ``Segmentation
  fault``, HTTP status phrases, ``Traceback`` when no error type is named;
* code identifiers: CamelCase class names and backticked identifiers (``Concept``);
* people, places, organisations: runs of capitalised words, split at stopwords. At the start
  of a sentence a run loses leading common words and verb forms, and a lone capitalised word
  there is kept only with support (a speaker or known name, or the same word capitalised
  mid-sentence elsewhere): chat is full of "Wow", "Got", "Lost" sentence starters. Speakers come
  from ``role (Name):`` and ``Name:`` prefixes (the form engram's ``render_turn`` writes;
  unnamed ``user:``/``assistant:`` become "User" (Person) and "Assistant" (Entity)); "my dad"
  -> "Caroline's dad"; "<Capitalised> ... group/club/center" phrases ("LGBTQ support group");
  quoted titles ("Finding Freedom"); short lower-case objects of a few verbs ("loves
  painting", "painted a lake sunrise"). Person/Place/Organization come from cues (speaker
  names, "with", "met", "in"/"from", "works at", suffixes like "University", "Park", "Inc") and
  short lists of well-known places and organisations, else the default type;
* dates: ISO dates, "8 May 2023", "May 8, 2023", "May 2023" (type ``Entity``; as fact targets
  they get ``OCCURRED_ON``); a ``Decision`` entity ("decided to X") only when that type exists.

``entity_type_id``: the id of the first custom type in ``<ENTITY TYPES>`` named for the
entity's category (case-insensitive): File; Tool; Concept, else Tool, for libraries and
versions; Error; Person; Place or Location; Organization or Organisation; Decision; Concept
for code identifiers. Otherwise the default ``Entity`` type's id.

A name that is empty, one character, longer than 80 characters, or made only of stopwords
and pronouns ("Is", "It", "This", "The", "I", "We", "It Is"...) is never emitted:
FalkorDB 4.16 crashed on such names (see shared/PLATFORM-NOTES.md). :func:`is_safe_entity_name`
is the guard; :data:`STOPWORDS` is its list.

Facts: each sentence is split into clauses (at ";", and at "when", "because", "but", ...).
A clause with two or more entity mentions (a first-person pronoun counts as the speaker)
gives facts from its actor (the subject before the first mapped verb, co-subjects joined by
"and", the speaker for "I"/"we", the agent after a passive "caused by"/"fixed by") to each
other mention (at most 5); a mention right before a mapped verb starts a new subject ("I love
painting and my kids love pottery" -> Melanie LIKES painting, Melanie's kids LIKES pottery).
A clause with one entity gives speaker -> entity; a package gets ``USES_VERSION`` to its
version entity; a date target gets ``OCCURRED_ON``. The relation
is the SCREAMING_SNAKE_CASE of the nearest mapped verb before the target (see
:data:`VERB_RELATIONS`: USES, FIXES, DEPENDS_ON, DECIDED, CAUSES, TESTED_BY, LIVES_IN, WORKS_AT,
LIKES, ATTENDED, CREATED, USES_VERSION, INSTALLED, RAISES, RUNS, IMPORTS), prefixed ``NOT_``
after "not"/"never"/"n't" and ``NO_LONGER_`` after "no longer"/"stopped"/"quit" or for the old
side of "switched from X to Y"; else RELATES_TO. The fact text is the sentence with "I", "my",
"me" replaced by the speaker's name (with a crude third-person verb fix: "I love" -> "Caroline
loves"), cut to ``max_fact_chars`` (300). A traceback in a code block gives
``<error> OCCURRED_IN <file>``.

Edge resolution (``EdgeDuplicate``; ``idx`` numbering runs over EXISTING FACTS then FACT
INVALIDATION CANDIDATES, as graphiti sends them):

* duplicates: EXISTING FACTS whose normalised text (lower case, punctuation and extra spaces
  removed) equals the new fact's;
* contradictions (either list), any of:
  1. polarity: exactly one of the two facts carries a negation cue ("not", "n't", "never",
     "no longer", "stopped", "quit", "left", "gave up", "anymore") and at least 75% (and at least
     2) of the old fact's content words (crudely stemmed, stopwords and cues removed) occur in
     the new fact;
  2. replacement: the new fact says "switched/moved/migrated/changed/went from X to Y",
     "replaced X with Y" or "Y instead of X", the old fact contains X's content words and the
     two facts have the same first content word (the subject) or share another content word;
  3. single-valued relation: both facts state LIVES_IN (lives in, moved to, relocated to, is
     based in) or WORKS_AT (works at/for, joined) with the same subject words before the verb
     and different object words after it;
  4. versions: both facts give a version of the same package and the versions differ.

Token accounting: every call appends a :class:`CallRecord` (prompt name, response model,
prompt tokens of all messages as sent, completion tokens of the JSON answer) to
``self.calls`` and feeds graphiti's ``self.token_tracker``. Tokens are counted with
``services.extractor.chunking.token_counter()`` (real cl100k via tiktoken, offline) when that
module is importable; otherwise, and when that counter itself falls back, with
``ceil(len(text) / 4)`` (``self.token_counting`` says which).

Known limits (heuristics, not language understanding):

* no coreference ("she", "it", "the city" are never resolved; only "I/me/my/we" -> speaker);
* capitalised-word detection misses lower-case names, takes capitalised common words
  mid-sentence ("the Best day"), and drops a name that only ever starts sentences ("Jordan
  went home."); nicknames are separate entities ("Mel" vs "Melanie");
  person/place/organisation typing is cue-based and often falls back to ``Entity``;
* the tool/library vocabulary is fixed; unknown tools are found only in backticks or install
  commands; lower-case objects are taken only after a few verbs;
* relations come from the nearest mapped verb, so long sentences with several verbs, lists,
  or nested clauses get coarse or wrong relations and actors; "and" between two clauses is not
  split; the third-person rewrite of "I <verb>" is a suffix rule;
* dates: no times of day outside ISO timestamps, no ranges other than "from X to Y"/"until X", no "next week" (future
  dates are left to graphiti's own normalisation), years alone only after "in/since/..."
* contradictions are lexical: paraphrases ("resides in" vs "lives in" work, "left Boston for
  Austin" does not), and the 75% overlap threshold can both miss and over-fire;
* prompt parsing relies on graphiti 0.31's tag names; a message containing a closing tag such
  as ``</CURRENT MESSAGES>`` cuts its block short.
"""

from __future__ import annotations

import ast
import calendar
import contextvars
import enum
import json
import logging
import re
import types as _pytypes
import typing
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import DEFAULT_MAX_TOKENS, LLMConfig, ModelSize
from graphiti_core.prompts.models import Message
from pydantic import BaseModel

logger = logging.getLogger("engram.rules_llm")

CountTokens = Callable[[str], int]

MAX_ENTITIES_PER_MESSAGE = 20
MAX_ENTITIES = 60
MAX_FACTS = 80
MAX_FACT_CHARS = 300
MAX_NAME_CHARS = 80
MAX_TARGETS_PER_CLAUSE = 5

# ---------------------------------------------------------------------------------------------
# Word lists
# ---------------------------------------------------------------------------------------------

#: Words that can never be an entity name on their own (nor any name made only of them).
#: Pronouns, determiners, auxiliaries, conjunctions, prepositions, RediSearch's default
#: stopwords (graphiti's fulltext index) and frequent function words.
STOPWORDS: frozenset[str] = frozenset(
    """
    a an the this that these those there here it its it's itself i i'm i've i'll i'd me my mine
    myself we we're we've we'll we'd us our ours ourselves you you're you've you'll you'd your
    yours yourself yourselves he he's him his himself she she's her hers herself they they're
    they've they'll they'd them their theirs themselves one ones someone somebody something
    anyone anybody anything everyone everybody everything nobody nothing none who whom whose
    which what whatever whoever when where why how is am are was were be been being do does did
    doing done have has had having will would shall should can could may might must ought isn't
    aren't wasn't weren't don't doesn't didn't haven't hasn't hadn't won't wouldn't can't cannot
    couldn't shouldn't mustn't and or but nor so yet if then else than because as while until
    unless although though whether since for of to in on at by with from into onto upon about
    above below over under between among through during before after against without within
    along across behind beyond near off out up down again further once also just only very too
    not no yes such both each few more most other some any all own same s t let let's lets
    oh ok okay hi hey hello yeah yep nope well now
    """.split()
)

#: Capitalised words that start sentences but are not names (dropped at a sentence start).
COMMON_WORDS: frozenset[str] = frozenset(
    """
    thanks thank please sure great good nice cool awesome wow wonderful amazing fantastic
    perfect right alright absolutely definitely really actually anyway maybe perhaps probably
    also still even already yet so well first next then finally last now today tonight
    yesterday tomorrow recently lately sometimes always never often usually honestly basically
    apparently unfortunately luckily hopefully however therefore otherwise meanwhile besides
    sounds looks seems glad happy sorry sad congrats congratulations love like hope wish
    guess think know see look check try run use add remove fix update install make let note
    done fixed added removed updated changed created tested running using adding fixing
    same new old another every many much lots plenty few several good bad best better worst
    hmm haha lol omg btw fyi imo tbh thx ty np welcome bye goodbye cheers agreed true false
    great! sure! yes no nah ah uh um er what's that's it's there's here's i'm i've i'll you're
    we're they're he's she's let's don't doesn't didn't can't won't isn't wasn't
    step example output input result results error warning info debug traceback file files
    question answer summary status solution problem issue reason cause context goal todo errno
    episode
    something anything everything nothing everyone someone anyone nobody everybody
    got gonna wanna gotta woah whoa man dude yay aww ugh oops ooh yup totally super lost found
    wait listen honestly seriously gosh jeez geez bro sis folks guys hey! hi! thx
    """.split()
)

#: Bare nouns too generic to be an entity (graphiti's own prompt lists most of them).
GENERIC_NOUNS: frozenset[str] = frozenset(
    """
    thing things stuff day days time times life people person work way ways lot lots bit one
    ones place places idea ideas fun week weeks month months year years today tomorrow
    yesterday night morning evening afternoon moment moments while kind sort type part parts
    photo pic picture image video post story event game meeting class workshop competition
    government school company team office family friend friends home house job world
    everything something anything nothing someone everyone going doing being having getting
    making taking trying feeling feelings sense support help change changes news word words
    lot problem problems issue issues question questions answer answers reason fact facts
    point points case cases number numbers end start beginning rest use tests test code file
    files error errors bug bugs fix fixes version versions command commands tool tools
    """.split()
)

KIN_WORDS = (
    "dad|father|mom|mum|mother|parents|sister|sisters|brother|brothers|siblings|husband|wife|"
    "partner|boyfriend|girlfriend|fianc[eé]e?|spouse|son|sons|daughter|daughters|kids|children|"
    "child|baby|uncle|aunt|cousin|cousins|grandma|grandpa|grandmother|grandfather|grandparents|"
    "friend|friends|boss|manager|teacher|neighbou?r|roommate|coworker|colleague|"
    "dog|dogs|cat|cats|puppy|kitten|pet|pets|horse"
)
_PET_WORDS = {"dog", "dogs", "cat", "cats", "puppy", "kitten", "pet", "pets", "horse"}

#: Command-line tools: always a tool when seen as a word.
CLI_TOOLS: frozenset[str] = frozenset(
    """
    pytest pip pip3 pipx uv uvx poetry-core npm npx pnpm yarn docker docker-compose kubectl
    minikube helm terraform ansible git gh cargo rustc rustup python python3 ipython jupyter
    nodejs node.js deno curl wget ssh scp rsync systemctl journalctl grep ripgrep sed awk jq
    ruff mypy pyright flake8 pylint isort tox nox conda mamba homebrew apt-get dpkg nginx
    redis-server redis-cli psql pg_dump mysql sqlite3 mongosh gcc g++ clang cmake bazel gradle
    maven mvn bash zsh tmux vim neovim nvim emacs vscode pycharm uvicorn gunicorn hypercorn
    nats-server nats-cli pre-commit webpack vite eslint prettier tsc ffmpeg openssl htop
    pyenv virtualenv venv twine hatch pdm setuptools wheel alembic
    """.split()
)

#: Libraries, frameworks, databases and platforms (typed Concept when available, else Tool).
LIBRARIES: frozenset[str] = frozenset(
    """
    pydantic httpx numpy pandas scipy matplotlib seaborn fastapi django sqlalchemy starlette
    aiohttp asyncio tiktoken langchain llamaindex llama-index pytorch torch tensorflow keras
    scikit-learn sklearn huggingface faststream nats-py pytest-asyncio pytest-cov tenacity
    graphiti graphiti-core falkordb neo4j redis postgres postgresql mysql sqlite mongodb
    elasticsearch opensearch kafka rabbitmq nats jetstream kubernetes k8s react vue angular
    svelte nextjs next.js nuxt tailwind typescript javascript graphql grpc protobuf openapi
    jinja2 pyyaml orjson ujson loguru structlog prometheus grafana sentry airflow dbt hadoop
    opentelemetry posthog boto3 botocore uvloop anyio trio httpcore urllib3 certifi
    sentence-transformers transformers ollama vllm llama.cpp whisper spacy nltk gensim
    pyarrow polars duckdb clickhouse cassandra dynamodb supabase firebase streamlit gradio
    flask celery pytest-mock mock
    """.split()
)

#: Tool/library words that are also plain English: only in backticks, in command position
#: ("make test", "go build", "pip install requests", "import requests") or with a version.
AMBIGUOUS_TECH: dict[str, str] = {
    # word: regex that must follow (command position); "" = only by the other cues
    "make": r"(?:test|tests|lint|build|install|clean|check|all|run|dev|fmt|format|docs|up|down)\b",
    "go": r"(?:build|run|test|mod|get|vet|fmt|install)\b",
    "node": r"[\w./-]+\.(?:js|mjs|cjs|ts)\b",
    "black": r"(?:\.|[\w./-]+\.py\b|--)",
    "poetry": r"(?:add|install|lock|run|update|shell|build|publish)\b",
    "celery": r"(?:worker|beat|-A)\b",
    "apt": r"(?:install|update|upgrade|remove)\b",
    "brew": r"(?:install|update|upgrade|services)\b",
    "code": r"\.\s*$|\.(?=\s)",
    "requests": "",
    "click": "",
    "rich": "",
    "hypothesis": "",
    "express": "",
    "spark": "",
    "rust": "",
    "swift": "",
    "ruby": "",
    "java": "",
    "windows": "",
}

#: Organisations and places the capitalised-name rules cannot type on their own.
KNOWN_ORGS: frozenset[str] = frozenset(
    """
    google microsoft apple amazon meta facebook openai anthropic github gitlab mozilla nvidia
    ibm oracle intel amd netflix spotify uber airbnb twitter linkedin stripe shopify slack
    zoom salesforce adobe samsung tesla nasa unicef who un eu fbi cia bbc cnn nhs ikea
    walmart starbucks mcdonald's harvard stanford mit oxford cambridge yale princeton
    """.split()
)
KNOWN_PLACES: frozenset[str] = frozenset(
    """
    sweden norway denmark finland germany france spain portugal italy greece ireland england
    scotland wales britain uk usa us america canada mexico brazil argentina chile peru colombia
    japan china india korea vietnam thailand indonesia australia zealand africa egypt kenya
    nigeria morocco turkey russia ukraine poland austria switzerland netherlands belgium
    europe asia paris london berlin madrid rome tokyo beijing delhi mumbai sydney melbourne
    toronto vancouver montreal boston chicago seattle denver austin dallas houston miami
    atlanta phoenix portland nyc york francisco angeles la sf dc washington california texas
    florida oregon colorado arizona nevada utah ohio michigan georgia virginia carolina
    hawaii alaska massachusetts stockholm oslo copenhagen amsterdam dublin lisbon vienna
    prague budapest warsaw athens istanbul dubai singapore seoul bangkok
    """.split()
)
_ORG_SUFFIX = re.compile(
    r"(?:Inc\.?|Corp\.?|Corporation|Ltd\.?|LLC|GmbH|AG|Co\.?|Company|University|College|School|"
    r"Institute|Foundation|Association|Agency|Bank|Labs?|Group|Club|Society|Church|Hospital|"
    r"Academy|Ministry|Department|Council|Committee|Studios?|Records|Press|Times|News|Team)$"
)
_PLACE_SUFFIX = re.compile(
    r"(?:City|Park|Street|St\.?|Avenue|Ave\.?|Road|Rd\.?|Lake|River|Mountains?|Mount|Island|"
    r"Islands|Beach|Bay|County|State|Valley|Square|Bridge|Airport|Station|Falls|Canyon|Forest|"
    r"Desert|Coast|Harbor|Harbour|Village|Town|Hills?)$"
)
_GROUP_HEADS = {
    # head noun -> category
    **dict.fromkeys(
        "group club team band choir league society community association charity company "
        "organization organisation nonprofit shelter union".split(),
        "org",
    ),
    **dict.fromkeys(
        "school university college church hospital clinic museum library gallery studio "
        "center centre gym cafe café restaurant bar store shop park".split(),
        "place",
    ),
    **dict.fromkeys(
        "meetup conference festival parade workshop class course camp retreat concert "
        "project program programme event march rally ceremony".split(),
        "thing",
    ),
}

#: Common top-level directories: "src/engram" is a path even without an extension.
KNOWN_DIRS = frozenset(
    "src lib libs app apps tests test docs doc scripts bin etc var usr opt home tmp config "
    "configs services service deploy deployment templates schemas examples bench benchmarks "
    "data assets static public build dist pkg cmd internal node_modules migrations tools".split()
)
FILE_EXTENSIONS = (
    "py|pyi|pyx|ipynb|toml|cfg|ini|conf|json|jsonl|yaml|yml|md|rst|txt|csv|tsv|xml|html|htm|css|"
    "scss|js|mjs|cjs|ts|tsx|jsx|vue|svelte|go|rs|java|kt|kts|scala|c|h|cc|cpp|hpp|cs|rb|php|"
    "swift|sh|bash|zsh|ps1|bat|sql|lock|env|log|gradle|properties|proto|graphql|tf|tfvars|"
    "dockerfile|mk|cmake|pem|crt|service|timer|socket|plist|db|sqlite|parquet|pdf|png|jpe?g|"
    "gif|svg|zip|gz|tgz|whl|so|dll|exe|patch|diff|ini|lua|r|pl|dart|ex|exs|erl|hs|ml|nix"
)
KNOWN_FILENAMES = frozenset(
    "Dockerfile Makefile Justfile Procfile Gemfile Rakefile Vagrantfile Jenkinsfile Containerfile "
    "README LICENSE CHANGELOG CODEOWNERS .gitignore .dockerignore .env .bashrc .zshrc .profile "
    ".editorconfig .npmrc .pypirc .gitattributes".split()
)
ERRNO_CODES = frozenset(
    "ENOENT EACCES EPERM ECONNREFUSED ECONNRESET EADDRINUSE ETIMEDOUT EPIPE ENOSPC ENOMEM "
    "EEXIST EISDIR ENOTDIR EINVAL EAGAIN EBADF EHOSTUNREACH ENETUNREACH OOMKilled".split()
)
#: Generic technical acronyms: not entities on their own.
GENERIC_ACRONYMS = frozenset(
    "I A OK AM PM ID IDS API APIS CLI UI UX URL URLS HTTP HTTPS JSON YAML TOML CSV SQL CPU GPU "
    "RAM SSD OS PR PRS CI CD DB LLM AI ML IO TODO FYI ASAP LOL OMG BTW IMO TBH TV PS NB EOF "
    "UTF ASCII PDF HTML CSS JS TS ETA FAQ DIY IRL TL DR".split()
)
MONTHS = {
    m.lower(): i
    for i, names in enumerate(
        [
            ("Jan", "January"),
            ("Feb", "February"),
            ("Mar", "March"),
            ("Apr", "April"),
            ("May",),
            ("Jun", "June"),
            ("Jul", "July"),
            ("Aug", "August"),
            ("Sep", "Sept", "September"),
            ("Oct", "October"),
            ("Nov", "November"),
            ("Dec", "December"),
        ],
        start=1,
    )
    for m in names
}
WEEKDAYS = {
    d: i
    for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])
}
_CALENDAR_WORDS = set(MONTHS) | set(WEEKDAYS) | {"mon", "tue", "wed", "thu", "fri", "sat", "sun"}

# ---------------------------------------------------------------------------------------------
# Verbs -> relations
# ---------------------------------------------------------------------------------------------

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
]
_VERB_RES = [(re.compile(rf"(?<![\w#'-])(?:{rx})(?![\w#])", re.I), rel, passive) for rx, rel, passive in VERB_RELATIONS]
_OBJECT_RELATIONS = {"LIKES", "ATTENDED", "CREATED", "USES", "LIVES_IN", "WORKS_AT"}

_NEG_NOT = re.compile(r"(?<![\w'])(?:not|never|n't|cannot|no)(?![\w'])|\w+n't\b", re.I)
_NEG_STOP = re.compile(r"\b(?:no longer|stopped|stops|stop|quit|quits|gave up|give up|not anymore|no more)\b", re.I)
_SWITCH_RES = [
    re.compile(
        r"\b(?P<verb>switch(?:ed|es|ing)?|migrat(?:ed|es|ing|e)|mov(?:ed|es|ing|e)|chang(?:ed|es|ing|e)|went|go(?:es|ing)?|relocat(?:ed|es|ing|e))"
        r"(?: over| back)? from (?P<old>.+?) (?:to|for) (?P<new>.+?)(?=[.,;!?]|$| because| since| so | after| when)",
        re.I,
    ),
    re.compile(r"\breplac(?:ed|es|ing|e) (?P<old>.+?) with (?P<new>.+?)(?=[.,;!?]|$| because| since| so )", re.I),
    re.compile(r"\b(?P<new>[\w.=+/-]+(?: [\w.=+/-]+){0,2}) instead of (?P<old>.+?)(?=[.,;!?]|$| because| since| so )", re.I),
]

# ---------------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------------



def _norm_key(name: str) -> str:
    """graphiti's exact-name key: lower case, whitespace collapsed."""
    return re.sub(r"\s+", " ", name.lower()).strip()


def is_safe_entity_name(name: str) -> bool:
    """True if ``name`` may become an entity: 2-80 characters, has a letter or digit, and is
    not made only of :data:`STOPWORDS` (pronouns, determiners, auxiliaries...) or single
    letters. Case-insensitive: "Is", "IT", "This", "It Is", "I" are all rejected."""
    stripped = name.strip()
    if len(stripped) < 2 or len(stripped) > MAX_NAME_CHARS:
        return False
    if not any(ch.isalnum() for ch in stripped):
        return False
    low = stripped.lower().replace("’", "'")
    if low in STOPWORDS:
        return False
    words = [w for w in re.split(r"[\s\-_/.,;:!?\"()\[\]{}]+", low) if w]
    meaningful = [w for w in words if w not in STOPWORDS and len(w.strip("'")) > 1]
    if not meaningful:
        return False
    # "it's", "i'm": every word is a stopword once its clitic is split off
    if all(re.sub(r"'\w*$", "", w) in STOPWORDS or len(re.sub(r"'\w*$", "", w)) <= 1 for w in meaningful):
        return False
    return True


def _stem(word: str) -> str:
    w = word.lower()
    for suf in ("ing", "ed", "es", "s"):
        if w.endswith(suf) and len(w) - len(suf) >= 2:
            w = w[: -len(suf)]
            break
    if w.endswith("e") and len(w) > 2:
        w = w[:-1]
    return w


_NEG_WORDS = {"not", "never", "no", "longer", "stopped", "stop", "stops", "quit", "quits", "left", "gave", "give", "up", "anymore", "more"}


def _content_stems(text: str) -> list[str]:
    words = re.findall(r"[\w.=+-]+", text.lower().replace("n't", " not"))
    out = []
    for w in words:
        w = w.strip(".-")
        if not w or w in STOPWORDS or w in _NEG_WORDS:
            continue
        out.append(_stem(w))
    return out


def _norm_fact(text: str) -> str:
    t = text.lower().replace("’", "'")
    t = re.sub(r"[^\w\s=.+/-]", " ", t)
    t = re.sub(r"(?<!\w)[.\-/]|[.\-/](?!\w)", " ", t)
    return re.sub(r"\s+", " ", t).strip()


def _iso(d: date | datetime) -> str:
    if isinstance(d, datetime):
        d = d.astimezone(timezone.utc) if d.tzinfo else d
        return d.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{d.isoformat()}T00:00:00Z"


def _parse_datetime(value: str | None) -> datetime | None:
    if not value:
        return None
    m = re.search(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?", value)
    if not m:
        return None
    text = m.group(0).replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def _summary_key(text: Any) -> str:
    return re.sub(r"\W+", " ", str(text)).strip().casefold()


def _cut_sentences(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    stop = head.rfind(". ")
    return head[: stop + 1] if stop > 0 else head.rstrip()


def _block(prompt: str, tag: str) -> str | None:
    """Text between ``<tag>`` and the first ``</tag>`` after it (graphiti's prompt layout)."""
    start = prompt.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = prompt.find(f"</{tag}>", start)
    if end < 0:
        return None
    return prompt[start:end].strip("\n")


def _literal(text: str | None) -> Any:
    """A JSON or Python-literal block (graphiti formats some blocks with str(), some as JSON)."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


# ---------------------------------------------------------------------------------------------
# Dates
# ---------------------------------------------------------------------------------------------

_MONTH_RX = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sept?(?:ember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_DATE_ISO = re.compile(
    r"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
)
_DATE_DMY = re.compile(rf"(?<![\w.])(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_MDY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})(?!\w)")
_DATE_MY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_YEAR = re.compile(r"\b(?:in|since|during|from|until|till|by|of|early|late|mid|around)\s+((?:19|20)\d{2})(?![\w.-])", re.I)
_DATE_REL = re.compile(
    r"\b(?P<word>yesterday|today|tonight|this morning|this afternoon|this evening|earlier today|last night)\b"
    r"|\blast (?P<unit>week|month|year|weekend|(?:mon|tues|wednes|thurs|fri|satur|sun)day)\b"
    r"|\b(?P<n>\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|a couple of)\s+"
    r"(?P<unit2>days?|weeks?|months?|years?) ago\b",
    re.I,
)
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "a few": 3, "a couple of": 2}


def _month_number(name: str) -> int:
    low = name.lower().rstrip(".")
    return MONTHS.get(low) or MONTHS.get(low[:3], 0)


def _safe_date(y: int, m: int, d: int) -> date | None:
    try:
        return date(y, m, d)
    except ValueError:
        return None


def _minus_months(d: date, months: int) -> date:
    y, m = d.year, d.month - months
    while m <= 0:
        m += 12
        y -= 1
    return date(y, m, min(d.day, calendar.monthrange(y, m)[1]))


@dataclass
class _DateHit:
    start: int
    end: int
    value: date | datetime
    absolute: bool


def find_dates(text: str, reference: datetime | None = None) -> list[_DateHit]:
    """Dates mentioned in ``text``: absolute ones always, relative ones ("yesterday", "last
    year", "3 days ago") only with a ``reference`` time. Non-overlapping, in text order."""
    hits: list[_DateHit] = []

    def add(start: int, end: int, value: date | datetime | None, absolute: bool) -> None:
        if value is None:
            return
        if any(not (end <= h.start or start >= h.end) for h in hits):
            return
        hits.append(_DateHit(start, end, value, absolute))

    for m in _DATE_ISO.finditer(text):
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if m.group(4):
            try:
                value: date | datetime | None = datetime(y, mo, d, int(m.group(4)), int(m.group(5)), int(m.group(6) or 0), tzinfo=timezone.utc)
            except ValueError:
                value = None
        else:
            value = _safe_date(y, mo, d)
        add(m.start(), m.end(), value, True)
    for m in _DATE_DMY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(3)), _month_number(m.group(2)), int(m.group(1))), True)
    for m in _DATE_MDY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(3)), _month_number(m.group(1)), int(m.group(2))), True)
    for m in _DATE_MY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(2)), _month_number(m.group(1)), 1), True)
    for m in _DATE_YEAR.finditer(text):
        add(m.start(1), m.end(1), date(int(m.group(1)), 1, 1), False)
    if reference is not None:
        ref = reference.astimezone(timezone.utc).date() if reference.tzinfo else reference.date()
        for m in _DATE_REL.finditer(text):
            value = None
            if m.group("word"):
                w = m.group("word").lower()
                value = ref - timedelta(days=1) if w in ("yesterday", "last night") else ref
            elif m.group("unit"):
                u = m.group("unit").lower()
                if u == "week":
                    value = ref - timedelta(days=7)
                elif u == "weekend":
                    value = ref - timedelta(days=(ref.weekday() - 5) % 7 or 7)
                elif u == "month":
                    value = _minus_months(ref.replace(day=1), 1)
                elif u == "year":
                    value = date(ref.year - 1, 1, 1)
                else:
                    target = WEEKDAYS[u]
                    value = ref - timedelta(days=(ref.weekday() - target) % 7 or 7)
            else:
                n_text = m.group("n").lower()
                n = int(n_text) if n_text.isdigit() else _NUMBER_WORDS.get(n_text, 1)
                u = m.group("unit2").lower().rstrip("s")
                if u == "day":
                    value = ref - timedelta(days=n)
                elif u == "week":
                    value = ref - timedelta(weeks=n)
                elif u == "month":
                    value = _minus_months(ref.replace(day=1), n)
                else:
                    value = date(ref.year - n, 1, 1)
            add(m.start(), m.end(), value, False)
    hits.sort(key=lambda h: h.start)
    return hits


_UNTIL = re.compile(r"\b(?:until|till|through|thru|up to)\s+$", re.I)


def fact_timestamps(fact: str, reference: datetime | None) -> tuple[str | None, str | None]:
    """(valid_at, invalid_at) for a fact: "from A to/until B" -> (A, B); "until B" -> invalid_at
    B; otherwise the first date mentioned -> valid_at. ISO 8601 with Z; (None, None) if none."""
    hits = find_dates(fact, reference)
    if not hits:
        return None, None
    valid: date | datetime | None = None
    invalid: date | datetime | None = None
    for i, h in enumerate(hits):
        before = fact[max(0, h.start - 14) : h.start]
        if _UNTIL.search(before) or (i > 0 and re.search(r"\b(?:to|and|-)\s*$", before) and valid is not None):
            if invalid is None:
                invalid = h.value
        elif valid is None:
            valid = h.value
    return (_iso(valid) if valid is not None else None, _iso(invalid) if invalid is not None else None)


# ---------------------------------------------------------------------------------------------
# Text analysis: episodes -> speaker blocks -> sentences
# ---------------------------------------------------------------------------------------------

_EPISODE_HEADER = re.compile(r"^\[(?:Episode (\d+)|CONTEXT EPISODE)\] \(timestamp: ([^)\n]*)\)[ \t]*$", re.M)
_ROLE_LABEL = re.compile(
    r"^[ \t]*(?P<role>user|assistant|system|tool|human|ai|bot)(?:[ \t]*\((?P<name>[^()\n]{1,60})\))?[ \t]*:[ \t]?",
    re.I,
)
_NAME_LABEL = re.compile(r"^[ \t]*(?P<name>[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2})[ \t]*:[ \t]+(?=\S)")
_LABEL_STOP = frozenset(
    "note notes error warning traceback file step example examples output input result update edit fix "
    "summary question answer q a re subject from to date time ps todo nb tip hint reason cause solution "
    "problem issue status decision context goal usage options returns args raises http https usage "
    "important caution info debug details description title name type value key command run".split()
)
_CODE_LINE = re.compile(
    r'^\s*(?:Traceback \(most recent call last\):|File "[^"]+", line \d+|\$ |>>> |at [\w.$<>]+\(|\^+\s*$|\.\.\. )'
    r"|^(?: {4,}|\t)\S"
)
#: a sentence ends after . ! ? … (and closing quotes/brackets) before a capital, digit, quote...
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9`/~.\[])|[!?][\"'”’)\]]*(?=\s)")
_CLAUSE_SPLIT = re.compile(
    r";\s+|,\s+(?=(?:and|but|so|then|when|because|while|which|after|before|although|though|if|since)\b)"
    r"|\s+(?=(?:when|because|while|although|though|whereas|but|so that|unless)\s)",
)
_FIRST_PERSON = re.compile(r"(?<![\w'’-])(?:I(?:'m|’m|'ve|’ve|'ll|’ll|'d|’d)?|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself|[Ww]e|[Uu]s|[Oo]ur|[Oo]urs|[Oo]urselves)(?![\w'’-])")
_URL = re.compile(r"\b(?:https?|ftp|file|ssh|git)://\S+|\bwww\.\S+", re.I)
# engram's turn-detector replaces secrets by typed placeholders: never entities.
_REDACTED = re.compile(r"\[REDACTED:[a-z_]+\]")
_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+\.[\w.-]+$")
_INLINE_CODE = re.compile(r"`([^`\n]{1,200})`")


@dataclass
class _Sentence:
    text: str
    speaker: str | None  # display name of the speaker, if any
    episode: int
    reference: datetime | None
    code: bool
    block: int
    start_of_line: bool = True


@dataclass
class _Doc:
    sentences: list[_Sentence]
    speakers: list[str]  # speakers of CURRENT content, in order
    known_people: set[str]  # lower-case speaker names seen anywhere (incl. previous messages)
    lower_words: set[str]  # words that occur in lower case somewhere in the content
    n_blocks: int = 0
    #: lower-cased words that occur capitalised after a lower-case word (not a sentence start)
    mid_caps: set[str] = field(default_factory=set)


def _speaker_of(line: str) -> tuple[str | None, int, bool] | None:
    """(speaker, label length, is_label) if the line starts a speaker block."""
    m = _ROLE_LABEL.match(line)
    if m:
        role = m.group("role").lower()
        name = (m.group("name") or "").strip()
        if name and is_safe_entity_name(name):
            return name, m.end(), True
        if role in ("user", "human"):
            return "User", m.end(), True
        if role in ("assistant", "ai", "bot"):
            return "Assistant", m.end(), True
        return None, m.end(), True
    m = _NAME_LABEL.match(line)
    if m:
        name = m.group("name").strip()
        low = name.lower()
        if (
            low.split()[0] not in _LABEL_STOP
            and low not in COMMON_WORDS
            and not re.search(r"(?:Error|Exception|Warning)$", name)
            and is_safe_entity_name(name)
            and not any(w.lower() in STOPWORDS for w in name.split())
        ):
            return name, m.end(), True
    return None


def _split_sentences(text: str) -> list[tuple[str, bool]]:
    """(sentence, code?) pieces of one speaker block."""
    out: list[tuple[str, bool]] = []
    in_fence = False
    fence: list[str] = []
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            if in_fence:
                out.extend((f, True) for f in fence if f.strip())
                fence = []
            in_fence = not in_fence
            continue
        if in_fence:
            fence.append(line)
            continue
        if not line.strip():
            continue
        if _CODE_LINE.match(line):
            out.append((line.strip(), True))
            continue
        line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s+", "", line)
        line = line.strip()
        last = 0
        for m in _SENTENCE_END.finditer(line):
            if line[last : m.end()].strip():
                out.append((line[last : m.end()].strip(), False))
            last = m.end()
        if line[last:].strip():
            out.append((line[last:].strip(), False))
    out.extend((f, True) for f in fence if f.strip())
    return out


def _speaker_names(text: str | None) -> set[str]:
    names: set[str] = set()
    if not text:
        return names
    for line in text.replace("\\n", "\n").split("\n"):
        line = re.sub(r'^\s*\{?"content":\s*"', "", line)
        got = _speaker_of(line)
        if got and got[0]:
            names.add(got[0].lower())
            names.add(got[0].split()[0].lower())
    return names


def _analyse(content: str, previous: str | None = None, reference: datetime | None = None) -> _Doc:
    episodes: list[tuple[int | None, datetime | None, str]] = []
    headers = list(_EPISODE_HEADER.finditer(content))
    if not headers:
        episodes.append((0, reference, content))
    else:
        if content[: headers[0].start()].strip():
            episodes.append((0, reference, content[: headers[0].start()]))
        for i, h in enumerate(headers):
            end = headers[i + 1].start() if i + 1 < len(headers) else len(content)
            idx = int(h.group(1)) if h.group(1) is not None else None
            episodes.append((idx, _parse_datetime(h.group(2)) or reference, content[h.end() : end]))
    sentences: list[_Sentence] = []
    speakers: list[str] = []
    block = -1
    for idx, ref, text in episodes:
        if idx is None:  # [CONTEXT EPISODE]: context only, never extracted from
            continue
        speaker: str | None = None
        buf: list[str] = []
        in_fence = False

        def flush() -> None:
            nonlocal block
            if not buf:
                return
            block += 1
            for sent, code in _split_sentences("\n".join(buf)):
                sentences.append(_Sentence(sent, speaker, idx, ref, code, block))
            buf.clear()

        for line in text.split("\n"):
            if line.strip().startswith("```"):
                in_fence = not in_fence
            got = None if in_fence else _speaker_of(line)
            if got is not None:
                flush()
                speaker = got[0]
                if speaker and speaker not in speakers:
                    speakers.append(speaker)
                buf.append(line[got[1] :])
            else:
                buf.append(line)
        flush()
    known = {s.lower() for s in speakers} | {s.split()[0].lower() for s in speakers} | _speaker_names(previous)
    known -= {"user", "assistant"}
    lower_words = set(re.findall(r"(?<![\w'])[a-z][a-z'-]+", content))
    mid_caps = {w.lower() for s in sentences if not s.code for w in re.findall(r"(?<=[a-z0-9,] )[A-Z][\w'-]+", s.text)}
    return _Doc(sentences, speakers, known, lower_words, block + 1, mid_caps)


# ---------------------------------------------------------------------------------------------
# Entity candidates
# ---------------------------------------------------------------------------------------------

#: category -> entity type names to look for (first present wins), else the default type 0.
CATEGORY_TYPES: dict[str, tuple[str, ...]] = {
    "file": ("File",),
    "tool": ("Tool",),
    "library": ("Concept", "Tool"),
    "version": ("Concept",),
    "error": ("Error",),
    "concept": ("Concept",),
    "person": ("Person",),
    "speaker": ("Person",),
    "place": ("Place", "Location"),
    "org": ("Organization", "Organisation"),
    "decision": ("Decision",),
    "date": (),
    "thing": (),
}
_PRIORITY = {"file": 9, "error": 8, "version": 8, "date": 7, "tool": 6, "library": 6, "concept": 5,
             "group": 5, "kin": 5, "person": 4, "place": 4, "org": 4, "thing": 4, "object": 2, "decision": 1}


@dataclass
class _Cand:
    name: str
    category: str
    start: int
    end: int
    kind: str = ""  # priority class; defaults to category
    package: str | None = None  # for versions: the package name
    package_span: tuple[int, int] | None = None

    @property
    def priority(self) -> int:
        return _PRIORITY.get(self.kind or self.category, 3)


def _tech_category(word: str) -> str | None:
    low = word.lower()
    if low in CLI_TOOLS:
        return "tool"
    if low in LIBRARIES:
        return "library"
    return None


_TOKEN = re.compile(r"[^\s`'\"“”‘’()<>\[\]{},;|]+")
_VERSION_SPEC = re.compile(r"^(?P<pkg>[A-Za-z][\w.-]*?)(?:\[[\w,.-]+\])?(?P<op>===|==|>=|<=|~=|!=|@)v?(?P<ver>\d[\w.+-]*)$")
_FILE_TOKEN = re.compile(rf"^(?:~|\.{{1,2}})?/?(?:[\w@+.-]+/)*[\w@+.-]*\.(?:{FILE_EXTENSIONS})$", re.I)
_ERROR_TOKEN = re.compile(r"^(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt|Fault)$")
_CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+$")
_SPACE_VERSION = re.compile(r"(?<![\w.=/-])(?P<pkg>[A-Za-z][\w.-]*[A-Za-z0-9])(?P<sep>\s+v?|\s+(?:to|from|version|at)\s+v?)(?P<ver>\d+\.\d+(?:\.\d+)*(?:[a-z]+\d*)?)(?!\w|\.\w)")
_INSTALL = re.compile(
    r"(?<![\w-])(?P<tool>pip3?|uv pip|uv|poetry|pipx|pdm|npm|pnpm|yarn|apt-get|apt|brew|cargo|go|gem|conda|mamba)\s+"
    r"(?P<verb>install|add|get|i)\s+(?P<args>(?:-{1,2}[\w-]+(?:=\S+)?\s+)*(?:[\w@./\[\],=<>~!+-]+(?:\s+|$)){1,8})",
)
_ERROR_PHRASE = re.compile(
    r"(?i:\bsegmentation fault\b|\bcore dumped\b|\bout of memory\b)|\b(?:HTTP\s)?[45]\d\d (?:Not Found|Internal Server Error|Bad Request|Unauthorized|Forbidden|Bad Gateway|Service Unavailable|Gateway Timeout|Too Many Requests|Conflict)\b"
)
_NAME_RUN = re.compile(r"(?<![\w'’@./#-])[A-Z][\w'’&.-]*(?:[ \t]+(?:(?:of|the|de|da|du|van|von|der|del|la|le|di|&)[ \t]+)?[A-Z][\w'’&-]*)*")
_CONNECTORS = {"of", "the", "de", "da", "du", "van", "von", "der", "del", "la", "le", "di", "&"}
_GROUP_PHRASE = re.compile(
    r"(?<![\w'-])((?:[A-Z][\w'’&-]*[ \t]+){1,3}(?:[a-z][\w'-]*[ \t]+){0,2}(?:"
    + "|".join(sorted(_GROUP_HEADS, key=len, reverse=True))
    + r"))(?![\w-])"
)
_KIN = re.compile(rf"(?<![\w'’])(?P<owner>[Mm]y|[A-Z][a-z]+(?:'s|’s))\s+(?P<noun>(?:(?:little|big|older|younger|best|new|old|late|baby)\s+)?(?:{KIN_WORDS}))(?=['’]s\b|[^\w'’-]|$)")
_PERSON_BEFORE = re.compile(r"(?:\b(?:with|met|meet|meeting|told|tell|asked|ask|call|called|thanks|thank you|hey|hi|hello|dear|mr\.?|mrs\.?|ms\.?|dr\.?|friend|brother|sister|mom|dad|wife|husband|son|daughter|cousin|aunt|uncle|named|and|by)\s*,?\s*$)", re.I)
_PERSON_AFTER = re.compile(r"^\s*(?:said|says|told|asked|wrote|and I|and me|'s (?:" + KIN_WORDS + r")\b|[!,]\s*$)", re.I)
_PLACE_BEFORE = re.compile(r"\b(?:in|from|near|to|visited|visiting|visit|moved to|trip to|flew to|travell?ed to|drove to|live in|lives in|living in|based in|around)\s+(?:the\s+)?$", re.I)
_ORG_BEFORE = re.compile(r"\b(?:at|for|joined|join|hired by|interview(?:ed)? (?:at|with)|works? (?:at|for)|worked (?:at|for)|working (?:at|for)|employed by)\s+(?:the\s+)?$", re.I)
_OBJECT_STOP = STOPWORDS | GENERIC_NOUNS | {
    "yesterday", "today", "tomorrow", "tonight", "last", "next", "ago", "recently", "again", "earlier",
    "later", "every", "so", "really", "too", "lot", "much", "because", "since", "though", "although",
}
_DETERMINERS = re.compile(r"^(?:(?P<det>a|an|the|my|our|some|his|her|their|this|that|these|those|your)\s+)?", re.I)


def _is_command_position(text: str, start: int, end: int, word: str) -> bool:
    """For ambiguous tech words: backticked, in command position, imported or installed."""
    before = text[max(0, start - 30) : start]
    after = text[end : end + 30]
    if start > 0 and text[start - 1] == "`":
        return True
    if re.search(r"(?:\bimport|\bfrom|\binstall|\badd|\bwith the|\busing the)\s+$", before, re.I):
        if word.lower() in ("code", "make", "go"):
            return False
        return True
    if re.match(r"\s*(?:library|package|module|lib|crate|gem|framework|cli)\b", after, re.I):
        return True
    follow = AMBIGUOUS_TECH.get(word.lower(), "")
    return bool(follow) and bool(re.match(r"\s+" + follow, after))


class _Extractor:
    """Entity candidates of one sentence."""

    def __init__(self, doc: _Doc, types_present: set[str]):
        self.doc = doc
        self.types_present = types_present

    # -- token based: files, paths, versions, errors, identifiers, tech words -----------------
    def tokens(self, text: str, masked_urls: str, code: bool) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _TOKEN.finditer(masked_urls):
            raw = m.group(0)
            tok = raw.rstrip(".,:;!?")
            tok_start = m.start()
            lead = len(tok) - len(tok.lstrip("*_"))
            tok = tok.lstrip("*_")
            tok_start += lead
            tok_end = tok_start + len(tok)
            if len(tok) < 2 or "://" in tok or _EMAIL.match(tok):
                continue
            in_backticks = tok_start > 0 and text[tok_start - 1] == "`"
            low = tok.lower()
            vm = _VERSION_SPEC.match(tok)
            if vm:
                pkg = vm.group("pkg")
                name = f"{pkg}{vm.group('op')}{vm.group('ver')}"
                out.append(_Cand(name, "version", tok_start, tok_end, package=pkg, package_span=(tok_start, tok_start + len(pkg))))
                continue
            if _tech_category(tok) and ("/" not in tok):
                out.append(_Cand(tok, _tech_category(tok) or "tool", tok_start, tok_end))
                continue
            basename = tok.rstrip("/").rsplit("/", 1)[-1]
            if (_FILE_TOKEN.match(tok) and not re.match(r"^[\d.]+$", basename.rsplit(".", 1)[0] or "x")) or basename in KNOWN_FILENAMES:
                after = masked_urls[tok_end : tok_end + 1]
                if after == "(":
                    continue
                if re.match(r"^(?:e\.g|i\.e|a\.m|p\.m|etc|vs)\.?$", low):
                    continue
                out.append(_Cand(tok, "file", tok_start, tok_end))
                continue
            if "/" in tok and self._is_path(tok):
                out.append(_Cand(tok, "file", tok_start, tok_end))
                continue
            if _ERROR_TOKEN.match(tok):
                name = tok
                rest = text[tok_end : tok_end + 80]
                em = re.match(r":\s*(\[Errno \d+\])", rest) or re.match(r":\s*('[^'\n]{1,40}'|\"[^\"\n]{1,40}\")(?=\s*(?:$|[\s.,;)]))", rest)
                end = tok_end
                if em:
                    name = f"{tok}: {em.group(1)}"
                    end = tok_end + em.end()
                    if em.group(1).startswith("[Errno"):
                        # the errno message ("Address already in use") belongs to the error
                        msg = re.match(r"[^.;\n]*?(?=\s+(?:when|while|after|because|since)\s|[.;\n]|$)", text[end:])
                        end += msg.end() if msg else 0
                out.append(_Cand(name, "error", tok_start, end))
                continue
            if tok in ERRNO_CODES:
                out.append(_Cand(tok, "error", tok_start, tok_end))
                continue
            if low in AMBIGUOUS_TECH and _is_command_position(text, tok_start, tok_end, tok):
                out.append(_Cand(tok, "library" if low in ("requests", "click", "rich", "hypothesis", "express", "spark") else "tool", tok_start, tok_end))
                continue
            if _CAMEL.match(tok) and not code:
                out.append(_Cand(tok, "concept", tok_start, tok_end))
                continue
            if in_backticks and re.match(r"^[A-Za-z_][\w.]*(?:\(\))?$", tok) and not is_stop_or_common(tok):
                if "_" in tok or "." in tok or tok.endswith("()") or re.search(r"[a-z][A-Z]", tok) or tok.isupper():
                    out.append(_Cand(tok.removesuffix("()"), "concept", tok_start, tok_end))
        return out

    @staticmethod
    def _is_path(tok: str) -> bool:
        t = tok.rstrip("/")
        if not t or t.count("/") == 0 and not tok.endswith("/"):
            return False
        if re.match(r"^\d+(?:/\d+)+$", t) or re.match(r"^\d", t):
            return False
        segs = [s for s in t.split("/") if s]
        if not segs or not all(re.match(r"^[\w@+.-]+$", s) for s in segs):
            return False
        if tok.startswith(("/", "~/", "./", "../")):
            return len(segs) >= 2 or tok.startswith(("~/", "./", "../")) or (len(segs) == 1 and segs[0] in KNOWN_DIRS)
        if segs[0] in KNOWN_DIRS and len(segs) >= 2:
            return True
        if tok.endswith("/") and len(segs) == 1 and (segs[0] in KNOWN_DIRS or re.search(r"[_.-]", segs[0])):
            return True
        return len(segs) >= 2 and any(re.search(r"[_.]", s) for s in segs) and not all(len(s) <= 3 for s in segs)

    # -- phrase based ---------------------------------------------------------------------------
    def installs(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _INSTALL.finditer(text):
            tool = m.group("tool")
            out.append(_Cand(tool.split()[0], "tool", m.start("tool"), m.start("tool") + len(tool.split()[0])))
            pos = m.start("args")
            for am in re.finditer(r"\S+", m.group("args")):
                arg = am.group(0)
                a_start = pos + am.start()
                if arg.startswith("-"):
                    continue
                core = re.sub(r"\[[\w,.-]*\]", "", arg).rstrip(".,;")
                vm = _VERSION_SPEC.match(core)
                if vm:
                    continue  # the token pass makes the version and its package
                if core.lower() in STOPWORDS or core.lower() in ("to", "the", "it", "them", "and"):
                    break
                if not re.match(r"^[\w@./-]+$", core) or not re.search(r"[A-Za-z]", core):
                    break
                cat = "library" if _tech_category(core) != "tool" else "tool"
                out.append(_Cand(core, cat, a_start, a_start + len(core), kind="library"))
        return out

    def space_versions(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _SPACE_VERSION.finditer(text):
            pkg = m.group("pkg")
            low = pkg.lower()
            if not (_tech_category(pkg) or low in AMBIGUOUS_TECH):
                continue
            sep = m.group("sep").strip()
            name = f"{pkg} {m.group('ver')}"
            start = m.start("pkg") if not sep or sep.startswith("v") else m.start("ver")
            cand = _Cand(name, "version", start, m.end(), package=pkg, package_span=(m.start("pkg"), m.end("pkg")))
            if start != m.start("pkg"):
                # "upgraded pydantic to 2.15": the package keeps its own span
                out.append(_Cand(pkg, _tech_category(pkg) or "library", m.start("pkg"), m.end("pkg")))
                cand.package_span = None
            out.append(cand)
        return out

    def tech_words(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in re.finditer(r"(?<![\w./-])(?:docker[ -]compose|vs code|github actions|google cloud|apt-get|llama\.cpp)(?![\w-])", text, re.I):
            out.append(_Cand(m.group(0), "tool", m.start(), m.end()))
        # a backticked command: its first word is a tool
        for m in _INLINE_CODE.finditer(text):
            inner = m.group(1).strip()
            first = re.match(r"[\w.+-]+", inner)
            if " " in inner and first and re.match(r"^[a-z][\w.+-]*$", first.group(0)):
                word = first.group(0)
                rest = inner[len(word) :]
                # an unknown first word counts only if the rest looks like arguments
                looks_like_command = bool(_tech_category(word)) or bool(re.search(r"(?:^|\s)(?:--?\w|[\w.-]*/|[\w-]+\.\w{1,5}\b)", rest))
                if (
                    looks_like_command
                    and not is_stop_or_common(word)
                    and not any(rx.fullmatch(word) for rx, _, _ in _VERB_RES)
                    and word not in ("cd", "ls", "cat", "echo", "export", "sudo", "source", "rm", "mv", "cp", "mkdir")
                ):
                    s = m.start(1) + m.group(1).index(word)
                    out.append(_Cand(word, _tech_category(word) or "tool", s, s + len(word)))
        return out

    def errors(self, text: str) -> list[_Cand]:
        return [_Cand(m.group(0), "error", m.start(), m.end()) for m in _ERROR_PHRASE.finditer(text)]

    def titles(self, text: str) -> list[_Cand]:
        """Quoted titles of works: "Finding Freedom", “The Night Circus”."""
        out = []
        for m in re.finditer(r"[\"“]([A-Z][\w'’&:!?-]*(?: (?:[A-Z0-9][\w'’&:!?-]*|of|the|a|an|and|in|on|to|for|with)){0,6})[.,!?]?[\"”]", text):
            title = m.group(1).rstrip(".,!?:")
            if " " in title and is_safe_entity_name(title):
                out.append(_Cand(title, "thing", m.start(1), m.start(1) + len(title), kind="group"))
        return out

    def dates(self, text: str) -> list[_Cand]:
        return [_Cand(text[h.start : h.end], "date", h.start, h.end) for h in find_dates(text) if h.absolute]

    def kin(self, text: str, speaker: str | None) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _KIN.finditer(text):
            owner = m.group("owner")
            if owner.lower() == "my":
                if not speaker or speaker in ("User", "Assistant"):
                    continue
                owner_name = speaker
            else:
                owner_name = owner[:-2]
            noun = m.group("noun")
            cat = "thing" if noun.split()[-1].lower() in _PET_WORDS else "person"
            out.append(_Cand(f"{owner_name}'s {noun}", cat, m.start(), m.end(), kind="kin"))
        return out

    def groups(self, text: str, sentence_start: int) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _GROUP_PHRASE.finditer(text):
            phrase = m.group(1)
            words = phrase.split()
            start = m.start(1)
            # drop leading stop/common words ("The", "Our") and sentence-initial capitals
            while words and (words[0].lower() in STOPWORDS or (start == sentence_start and words[0].lower() in COMMON_WORDS)):
                start = text.index(words[1], start + len(words[0])) if len(words) > 1 else start
                words = words[1:]
            if len(words) < 2 or not words[0][:1].isupper():
                continue
            name = " ".join(words)
            out.append(_Cand(name, _GROUP_HEADS.get(words[-1].lower(), "thing"), start, m.end(1), kind="group"))
        return out

    def names(self, text: str, masked: str, at_start: Callable[[int], bool]) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _NAME_RUN.finditer(masked):
            words: list[tuple[str, int]] = []
            pos = m.start()
            for w in re.finditer(r"\S+", m.group(0)):
                words.append((w.group(0), pos + w.start()))
            # split runs at stopwords (other than connectors between capitalised words)
            runs: list[list[tuple[str, int]]] = [[]]
            for w, p in words:
                bare = w.rstrip(".").replace("’", "'")
                low = bare.lower()
                low_nopos = re.sub(r"'s$", "", low)
                if low in _CONNECTORS:
                    runs[-1].append((w, p))
                    continue
                if (
                    low in STOPWORDS
                    or low_nopos in STOPWORDS
                    or low_nopos in _CALENDAR_WORDS
                    or (bare.isupper() and (low in COMMON_WORDS or bare in GENERIC_ACRONYMS))
                    or len(bare) < 2
                ):
                    runs.append([])
                    continue
                runs[-1].append((w, p))
                if re.search(r"['’]s$", w):  # a possessive ends the name
                    runs.append([])
            for run in runs:
                while run and run[0][0].lower() in _CONNECTORS:
                    run.pop(0)
                while run and run[-1][0].lower() in _CONNECTORS:
                    run.pop()
                if not run:
                    continue
                # sentence-initial common words and capitalised ordinary words are not names; a
                # lone capitalised sentence starter needs support (a known name, or the same word
                # capitalised mid-sentence somewhere else)
                while run and at_start(run[0][1]) and (self._ordinary(run[0][0]) or (len(run) == 1 and not self._supported(run[0][0]))):
                    run.pop(0)
                    while run and run[0][0].lower() in _CONNECTORS:
                        run.pop(0)
                if not run:
                    continue
                start = run[0][1]
                last_word, last_pos = run[-1]
                end = last_pos + len(last_word)
                name = text[start:end]
                name = re.sub(r"['’]s$", "", name).rstrip(".")
                end = start + len(name)
                if len(run) == 1 and (name.lower() in COMMON_WORDS or name in GENERIC_ACRONYMS or name.lower() in GENERIC_NOUNS):
                    continue
                out.append(_Cand(name, self._classify(name, text, start, end), start, end, kind="person"))
        return out

    def _supported(self, word: str) -> bool:
        low = re.sub(r"['’]s$", "", word.rstrip(".,")).lower()
        if low in self.doc.known_people or low in KNOWN_ORGS or low in KNOWN_PLACES or low in self.doc.mid_caps:
            return True
        bare = word.rstrip(".,")
        return len(bare) >= 2 and bare.isupper() and bare not in GENERIC_ACRONYMS and low not in COMMON_WORDS

    def _ordinary(self, word: str) -> bool:
        low = word.rstrip(".,").lower().replace("’", "'")
        if low in COMMON_WORDS or low in STOPWORDS or low in GENERIC_NOUNS:
            return True
        if low in self.doc.known_people or low in KNOWN_ORGS or low in KNOWN_PLACES:
            return False
        if low in self.doc.lower_words:
            return True
        if any(rx.fullmatch(low) for rx, _, _ in _VERB_RES) or low in _IRREGULAR_PAST:
            return True
        return bool(re.search(r"(?:ing|ed|ly)$", low)) and not word.isupper()

    def _classify(self, name: str, text: str, start: int, end: int) -> str:
        low = name.lower()
        first = low.split()[0]
        if low in self.doc.known_people or (first in self.doc.known_people and len(name.split()) <= 3):
            return "person"
        if low in KNOWN_ORGS or _ORG_SUFFIX.search(name):
            return "org"
        if low in KNOWN_PLACES or _PLACE_SUFFIX.search(name) or all(w in KNOWN_PLACES for w in low.split()):
            return "place"
        before = text[max(0, start - 40) : start]
        after = text[end : end + 25]
        if _ORG_BEFORE.search(before):
            return "org"
        if _PERSON_BEFORE.search(before) or _PERSON_AFTER.match(after):
            return "person"
        if _PLACE_BEFORE.search(before):
            return "place"
        return "thing"

    def objects(self, text: str, masked: str, speaker: str | None, verbs: list[_VerbHit]) -> list[_Cand]:
        out: list[_Cand] = []
        for v in verbs:
            if v.relation not in _OBJECT_RELATIONS or v.passive:
                continue
            rest = masked[v.end :]
            lead = len(rest) - len(rest.lstrip(" "))
            if lead == 0 and rest and rest[0] not in " ":
                continue
            dm = _DETERMINERS.match(rest[lead:])
            det = (dm.group("det") or "").lower() if dm else ""
            pos = v.end + lead + (dm.end() if dm else 0)
            words: list[tuple[str, int]] = []
            for w in re.finditer(r"[A-Za-z][\w'-]*|\S", masked[pos:]):
                token = w.group(0)
                if (
                    not re.match(r"^[a-z][\w'-]*$", token)
                    or token in _OBJECT_STOP
                    or token.endswith("ly")
                    or len(words) >= 4
                ):
                    break
                if words and w.start() + pos != words[-1][1] + len(words[-1][0]) + 1:
                    break
                words.append((token, pos + w.start()))
            if not words:
                continue
            if len(words) == 1 and (
                v.relation != "LIKES"
                or words[0][0] in GENERIC_NOUNS
                or words[0][0] in ("user", "assistant", "system", "tool")
                or any(rx.fullmatch(words[0][0]) for rx, _, _ in _VERB_RES)
            ):
                continue
            if words[-1][0] in GENERIC_NOUNS and len(words) == 1:
                continue
            phrase = " ".join(w for w, _ in words)
            start, end = words[0][1], words[-1][1] + len(words[-1][0])
            if det == "my" and speaker and speaker not in ("User", "Assistant"):
                phrase = f"{speaker}'s {phrase}"
            out.append(_Cand(phrase, "thing", start, end, kind="object"))
        return out

    def decisions(self, text: str) -> list[_Cand]:
        if "Decision" not in self.types_present:
            return []
        out = []
        for m in re.finditer(r"\b(?:decided|decide|chose|agreed|settled) (?:to|on) (?P<p>[\w.=/-]+(?: [\w.=/-]+){0,4}?)(?=\s*(?:[.,;!?]|$| because| since| instead| so | over | rather))", text, re.I):
            phrase = m.group("p")
            if is_safe_entity_name(phrase) and len(phrase.split()) >= 2:
                out.append(_Cand(phrase, "decision", m.start("p"), m.end("p"), kind="decision"))
        return out


def is_stop_or_common(word: str) -> bool:
    low = word.lower()
    return low in STOPWORDS or low in COMMON_WORDS or low in GENERIC_NOUNS


def _mask(text: str, spans: Iterable[tuple[int, int]], ch: str = "#") -> str:
    chars = list(text)
    for s, e in spans:
        for i in range(max(0, s), min(len(chars), e)):
            if not chars[i].isspace():
                chars[i] = ch
    return "".join(chars)


def _resolve_overlaps(cands: list[_Cand]) -> list[_Cand]:
    """Keep the best non-overlapping candidates (priority, then length, then position)."""
    kept: list[_Cand] = []
    for c in sorted(cands, key=lambda c: (-c.priority, -(c.end - c.start), c.start)):
        if c.kind == "decision":
            kept.append(c)
            continue
        if any(not (c.end <= k.start or c.start >= k.end) for k in kept if k.kind != "decision"):
            continue
        kept.append(c)
    return sorted(kept, key=lambda c: (c.start, -c.end))


# ---------------------------------------------------------------------------------------------
# Verbs, clauses, facts
# ---------------------------------------------------------------------------------------------


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


@dataclass
class _Mention:
    key: str
    start: int
    end: int
    category: str
    package_key: str | None = None
    pronoun: bool = False


@dataclass
class _Entity:
    name: str
    category: str
    episodes: set[int] = field(default_factory=set)
    order: int = 0


@dataclass
class _Fact:
    source: str
    target: str
    relation: str
    fact: str
    episodes: set[int]
    reference: datetime | None


_IRREGULAR_PAST = frozenset(
    "went made got saw took gave found told felt thought bought brought began came became ran "
    "wrote drew built met left kept read said sent spent stood understood won lost paid heard "
    "held knew grew threw flew fell ate drank sang swam taught caught fought sought sold slept "
    "chose broke spoke woke drove rode hid forgot forgave lent lit led meant put quit set shut "
    "cut hit hurt let cost was were had did could would should might must will can may shall "
    "also just really never always still finally recently actually even already".split()
)
_AUX_3RD = {"am": "is", "'m": "is", "’m": "is", "have": "has", "'ve": "has", "’ve": "has", "do": "does",
            "don't": "doesn't", "don’t": "doesn’t", "'ll": "will", "’ll": "will", "'d": "would", "’d": "would"}


def _third_person_verb(word: str) -> str:
    low = word.lower()
    if low in _IRREGULAR_PAST or low.endswith("ed") or not low.isalpha():
        return word
    if low == "have":
        return "has"
    if low in ("do", "go"):
        return word + "es"
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return word + "es"
    if re.search(r"[^aeiou]y$", low):
        return word[:-1] + "ies"
    return word + "s"


def third_person(sentence: str, speaker: str | None) -> str:
    """Replace "I", "me", "my" with the speaker's name ("I love painting" -> "Caroline loves
    painting"). "we"/"our" are kept (they include others)."""
    if not speaker:
        return sentence

    def repl_i(m: re.Match[str]) -> str:
        clitic = m.group("clitic")
        if clitic:
            return f"{speaker} {_AUX_3RD.get(clitic.lower(), clitic)}"
        nxt = m.group("next")
        if not nxt:
            return speaker
        low = nxt.lower()
        if low in _AUX_3RD:
            return f"{speaker} {_AUX_3RD[low]}"
        if low in ("was", "did", "didn't", "can", "could", "will", "would", "should", "might", "must", "had", "can't", "won't", "wasn't", "couldn't", "wouldn't", "shouldn't"):
            return f"{speaker} {nxt}"
        if low in ("also", "just", "really", "never", "always", "still", "finally", "recently", "actually", "even", "already", "usually", "often", "sometimes", "totally", "absolutely", "definitely", "no", "not"):
            return f"{speaker} {nxt}"
        return f"{speaker} {_third_person_verb(nxt)}"

    out = re.sub(r"(?<![\w'’-])I(?:(?P<clitic>['’](?:m|ve|ll|d))|\s+(?P<next>[A-Za-z'’]+))?(?![\w'’-])", repl_i, sentence)
    # "I no longer live ..." -> "<speaker> no longer lives ..." (a negation: keep it intact)
    out = re.sub(
        rf"(?<=\b{re.escape(speaker)} )no longer ([a-z]+)\b",
        lambda m: f"no longer {_third_person_verb(m.group(1))}",
        out,
    )
    # "I" + adverb + verb: conjugate the verb after the adverb
    out = re.sub(
        rf"(?<=\b{re.escape(speaker)} )(also|just|really|never|always|still|finally|usually|often|sometimes|actually|even|already) ([a-z]+)\b",
        lambda m: f"{m.group(1)} {_third_person_verb(m.group(2)) if m.group(1) not in ('finally', 'recently', 'just', 'already') or not m.group(2).endswith('ed') else m.group(2)}",
        out,
    )
    out = re.sub(r"(?<![\w'’-])[Mm]y(?![\w'’-])", f"{speaker}'s", out)
    out = re.sub(r"(?<![\w'’-])(?:me|myself)(?![\w'’-])", speaker, out)
    out = re.sub(r"(?<![\w'’-])mine(?![\w'’-])", f"{speaker}'s", out)
    return out


def _trim(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,;:") + "..."


def _clauses(text: str) -> list[tuple[int, int]]:
    bounds = [0]
    for m in _CLAUSE_SPLIT.finditer(text):
        bounds.append(m.end())
    bounds.append(len(text))
    out = []
    for s, e in zip(bounds, bounds[1:]):
        if e > s:
            out.append((s, e))
    return out


_SUBJECT_GAP = re.compile(
    r"\s*(?:(?:also|just|really|still|never|not|always|often|usually|sometimes|finally|recently|actually|"
    r"already|totally|absolutely|even|no longer|do|does|did|don't|doesn't|didn't|has|have|had|is|are|was|"
    r"were|will|would|can|could|should|might|must|has been|have been|'ve|'s|'re|'m)\s+)*"
)


# Words that carry no fact on their own: greetings, acknowledgements, intensifiers.
_SMALL_TALK = frozenset(
    "wow hey hi hello thanks thank yeah yep yes yup no nope oh ok okay cool great awesome totally agree "
    "sure lol haha bye see talk soon nice really so too omg aw aww hmm um well "
    "amazing sounds sound fun congrats congratulations welcome sorry please anytime".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{2,}")


def _has_content(masked_sentence: str) -> bool:
    """False for small talk around a name: once entity mentions are masked, the sentence holds
    small-talk words and nothing but stopwords besides ("Wow, Melanie!", "Thanks, Caroline!")."""
    words = [w.lower().strip("'’-") for w in _WORD.findall(masked_sentence)]
    small_talk = [w for w in words if w in _SMALL_TALK]
    content = [w for w in words if w not in _SMALL_TALK and w not in STOPWORDS]
    return bool(content) or not small_talk


_VOCATIVE_BEFORE = re.compile(
    r"(?:^|[,;:!?.]|\b(?:hey|hi|hello|thanks|thank you|wow|oh|yes|yeah|yep|congrats|congratulations|dear|sorry|"
    r"bye|great|awesome|absolutely|sure|okay|ok|aw|aww|haha|lol|omg))\W*$",
    re.I,
)


def _vocative(text: str, m: _Mention) -> bool:
    """A person named to address them ("Thanks, Melanie!", "Wow, Caroline, way to go!",
    "Caroline, did you ...?") is the listener, not an argument of the sentence's fact."""
    if m.category not in ("person", "speaker") or m.pronoun:
        return False
    before, after = text[: m.start], text[m.end :].lstrip()
    return bool(_VOCATIVE_BEFORE.search(before)) and (not after or after[0] in ",!?.")


class _FactBuilder:
    def __init__(self, entities: dict[str, _Entity], max_fact_chars: int):
        self.entities = entities
        self.max_fact_chars = max_fact_chars
        self.facts: list[_Fact] = []
        self._seen: set[tuple[str, str, str, str]] = set()

    def add(self, source: str, target: str, relation: str, text: str, sent: _Sentence) -> None:
        if source == target or len(self.facts) >= MAX_FACTS:
            return
        if source not in self.entities or target not in self.entities:
            return
        fact = _trim(text, self.max_fact_chars)
        key = (source, target, relation, fact)
        if key in self._seen:
            return
        self._seen.add(key)
        self.facts.append(_Fact(source, target, relation, fact, {sent.episode}, sent.reference))
        for k in (source, target):
            self.entities[k].episodes.add(sent.episode)

    def sentence(self, sent: _Sentence, mentions: list[_Mention], speaker_key: str | None) -> None:
        text = sent.text
        if sent.code:
            return
        fact_text = third_person(text, sent.speaker if speaker_key else None)
        masked = _mask(text, [(m.start, m.end) for m in mentions if not m.pronoun])
        if not _has_content(masked):
            return  # "Wow, Melanie!", "Thanks, Caroline!": a name in a greeting is no fact
        mentions = [m for m in mentions if not _vocative(text, m)]  # the listener is no argument
        verbs = _find_verbs(masked)
        switches = []
        for rx in _SWITCH_RES:
            for m in rx.finditer(text):
                switches.append((m.start("old"), m.end("old"), m.start("new"), m.end("new"), m.group(0).lower()))
        handled_versions: set[str] = set()
        for c_start, c_end in _clauses(text):
            ms = [m for m in mentions if c_start <= m.start < c_end]
            vs = [v for v in verbs if c_start <= v.start < c_end]
            self._clause(sent, fact_text, text, ms, vs, switches, speaker_key, c_start)
        # package -> version facts
        for m in mentions:
            if m.category == "version" and m.package_key and m.key not in handled_versions:
                handled_versions.add(m.key)
                rel = "USES_VERSION"
                if any(s[0] <= m.start < s[1] for s in switches):
                    rel = "NO_LONGER_USES_VERSION"
                self.add(m.package_key, m.key, rel, fact_text, sent)

    def _clause(self, sent: _Sentence, fact_text: str, text: str, ms: list[_Mention], vs: list[_VerbHit],
                switches: list[tuple[int, int, int, int, str]], speaker_key: str | None, c_start: int) -> None:
        # one mention per entity (the first)
        firsts: dict[str, _Mention] = {}
        for m in ms:
            if m.key not in firsts:
                firsts[m.key] = m
        ordered = sorted(firsts.values(), key=lambda m: m.start)
        keys = {m.key for m in ordered}
        non_speaker = [m for m in ordered if m.key != speaker_key]
        if not non_speaker:
            return
        if len(keys) == 1:
            # the speaker plus one entity
            if speaker_key and speaker_key in self.entities:
                m = non_speaker[0]
                if not (m.category == "version" and m.package_key):
                    self.add(speaker_key, m.key, self._relation(m, vs, text, switches, c_start), fact_text, sent)
            return
        # a passive verb: the agent after it acts on what precedes it ("X was caused by Y")
        v0 = vs[0] if vs else None
        if v0 is not None and v0.passive:
            after = [m for m in ordered if m.start >= v0.end and m.category != "date"]
            if after:
                agent = after[0]
                for t in [m for m in ordered if m is not agent][:MAX_TARGETS_PER_CLAUSE]:
                    rel = v0.relation if t.start < v0.start else self._relation(t, vs, text, switches, c_start)
                    self.add(agent.key, t.key, rel, fact_text, sent)
                return
        # split the clause where a verb has its own subject right before it
        # ("I love painting and my kids love pottery" -> two segments)
        cuts: list[int] = []
        for v in vs:
            prev = [m for m in ordered if m.end <= v.start]
            if prev and prev[-1].start > c_start and _SUBJECT_GAP.fullmatch(text[prev[-1].end : v.start]):
                # co-subjects joined by "and" stay with it
                idx = ordered.index(prev[-1])
                while idx > 0 and self._co_subject(text, ordered, idx, vs, c_start):
                    idx -= 1
                cuts.append(ordered[idx].start)
        bounds = sorted({c_start, *cuts, len(text) + 1})
        for a, b in zip(bounds, bounds[1:]):
            seg = [m for m in ordered if a <= m.start < b]
            seg_verbs = [v for v in vs if a <= v.start < b]
            if seg:
                self._segment(sent, fact_text, text, seg, seg_verbs, vs, switches, speaker_key, a)

    @staticmethod
    def _co_subject(text: str, ordered: list[_Mention], idx: int, vs: list[_VerbHit], lower: int) -> bool:
        """Is ordered[idx - 1] a co-subject of ordered[idx] ("Caroline and Melanie went")? Not
        if a verb precedes it (then it is an object: "I love painting and my kids love ...")."""
        prev = ordered[idx - 1]
        if not re.fullmatch(r"\s*(?:,|and|&|,\s*and)\s*", text[prev.end : ordered[idx].start]):
            return False
        before = ordered[idx - 2].end if idx >= 2 else lower
        return not any(before <= v.start < prev.start for v in vs)

    def _segment(self, sent: _Sentence, fact_text: str, text: str, ordered: list[_Mention], seg_verbs: list[_VerbHit],
                 all_verbs: list[_VerbHit], switches: list[tuple[int, int, int, int, str]], speaker_key: str | None, s_start: int) -> None:
        keys = {m.key for m in ordered}
        has_pronoun = any(m.pronoun for m in ordered)
        v0 = seg_verbs[0] if seg_verbs else None
        actor: _Mention | None = None
        co_actors: list[_Mention] = []
        if v0 is not None:
            before = [m for m in ordered if m.end <= v0.start]
            if before:
                actor = before[-1]
                idx = ordered.index(actor)
                while idx > 0 and self._co_subject(text, ordered, idx, all_verbs, s_start):
                    co_actors.append(ordered[idx - 1])
                    idx -= 1
            elif not (speaker_key and speaker_key in self.entities):
                actor = ordered[0]
        elif not (has_pronoun and speaker_key):
            actor = ordered[0]
        if actor is None:
            if not (speaker_key and speaker_key in self.entities):
                return
            actor = _Mention(speaker_key, s_start, s_start, "speaker", pronoun=True)
        subjects = [actor] + co_actors
        skip = {s.key for s in subjects}
        targets = [m for m in ordered if m.key not in skip and not (m.start < actor.end and m.end > actor.start)]
        if actor.end > s_start or co_actors:
            after = [m for m in targets if m.start >= actor.end]
            if after:
                targets = after
        # a version whose package is mentioned hangs off the package (USES_VERSION), not the actor
        targets = [t for t in targets if not (t.category == "version" and t.package_key and t.package_key in keys)]
        tools = [t for t in targets if t.category in ("tool", "library")]
        for subj in subjects:
            for t in targets[:MAX_TARGETS_PER_CLAUSE]:
                rel = self._relation(t, all_verbs, text, switches, s_start)
                if rel.endswith("TESTED_BY") and tools:
                    # "I tested src/app.py with pytest": the tested thing -> the tool
                    if t not in tools:
                        for tool in tools:
                            self.add(t.key, tool.key, rel, fact_text, sent)
                    elif all(x in tools for x in targets):
                        self.add(subj.key, t.key, rel, fact_text, sent)
                    continue
                self.add(subj.key, t.key, rel, fact_text, sent)

    def _relation(self, target: _Mention, vs: list[_VerbHit], text: str, switches: list[tuple[int, int, int, int, str]], c_start: int) -> str:
        if target.category == "date":
            return "OCCURRED_ON"
        before = [v for v in vs if v.start < target.start]
        verb = before[-1] if before else (vs[0] if vs else None)
        if verb is None:
            rel = "RELATES_TO"
        else:
            rel = verb.relation
        cat = self.entities[target.key].category if target.key in self.entities else target.category
        if rel == "LIVES_IN" and cat in ("tool", "library", "file", "version", "concept"):
            rel = "USES"
        elif rel == "USES_VERSION" and cat not in ("tool", "library", "version", "concept"):
            rel = "RELATES_TO"
        for o_s, o_e, n_s, n_e, phrase in switches:
            if o_s <= target.start < o_e:
                base = "LIVES_IN" if re.match(r"(?:mov|reloc|went|go)", phrase) and cat not in ("tool", "library", "file", "version", "concept") else ("USES" if rel in ("RELATES_TO", "USES", "LIVES_IN") else rel)
                return "NO_LONGER_" + base
            if n_s <= target.start < n_e and rel == "RELATES_TO":
                return "USES"
        if verb is not None:
            window = text[max(c_start, verb.start - 30) : verb.start]
            if _NEG_STOP.search(window):
                rel = "NO_LONGER_" + rel
            elif _NEG_NOT.search(window):
                rel = "NOT_" + rel
        return rel


def _traceback_facts(builder: _FactBuilder, sentences: list[_Sentence], mentions: dict[int, list[_Mention]]) -> None:
    """A code block (or traceback lines) naming an error and files: error OCCURRED_IN file."""
    by_block: dict[int, list[int]] = {}
    for i, s in enumerate(sentences):
        by_block.setdefault(s.block, []).append(i)
    for idxs in by_block.values():
        errors: list[tuple[str, int]] = []
        files: list[str] = []
        for i in idxs:
            s = sentences[i]
            for m in mentions.get(i, []):
                cat = builder.entities[m.key].category if m.key in builder.entities else m.category
                if cat == "error" and (s.code or "Traceback" in s.text or re.match(r"^\s*[\w.]+(?:Error|Exception|Warning)\b", s.text)):
                    errors.append((m.key, i))
                elif cat == "file" and s.code:
                    if m.key not in files:
                        files.append(m.key)
        if not errors or not files:
            continue
        err_key, err_idx = errors[-1]
        err_line = sentences[err_idx].text
        for f in files[-3:]:
            fact = f"{err_line} (raised in {builder.entities[f].name})"
            builder.add(err_key, f, "OCCURRED_IN", fact, sentences[err_idx])


# ---------------------------------------------------------------------------------------------
# Extraction pipeline
# ---------------------------------------------------------------------------------------------


@dataclass
class ExtractionResult:
    entities: list[_Entity]
    facts: list[_Fact]


def _extract(doc: _Doc, types_present: set[str], *, max_per_message: int, max_entities: int, max_fact_chars: int) -> ExtractionResult:
    ex = _Extractor(doc, types_present)
    entities: dict[str, _Entity] = {}
    per_block: Counter[int] = Counter()
    mentions: dict[int, list[_Mention]] = {}

    def register(name: str, category: str, sent: _Sentence) -> str | None:
        name = name.strip()
        if not is_safe_entity_name(name):
            return None
        key = _norm_key(name)
        if key in entities:
            ent = entities[key]
            if category == "speaker" or (ent.category == "thing" and category not in ("thing", "date")):
                ent.category = category
            return key
        if per_block[sent.block] >= max_per_message or len(entities) >= max_entities:
            return None
        per_block[sent.block] += 1
        entities[key] = _Entity(name, category, set(), len(entities))
        return key

    blocks_with_error_type = {s.block for s in doc.sentences if re.search(r"\b[A-Z]\w*(?:Error|Exception|Warning)\b", s.text)}
    # speakers first (graphiti asks for the speaker as the first entity)
    speaker_keys: dict[str, str] = {}
    for s in doc.sentences:
        if s.speaker and s.speaker not in speaker_keys:
            k = register(s.speaker, "speaker" if s.speaker != "Assistant" else "thing", s)
            if k:
                speaker_keys[s.speaker] = k
                entities[k].episodes.add(s.episode)

    for i, s in enumerate(doc.sentences):
        text = s.text
        masked_urls = _mask(
            text, [(m.start(), m.end()) for pattern in (_URL, _REDACTED) for m in pattern.finditer(text)], " "
        )
        cands: list[_Cand] = []
        cands += ex.tokens(text, masked_urls, s.code)
        cands += ex.installs(masked_urls)
        cands += ex.space_versions(masked_urls)
        cands += ex.errors(masked_urls)
        cands += ex.dates(masked_urls)
        cands += ex.tech_words(masked_urls)
        if not s.code:
            code_spans = [(m.start(), m.end()) for m in _INLINE_CODE.finditer(masked_urls)]
            prose = _mask(masked_urls, code_spans, " ")
            cands += ex.kin(prose, s.speaker)
            cands += ex.groups(prose, 0)
            cands += ex.titles(prose)
            # text after an error name is its message ("Address already in use"): no names there
            messages = [(c.end, len(prose)) for c in cands if c.category == "error"]
            taken = _mask(prose, [(c.start, c.end) for c in cands if c.category in ("file", "version", "error", "date", "tool", "library") or c.kind in ("kin", "group")] + messages, " ")

            def at_start(pos: int, _t: str = prose) -> bool:
                head = _t[:pos]
                return not head.strip() or bool(re.search(r"(?:[.!?:;\"“(]|^[-*•])\s*$", head))

            cands += ex.names(prose, taken, at_start)
            pre = _resolve_overlaps(cands)
            verbs = _find_verbs(_mask(prose, [(c.start, c.end) for c in pre]))
            cands += ex.objects(prose, _mask(prose, [(c.start, c.end) for c in pre], "#"), s.speaker, verbs)
            cands += ex.decisions(prose)
        kept = _resolve_overlaps(cands)
        if s.block not in blocks_with_error_type and re.search(r"\bTraceback\b", text) and not any(c.category == "error" for c in kept):
            pos = text.index("Traceback")
            kept.append(_Cand("Traceback", "error", pos, pos + len("Traceback")))
        ms: list[_Mention] = []
        for c in kept:
            key = register(c.name, c.category, s)
            if key is None:
                continue
            pkg_key = None
            if c.category == "version" and c.package:
                pkg_key = register(c.package, _tech_category(c.package) or "library", s)
                if pkg_key and c.package_span:
                    ms.append(_Mention(pkg_key, c.package_span[0], c.package_span[1], entities[pkg_key].category))
            ms.append(_Mention(key, c.start, c.end, entities[key].category, package_key=pkg_key))
        sk = speaker_keys.get(s.speaker or "")
        if sk and not s.code:
            for m in _FIRST_PERSON.finditer(text):
                if not any(x.start <= m.start() < x.end for x in ms):
                    ms.append(_Mention(sk, m.start(), m.end(), "speaker", pronoun=True))
        ms.sort(key=lambda m: (m.start, -m.end))
        mentions[i] = ms
        for m in ms:
            if not m.pronoun:
                entities[m.key].episodes.add(s.episode)

    builder = _FactBuilder(entities, max_fact_chars)
    for i, s in enumerate(doc.sentences):
        builder.sentence(s, mentions.get(i, []), speaker_keys.get(s.speaker or ""))
    _traceback_facts(builder, doc.sentences, mentions)
    ordered = sorted(entities.values(), key=lambda e: e.order)
    for e in ordered:
        if not e.episodes:
            e.episodes.add(0)
    return ExtractionResult(ordered, builder.facts)


def _facts_for_given_entities(doc: _Doc, names: list[tuple[str, list[str]]], max_fact_chars: int) -> list[_Fact]:
    """Facts between entity names given by the prompt (the separate extract_edges path)."""
    entities: dict[str, _Entity] = {}
    for i, (name, labels) in enumerate(names):
        if not is_safe_entity_name(name):
            continue
        key = _norm_key(name)
        if key in entities:
            continue
        specific = [lbl for lbl in labels if lbl != "Entity"]
        cat = _category_from_labels(name, specific)
        entities[key] = _Entity(name, cat, set(), i)
    patterns: list[tuple[str, re.Pattern[str]]] = []
    for key, ent in entities.items():
        surfaces = {ent.name}
        pm = re.match(r"^(.+?)['’]s (.+)$", ent.name)
        if pm:
            surfaces.add(f"my {pm.group(2)}")
        vm = _VERSION_SPEC.match(ent.name) or re.match(r"^(?P<pkg>[A-Za-z][\w.-]*) (?P<ver>\d[\w.]*)$", ent.name)
        for surface in surfaces:
            left = r"(?<![\w])" if surface[:1].isalnum() or surface[:1] == "_" else r"(?<![\w.])"
            right = r"(?![\w])" if surface[-1:].isalnum() or surface[-1:] == "_" else ""
            patterns.append((key, re.compile(left + re.escape(surface).replace(r"\ ", r"\s+") + right, re.I)))
        if vm:
            ent.category = "version"
    speakers = {s: _norm_key(s) for s in doc.speakers if _norm_key(s) in entities}
    builder = _FactBuilder(entities, max_fact_chars)
    for s in doc.sentences:
        found: list[_Mention] = []
        for key, rx in patterns:
            for m in rx.finditer(s.text):
                found.append(_Mention(key, m.start(), m.end(), entities[key].category))
        kept: list[_Mention] = []
        for m in sorted(found, key=lambda m: (-(m.end - m.start), m.start)):
            if any(not (m.end <= k.start or m.start >= k.end) for k in kept):
                continue
            kept.append(m)
        for m in kept:
            ent = entities[m.key]
            if ent.category == "version":
                pkg = (_VERSION_SPEC.match(ent.name) or re.match(r"^(?P<pkg>[A-Za-z][\w.-]*) ", ent.name))
                if pkg and _norm_key(pkg.group("pkg")) in entities:
                    m.package_key = _norm_key(pkg.group("pkg"))
        sk = speakers.get(s.speaker or "")
        if sk and not s.code:
            for m in _FIRST_PERSON.finditer(s.text):
                if not any(x.start <= m.start() < x.end for x in kept):
                    kept.append(_Mention(sk, m.start(), m.end(), "speaker", pronoun=True))
        kept.sort(key=lambda m: (m.start, -m.end))
        builder.sentence(s, kept, sk)
    return builder.facts


def _category_from_labels(name: str, labels: list[str]) -> str:
    """Category of a name given by the prompt, from its type labels, else from its form."""
    low = {lbl.lower() for lbl in labels}
    for cat in ("file", "tool", "error", "person", "place", "org", "decision", "concept"):
        if any(t.lower() in low for t in CATEGORY_TYPES[cat]):
            return cat
    hits = find_dates(name)
    if hits and hits[0].absolute and hits[0].start == 0 and hits[0].end == len(name):
        return "date"
    return _tech_category(name) or "thing"


# ---------------------------------------------------------------------------------------------
# Entity types
# ---------------------------------------------------------------------------------------------


def _parse_entity_types(block: str | None) -> list[dict[str, Any]]:
    data = _literal(block)
    if isinstance(data, list) and all(isinstance(d, dict) for d in data):
        return data
    # fall back to scanning for ids and names
    out = []
    if block:
        for m in re.finditer(r"'entity_type_id':\s*(\d+),\s*'entity_type_name':\s*'([^']*)'", block):
            out.append({"entity_type_id": int(m.group(1)), "entity_type_name": m.group(2)})
    return out or [{"entity_type_id": 0, "entity_type_name": "Entity"}]


def _type_id(category: str, types: list[dict[str, Any]]) -> int:
    by_name = {str(t.get("entity_type_name", "")).lower(): int(t.get("entity_type_id", 0)) for t in types}
    for wanted in CATEGORY_TYPES.get(category, ()):
        if wanted.lower() in by_name:
            return by_name[wanted.lower()]
    if "entity" in by_name:
        return by_name["entity"]
    return int(types[0].get("entity_type_id", 0)) if types else 0


# ---------------------------------------------------------------------------------------------
# Dedupe and contradiction
# ---------------------------------------------------------------------------------------------


def _name_keys(name: str) -> tuple[str, str]:
    low = name.lower().replace("’", "'")
    key = re.sub(r"[^\w\s]", "", low)
    key = re.sub(r"\s+", " ", key).strip()
    words = key.split()
    if words and len(words[-1]) > 3 and words[-1].endswith("s") and not words[-1].endswith("ss"):
        variant = " ".join(words[:-1] + [words[-1][:-1]])
    else:
        variant = key
    return key, variant


def _labels(value: Any) -> set[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return set()
    return {str(v) for v in value if str(v) != "Entity"}


def resolve_node(name: str, labels: set[str], candidates: list[dict[str, Any]]) -> int:
    """candidate_id of the existing entity that duplicates ``name``, else -1."""
    key, variant = _name_keys(name)
    if not key:
        return -1
    best: tuple[int, int] | None = None
    for c in candidates:
        try:
            cid = int(c.get("candidate_id", c.get("idx", -1)))
        except (TypeError, ValueError):
            continue
        cname = str(c.get("name", ""))
        ckey, cvariant = _name_keys(cname)
        if not ckey:
            continue
        clabels = _labels(c.get("entity_types", c.get("labels", [])))
        if labels and clabels and not (labels & clabels):
            continue
        if ckey == key:
            rank = 0
        elif cvariant == variant:
            rank = 1
        else:
            continue
        if best is None or (rank, cid) < best:
            best = (rank, cid)
    return best[1] if best else -1


_SINGLE_VALUED_RES = [
    (re.compile(r"\b(?:lives?|lived|living|resides?|resided|residing|(?:is|am|are|was) based) in\b|\b(?:moved|moves|relocated|relocates) (?:back )?to\b", re.I), "LIVES_IN"),
    (re.compile(r"\b(?:works?|worked|working|is employed) (?:at|for)\b|\bjoined\b", re.I), "WORKS_AT"),
]


def _svo(fact: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    out = []
    for rx, rel in _SINGLE_VALUED_RES:
        m = rx.search(fact)
        if not m:
            continue
        subj = tuple(_content_stems(fact[: m.start()]))
        obj_text = re.split(r"[.,;!?]| since | until | from | because | in (?:19|20)\d\d", fact[m.end() :])[0]
        obj = tuple(_content_stems(obj_text))
        if subj and obj:
            out.append((rel, subj, obj))
    return out


def _versions(fact: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in _TOKEN.findall(fact):
        vm = _VERSION_SPEC.match(tok.rstrip(".,;:"))
        if vm:
            out[vm.group("pkg").lower()] = vm.group("ver")
    for m in _SPACE_VERSION.finditer(fact):
        if _tech_category(m.group("pkg")) or m.group("pkg").lower() in AMBIGUOUS_TECH:
            out.setdefault(m.group("pkg").lower(), m.group("ver"))
    return out


def _is_negated(fact: str) -> bool:
    return bool(_NEG_STOP.search(fact) or _NEG_NOT.search(fact) or re.search(r"\b(?:left|anymore)\b", fact, re.I))


def contradicts(new: str, old: str) -> bool:
    """True if ``new`` makes ``old`` false by one of the documented lexical rules."""
    n_stems, o_stems = _content_stems(new), _content_stems(old)
    if not o_stems:
        return False
    shared = set(n_stems) & set(o_stems)
    # 1. polarity flip over (mostly) the same content
    if _is_negated(new) != _is_negated(old):
        covered = sum(1 for s in set(o_stems) if s in set(n_stems))
        if covered >= 2 and covered / len(set(o_stems)) >= 0.75:
            return True
    # 2. replacement: "switched from X to Y", "replaced X with Y", "Y instead of X"
    for rx in _SWITCH_RES:
        for m in rx.finditer(new):
            old_side = set(_content_stems(m.group("old")))
            new_side = set(_content_stems(m.group("new")))
            same_subject = n_stems[0] == o_stems[0] or bool(shared - old_side - new_side)
            if old_side and old_side <= set(o_stems) and not (old_side <= new_side) and same_subject:
                return True
    # 3. single-valued relations: same subject, different object
    for rel_n, subj_n, obj_n in _svo(new):
        for rel_o, subj_o, obj_o in _svo(old):
            if rel_n == rel_o and set(subj_n) & set(subj_o) and set(obj_n) != set(obj_o) and not _is_negated(new) and not _is_negated(old):
                return True
    # 4. versions of one package
    vn, vo = _versions(new), _versions(old)
    for pkg, ver in vn.items():
        if pkg in vo and vo[pkg] != ver:
            return True
    return False


def resolve_edge(new_fact: str, existing: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> dict[str, list[int]]:
    duplicates: list[int] = []
    contradicted: list[int] = []
    norm_new = _norm_fact(new_fact)
    for item in existing:
        idx, fact = int(item.get("idx", -1)), str(item.get("fact", ""))
        if idx < 0:
            continue
        if _norm_fact(fact) == norm_new:
            duplicates.append(idx)
        elif contradicts(new_fact, fact):
            contradicted.append(idx)
    for item in candidates:
        idx, fact = int(item.get("idx", -1)), str(item.get("fact", ""))
        if idx < 0 or _norm_fact(fact) == norm_new:
            continue
        if contradicts(new_fact, fact):
            contradicted.append(idx)
    return {"duplicate_facts": duplicates, "contradicted_facts": contradicted}


# ---------------------------------------------------------------------------------------------
# Minimal instances of arbitrary response models
# ---------------------------------------------------------------------------------------------


def _minimal_value(annotation: Any, depth: int = 0) -> Any:
    if depth > 6:
        return None
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return None
    if origin is typing.Union or origin is _pytypes.UnionType:
        if type(None) in args:
            return None
        return _minimal_value(args[0], depth + 1)
    if origin is typing.Annotated:
        return _minimal_value(args[0], depth + 1)
    if origin is typing.Literal:
        return args[0]
    if origin in (list, set, frozenset, tuple) or annotation in (list, set, frozenset, tuple):
        return []
    if origin is dict or annotation is dict:
        return {}
    if isinstance(annotation, type):
        if issubclass(annotation, BaseModel):
            return minimal_instance(annotation, depth + 1)
        if issubclass(annotation, enum.Enum):
            return next(iter(annotation)).value
        if issubclass(annotation, bool):
            return False
        if issubclass(annotation, int):
            return 0
        if issubclass(annotation, float):
            return 0.0
        if issubclass(annotation, str):
            return ""
        if issubclass(annotation, datetime):
            return None
    return None


def minimal_instance(model: type[BaseModel], depth: int = 0) -> dict[str, Any]:
    """The smallest valid instance of ``model`` as a dict: defaults where the model has them,
    else empty containers/strings, ``None`` for optionals, 0/False for numbers and bools."""
    data: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        if not info.is_required():
            continue
        key = info.alias or name
        data[key] = _minimal_value(info.annotation, depth)
    try:
        return model.model_validate(data).model_dump(mode="json")
    except Exception:  # a constrained field we could not satisfy: return the raw guess
        return data


# ---------------------------------------------------------------------------------------------
# The client
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """One answered call: the graphiti prompt name (when the caller gave one), the response
    model's name, and the tokens a real LLM would have read and written."""

    prompt_name: str | None
    response_model: str | None
    prompt_tokens: int
    completion_tokens: int


_PROMPT_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("engram_rules_prompt_name", default=None)


def _estimate_tokens(text: str) -> int:
    return -(-len(text) // 4)


def _default_token_counter() -> tuple[CountTokens, str]:
    try:
        from services.extractor.chunking import token_counter  # type: ignore[import-not-found]

        counter = token_counter()
        if callable(counter):
            name = getattr(counter, "__name__", "")
            return counter, ("cl100k" if name == "count_cl100k" else "chars/4")
    except Exception as exc:  # not importable here, or its set-up failed
        logger.debug("token_counter unavailable (%s); estimating tokens as characters/4", exc)
    return _estimate_tokens, "chars/4"


class RulesExtractorClient(LLMClient):
    """Deterministic, model-free answers to graphiti-core's extraction prompts.

    Not a language model: see the module docstring for what it extracts and its limits.
    ``calls`` lists every answered call with token counts, ``unhandled`` counts response
    models answered with a minimal instance, ``failures`` counts handler errors (answered
    with a minimal instance too; they should stay 0).
    """

    MODEL_NAME = "engram-rules-extractor"

    def __init__(
        self,
        config: LLMConfig | None = None,
        cache: bool = False,
        *,
        max_entities_per_message: int = MAX_ENTITIES_PER_MESSAGE,
        max_entities: int = MAX_ENTITIES,
        max_fact_chars: int = MAX_FACT_CHARS,
        count_tokens: CountTokens | None = None,
    ) -> None:
        if config is None:
            config = LLMConfig(model=self.MODEL_NAME, small_model=self.MODEL_NAME, temperature=0)
        super().__init__(config, cache)
        self.max_entities_per_message = max_entities_per_message
        self.max_entities = max_entities
        self.max_fact_chars = max_fact_chars
        self.calls: list[CallRecord] = []
        self.unhandled: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._count_tokens = count_tokens
        self.token_counting = "custom" if count_tokens is not None else "unset"
        self._handlers: dict[str, Callable[[str], dict[str, Any]]] = {
            "CombinedExtraction": self._combined,
            "ExtractedEntities": self._entities,
            "ExtractedEdges": self._edges,
            "NodeResolutions": self._node_resolutions,
            "NodeDuplicate": self._node_duplicate,
            "EdgeDuplicate": self._edge_duplicate,
            "EdgeTimestamps": self._timestamps,
            "BatchEdgeTimestamps": self._batch_timestamps,
            "EntitySummaries": self._entity_summaries,
        }

    # -- LLMClient --------------------------------------------------------------------------
    async def generate_response(
        self,
        messages: list[Message],
        response_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        *,
        attribute_extraction: bool = False,
        model: str | None = None,
    ) -> dict[str, Any]:
        # remember the prompt name for the CallRecord: the base class does not pass it down
        token = _PROMPT_NAME.set(prompt_name)
        try:
            return await super().generate_response(
                messages,
                response_model=response_model,
                max_tokens=max_tokens,
                model_size=model_size,
                group_id=group_id,
                prompt_name=prompt_name,
                attribute_extraction=attribute_extraction,
                model=model,
            )
        finally:
            _PROMPT_NAME.reset(token)

    async def _generate_response(
        self,
        messages: list[Message],
        response_model: type[BaseModel] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, Any]:
        result = self.respond(messages, response_model)
        counter = self._counter()
        prompt_tokens = sum(counter(m.content) for m in messages)
        completion_tokens = counter(json.dumps(result, ensure_ascii=False))
        prompt_name = _PROMPT_NAME.get()
        self.calls.append(CallRecord(prompt_name, response_model.__name__ if response_model else None, prompt_tokens, completion_tokens))
        self.token_tracker.record(prompt_name or (response_model.__name__ if response_model else None), prompt_tokens, completion_tokens)
        return result

    def _counter(self) -> CountTokens:
        if self._count_tokens is None:
            self._count_tokens, self.token_counting = _default_token_counter()
        return self._count_tokens

    # -- dispatch -----------------------------------------------------------------------------
    def respond(self, messages: list[Message], response_model: type[BaseModel] | None) -> dict[str, Any]:
        """The answer to one prompt (synchronous; no bookkeeping of tokens)."""
        name = response_model.__name__ if response_model is not None else None
        handler = self._handlers.get(name or "")
        if response_model is None or handler is None:
            self.unhandled[name or "None"] += 1
            return minimal_instance(response_model) if response_model is not None else {}
        prompt = "\n".join(m.content for m in messages if m.role != "system") or "\n".join(m.content for m in messages)
        try:
            data = handler(prompt)
            return response_model.model_validate(data).model_dump(mode="json")
        except Exception:
            logger.exception("rules extractor failed on %s; answering with an empty instance", name)
            self.failures[name or "None"] += 1
            return minimal_instance(response_model)

    # -- handlers -----------------------------------------------------------------------------
    def _doc_and_types(self, prompt: str, tags: tuple[str, ...]) -> tuple[_Doc, list[dict[str, Any]], str]:
        content = None
        used = ""
        for tag in tags:
            content = _block(prompt, tag)
            if content is not None:
                used = tag
                break
        if content is None:
            content = ""
        if used == "JSON":
            content = _json_to_text(content)
        types = _parse_entity_types(_block(prompt, "ENTITY TYPES"))
        previous = _block(prompt, "PREVIOUS MESSAGES")
        reference = _parse_datetime(_block(prompt, "REFERENCE_TIME") or "")
        return _analyse(content, previous, reference), types, used

    def _run(self, doc: _Doc, types: list[dict[str, Any]]) -> ExtractionResult:
        present = {str(t.get("entity_type_name", "")) for t in types}
        return _extract(doc, present, max_per_message=self.max_entities_per_message, max_entities=self.max_entities, max_fact_chars=self.max_fact_chars)

    def _combined(self, prompt: str) -> dict[str, Any]:
        doc, types, _ = self._doc_and_types(prompt, ("CURRENT MESSAGES",))
        result = self._run(doc, types)
        names = {_norm_key(e.name): e.name for e in result.entities}
        return {
            "extracted_entities": [{"name": e.name, "entity_type_id": _type_id(e.category, types)} for e in result.entities],
            "edges": [
                {
                    "source_entity_name": names[f.source],
                    "target_entity_name": names[f.target],
                    "relation_type": f.relation,
                    "fact": f.fact,
                    "episode_indices": sorted(f.episodes),
                }
                for f in result.facts
            ],
        }

    def _entities(self, prompt: str) -> dict[str, Any]:
        doc, types, _ = self._doc_and_types(prompt, ("CURRENT MESSAGE", "TEXT", "JSON"))
        result = self._run(doc, types)
        return {
            "extracted_entities": [
                {"name": e.name, "entity_type_id": _type_id(e.category, types), "episode_indices": sorted(e.episodes)}
                for e in result.entities
            ]
        }

    def _edges(self, prompt: str) -> dict[str, Any]:
        content = _block(prompt, "CURRENT_MESSAGE") or ""
        reference = _parse_datetime(_block(prompt, "REFERENCE_TIME"))
        given = _literal(_block(prompt, "ENTITIES")) or []
        names: list[tuple[str, list[str]]] = []
        for item in given if isinstance(given, list) else []:
            if isinstance(item, dict) and isinstance(item.get("name"), str):
                labels = item.get("entity_types") or item.get("labels") or []
                names.append((item["name"], [str(x) for x in labels] if isinstance(labels, list) else []))
        doc = _analyse(content, _block(prompt, "PREVIOUS_MESSAGES"), reference)
        facts = _facts_for_given_entities(doc, names, self.max_fact_chars)
        by_key = {_norm_key(n): n for n, _ in names}
        edges = []
        for f in facts:
            valid_at, invalid_at = fact_timestamps(f.fact, f.reference or reference)
            edges.append(
                {
                    "source_entity_name": by_key[f.source],
                    "target_entity_name": by_key[f.target],
                    "relation_type": f.relation,
                    "fact": f.fact,
                    "valid_at": valid_at,
                    "invalid_at": invalid_at,
                    "episode_indices": sorted(f.episodes),
                }
            )
        return {"edges": edges}

    def _node_resolutions(self, prompt: str) -> dict[str, Any]:
        extracted = _literal(_block(prompt, "ENTITIES")) or []
        existing = _literal(_block(prompt, "EXISTING ENTITIES")) or []
        existing = [c for c in existing if isinstance(c, dict)] if isinstance(existing, list) else []
        out = []
        for i, item in enumerate(extracted if isinstance(extracted, list) else []):
            if not isinstance(item, dict):
                continue
            name = str(item.get("name", ""))
            try:
                ident = int(item.get("id", i))
            except (TypeError, ValueError):
                ident = i
            dup = resolve_node(name, _labels(item.get("entity_type", item.get("entity_types", []))), existing)
            out.append({"id": ident, "name": name, "duplicate_candidate_id": dup})
        return {"entity_resolutions": out}

    def _node_duplicate(self, prompt: str) -> dict[str, Any]:
        node = _literal(_block(prompt, "NEW ENTITY"))
        existing = _literal(_block(prompt, "EXISTING ENTITIES")) or []
        existing = [c for c in existing if isinstance(c, dict)] if isinstance(existing, list) else []
        if not isinstance(node, dict):
            return {"id": 0, "name": "", "duplicate_candidate_id": -1}
        name = str(node.get("name", ""))
        dup = resolve_node(name, _labels(node.get("entity_type", node.get("entity_types", node.get("labels", [])))), existing)
        return {"id": int(node.get("id", 0) or 0), "name": name, "duplicate_candidate_id": dup}

    def _edge_duplicate(self, prompt: str) -> dict[str, Any]:
        existing = _literal(_block(prompt, "EXISTING FACTS")) or []
        candidates = _literal(_block(prompt, "FACT INVALIDATION CANDIDATES")) or []
        new_fact = (_block(prompt, "NEW FACT") or "").strip()
        existing = [x for x in existing if isinstance(x, dict)] if isinstance(existing, list) else []
        candidates = [x for x in candidates if isinstance(x, dict)] if isinstance(candidates, list) else []
        return resolve_edge(new_fact, existing, candidates)

    def _timestamps(self, prompt: str) -> dict[str, Any]:
        fact = _block(prompt, "FACT") or ""
        reference = _parse_datetime(_block(prompt, "REFERENCE TIME"))
        valid_at, invalid_at = fact_timestamps(fact, reference)
        return {"valid_at": valid_at, "invalid_at": invalid_at}

    def _entity_summaries(self, prompt: str) -> dict[str, Any]:
        entities = json.loads(_block(prompt, "ENTITIES") or "[]")
        out = []
        for entity in entities:
            retracted = {_summary_key(f) for f in entity.get("no_longer_true", [])}
            seen: set[str] = set()
            parts: list[str] = []
            for fact in entity.get("facts", []):
                key = _summary_key(fact)
                if key and key not in seen and key not in retracted:
                    seen.add(key)
                    parts.append(str(fact).strip().rstrip(".") + ".")
            out.append({"id": entity["id"], "summary": _cut_sentences(" ".join(parts), int(entity.get("max_chars", 800)))})
        return {"summaries": out}

    def _batch_timestamps(self, prompt: str) -> dict[str, Any]:
        facts = _literal(_block(prompt, "FACTS")) or []
        out = []
        for item in facts if isinstance(facts, list) else []:
            if isinstance(item, dict):
                valid_at, invalid_at = fact_timestamps(str(item.get("fact", "")), _parse_datetime(str(item.get("reference_time") or "")))
            else:
                valid_at, invalid_at = None, None
            out.append({"valid_at": valid_at, "invalid_at": invalid_at})
        return {"timestamps": out}


def _json_to_text(content: str) -> str:
    """JSON episodes: string values become sentences ("key: value.")."""
    data = _literal(content)
    if data is None:
        return content
    parts: list[str] = []

    def walk(value: Any, key: str = "") -> None:
        if len(parts) > 200:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and value.strip():
            parts.append(value.strip().rstrip(".") + ".")

    walk(data)
    return "\n".join(parts)


__all__ = [
    "CallRecord",
    "RulesExtractorClient",
    "STOPWORDS",
    "VERB_RELATIONS",
    "contradicts",
    "fact_timestamps",
    "find_dates",
    "is_safe_entity_name",
    "minimal_instance",
    "resolve_edge",
    "resolve_node",
    "third_person",
]
