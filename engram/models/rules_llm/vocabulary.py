"""Word lists: stopwords, common words, tools, libraries, well-known places and organisations,
file and error vocabulary, months and weekdays. Fixed lists: unknown tools and names are found
only by the cues in :mod:`.entities`.
"""

from __future__ import annotations

import re


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

#: Speaker role words (the labels of ``user:``/``assistant:`` blocks): never entities (issue 24, item 6);
#: a named speaker ("user (Ada):") is one.
ROLE_WORDS: frozenset[str] = frozenset(
    ["user", "users", "assistant", "assistants", "human", "bot", "system", "the user", "the assistant", "the bot"]
)

_IRREGULAR_PAST = frozenset(
    "went made got saw took gave found told felt thought bought brought began came became ran "
    "wrote drew built met left kept read said sent spent stood understood won lost paid heard "
    "held knew grew threw flew fell ate drank sang swam taught caught fought sought sold slept "
    "chose broke spoke woke drove rode hid forgot forgave lent lit led meant put quit set shut "
    "cut hit hurt let cost was were had did could would should might must will can may shall "
    "also just really never always still finally recently actually even already "
    "arose awoke bore beat bent bit bled blew bound bred bred burnt clung crept dealt dug dove dreamt fed fled "
    "flung froze hung knelt laid leapt learnt rang rose sank shook shot shrank slid spun split spread sprang "
    "stole stuck stung struck swept swore swung tore wore wove wound withdrew forbade spat bet fit".split()
)
#: prefixes of irregular verbs ("rewrote", "overtook", "undid", "mistook", "outgrew", "withheld")
IRREGULAR_PREFIXES = ("re", "over", "under", "mis", "out", "with", "up", "fore", "un", "be")
