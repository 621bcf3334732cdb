"""Synthetic shapes of machine text, seeded: sums, SQL statements, JSON records, CSV rows,
arithmetic expressions, log lines, Python literals, URLs, shell commands, HTML elements, e-mail headers
and configuration lines. Most are a fixed instruction and one input drawn from a few templates (the
template is the row's type); a one-token copy changes a value (a name, a number), never a key, a flag,
a tag or a template word; an embedded copy sits among other text of its kind (rows of an export,
lines of a log or of a config file, sibling elements of a page, a shell history).
"""

from __future__ import annotations

import dataclasses
import json
import random
import re

from .base import (
    CITIES,
    COLUMNS,
    DAYS,
    EVAL,
    FIRST,
    ITEMS,
    LAST,
    MONTH_ABBR,
    MONTHS,
    NOUNS,
    POOL,
    WEEKDAYS,
    N,
    Parts,
    Shape,
    Values,
    _among_its_kind,
    _around,
    _drawn,
    _fixed,
    _name_or_number_changed,
    _typed,
    drawn_rows,
    embedded,
    instructed,
)

# --- shapes -----------------------------------------------------------------------------------------

def arith(rng: random.Random) -> Shape:
    seen, rows = set(), []
    while len(rows) < 2 * EVAL + POOL:
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        if (a, b) not in seen:
            seen.add((a, b))
            rows.append([f"{a}+{b}="])
    prefixes = ["What is ", "Compute ", "Please add: ", "Sum "]
    return Shape("arith", "short generated input `347+589=`, template `{question}`", rows,
                 lambda p: p[0], lambda p, r: None, lambda p, r: [r.choice(prefixes) + p[0]],
                 lambda p, r: [embedded(p[0], r)])
SQL_INSTRUCTION = "Explain in one sentence what this SQL statement does."
SQL_REWORDED = ["Describe briefly the effect of the following SQL.", "What does this query do? One sentence.",
                "Summarise the SQL statement below in plain English."]
SQL_TEMPLATES = (
    "SELECT {c1}, {c2} FROM {t} WHERE {c3} > {n}",
    "SELECT COUNT(*) FROM {t} WHERE {c1} = '{city}'",
    "UPDATE {t} SET {c1} = {n} WHERE {c2} = '{city}'",
    "INSERT INTO {t} ({c1}, {c2}) VALUES ('{first}', {n})",
    "DELETE FROM {t} WHERE {c1} < {n} AND {c2} = '{city}'",
    "SELECT {c1} FROM {t} ORDER BY {c2} DESC LIMIT {k}",
    "SELECT {t}.{c1}, {t2}.{c2} FROM {t} JOIN {t2} ON {t}.id = {t2}.owner_id WHERE {t2}.{c3} >= {n}",
)


def sql(rng: random.Random) -> Shape:
    """Alpaca rows: a fixed instruction, one SQL statement from one of 7 templates (its type)."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(SQL_TEMPLATES))
        t, t2 = rng.sample(NOUNS, 2)
        c1, c2, c3 = rng.sample(COLUMNS, 3)
        q = SQL_TEMPLATES[k].format(t=t, t2=t2, c1=c1, c2=c2, c3=c3, n=rng.randint(1, 9999), k=rng.randint(1, 50),
                                    city=rng.choice(CITIES), first=rng.choice(FIRST))
        return f"sql{k}", [SQL_INSTRUCTION, q]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    return instructed("sql", "Alpaca rows: a fixed instruction, an SQL statement (7 templates, 30 tables, 34 "
                      "columns)", rows[: 2 * EVAL + POOL], SQL_REWORDED, types)


RECORD_KEYS = (("id", "name", "city", "age"), ("order", "customer", "item", "quantity", "price"),
               ("sensor", "site", "reading", "unit"), ("employee", "team", "manager", "level", "salary"))
RECORD_FIELDS = frozenset(k for keys in RECORD_KEYS for k in keys)
RECORD_QUESTIONS = {0: "city", 1: "customer", 2: "site", 3: "manager"}


def _record_value(key: str, rng: random.Random) -> str | int:
    if key in ("name", "customer", "manager", "employee"):
        return f"{rng.choice(FIRST).title()} {rng.choice(LAST).title()}"
    if key in ("city", "site"):
        return rng.choice(CITIES).title()
    if key in ("item", "team", "unit"):
        return rng.choice(ITEMS if key == "item" else COLUMNS)
    return rng.randint(1, 99999 if key in ("id", "order", "sensor", "salary") else 99)


def json_records(rng: random.Random) -> Shape:
    """Chat-free extraction: a fixed instruction field and a one-line JSON record of one of 4 schemas
    (its type); mostly punctuation and key names every record of its schema repeats."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(RECORD_KEYS))
        record = {key: _record_value(key, rng) for key in RECORD_KEYS[k]}
        return f"record{k}", [f"Return the {RECORD_QUESTIONS[k]} field of the record.", json.dumps(record)]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    return Shape("json record", "a per-schema instruction field, a one-line JSON record (4 schemas)",
                 rows[: 2 * EVAL + POOL], lambda p: f"{p[0]}\n{p[1]}\n",
                 lambda p, r: [p[0], x] if (x := _name_or_number_changed(p[1], r, RECORD_FIELDS)) else None,
                 lambda p, r: ["Which value does this record hold for that field? " + p[0], p[1]],
                 lambda p, r: [p[0], embedded(p[1], r)], lambda p: p[1], types)


# --- csv row ----------------------------------------------------------------------------------------

CSV_INSTRUCTION = "Which field of this CSV row holds the largest number? Answer with its position."
CSV_REWORDED = ["Give the position of the field with the biggest number in the row below.",
                "Find the largest numeric field of this CSV line and say where it is.",
                "Position of the largest number in this CSV record?"]
STATUS = ("paid", "open", "void", "shipped", "returned", "pending")


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2015, 2025)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _literal(rng: random.Random) -> str:
    k = rng.randrange(7)
    return (str(rng.randint(0, 99)) if k == 0 else f"{rng.randint(0, 99)}.{rng.randint(0, 9)}" if k == 1
            else rng.choice(CITIES).title() if k == 2 else f'"{rng.choice(LAST)}"' if k == 3
            else rng.choice(("true", "false", "null")) if k == 4 else _date(rng) if k == 5 else rng.choice(ITEMS))


def _csv(rng: random.Random) -> tuple[str, str]:
    """A short row of 3-4 literal values; its type is the kinds of its values."""
    k = rng.choice((3, 4))
    return f"csv{k}", ",".join(_literal(rng) for _ in range(k))


def csv_rows(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [CSV_INSTRUCTION, row]) for kind, row in (_csv(rng) for _ in range(3 * N))])

    return instructed("csv row", "a fixed instruction and one short CSV row of 3-4 literal values (numbers 0-99, "
                      "decimals, cities, quoted names, flags, dates, items)", rows[:N], CSV_REWORDED, types,
                      _among_its_kind(_csv))


# --- expression -------------------------------------------------------------------------------------

EXPR_FORMS = ("({a} - {b}) * {c} + {d}", "{a} * {b} - {c} // {d}", "({a} + {b}) % {c} * {d}",
              "{a} ** 2 - {b} * {c} + {d}", "max({a}, {b}) - min({c}, {d})", "{a} / ({b} + {c}) - {d}")
VALUE_INSTRUCTION = "Evaluate this Python expression and give the result."
VALUE_REWORDED = ["What does this expression evaluate to?", "Compute the value of the expression below.",
                 "Work out the result of this arithmetic."]


def expressions(rng: random.Random) -> Shape:
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(EXPR_FORMS))
        text = EXPR_FORMS[k].format(a=rng.randint(2, 99), b=rng.randint(2, 99), c=rng.randint(2, 99),
                                    d=rng.randint(2, 99))
        return f"expr{k}", [VALUE_INSTRUCTION, text]

    rows, types = _typed([one() for _ in range(3 * N)])
    return instructed("expression", "a fixed instruction and a short arithmetic expression of 4 numbers 2-99 "
                      "(6 forms)", rows[:N], VALUE_REWORDED, types)


# --- log line (held out) ----------------------------------------------------------------------------

LOG_TEMPLATES = (
    "GET /api/{noun}/{n} {code} {ms}ms",
    "disk sd{dev} at {p}% on {city}-{k}",
    "login {first}.{last} from 10.{a}.{b}.{c}",
    "retry {k} of {n} for job {rid}",
)
LOG_INSTRUCTION = "What is the severity level of this log line?"
LOG_REWORDED = ["Give the log level of the following line.", "Which severity does this line carry?",
                "Name the level (INFO, WARN, ERROR, DEBUG) of the log entry below."]


def _log(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(LOG_TEMPLATES))
    text = LOG_TEMPLATES[k].format(k=rng.randint(1, 32), dev=rng.choice("abcdef"), p=rng.randint(10, 99),
                                   city=rng.choice(CITIES), n=rng.randint(1, 999), rid=f"r{rng.randint(1000, 99999)}",
                                   noun=rng.choice(NOUNS), code=rng.choice((400, 403, 404, 500, 502, 503)),
                                   ms=rng.randint(5, 30000), first=rng.choice(FIRST), last=rng.choice(LAST),
                                   a=rng.randint(0, 255), b=rng.randint(0, 255), c=rng.randint(1, 254))
    return f"log{k}", text


def log_lines(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [LOG_INSTRUCTION, line]) for kind, line in (_log(rng) for _ in range(3 * N))])

    return instructed("log line", "a fixed instruction and one short log line (4 templates, 5-12 tokens: paths, "
                      "hosts, ids, addresses)", rows[:N], LOG_REWORDED, types, _among_its_kind(_log))


# --- literal (held out, written after the rule was changed and never tuned on) --------------------------

LITERAL_INSTRUCTION = "What is the type of this Python literal?"
LITERAL_REWORDED = ["Name the type of the value below.", "Which Python type does this literal have?",
                    "Give the type of the following literal."]


def _scalar(rng: random.Random) -> str:
    k = rng.randrange(6)
    return (str(rng.randint(0, 99)) if k == 0 else f"{rng.randint(0, 99)}.{rng.randint(0, 99)}" if k == 1
            else f"'{rng.choice(CITIES)}'" if k == 2 else f"'{rng.choice(FIRST)}'" if k == 3
            else rng.choice(("True", "False", "None")) if k == 4 else f"'{rng.choice(ITEMS)}'")


def _literal_value(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(4)
    items = [_scalar(rng) for _ in range(rng.randint(2, 4))]
    if k == 0:
        return "list", f"[{', '.join(items)}]"
    if k == 1:
        return "tuple", f"({', '.join(items)})"
    if k == 2:
        return "set", "{" + ", ".join(items) + "}"
    return "dict", "{" + ", ".join(f"'{rng.choice(LAST)}': {x}" for x in items) + "}"


def literals(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [LITERAL_INSTRUCTION, text]) for kind, text in
                          (_literal_value(rng) for _ in range(3 * N))])
    return instructed("literal", "a fixed instruction and a Python literal of 2-4 values (list, tuple, set, dict)",
                      rows[:N], LITERAL_REWORDED, types)


# --- url (held out, written before the literal shape was tuned on, measured before and after only) -----

URL_HOSTS = ("shop.example.com", "api.acme.io", "portal.northwind.net", "app.contoso.org", "files.initech.co",
             "m.globex.com")
URL_TEMPLATES = (
    "https://{host}/{noun}?page={n}&sort={col}",
    "https://{host}/search?q={item}&city={city}&limit={n}",
    "https://{host}/users/{first}.{last}?tab={tab}&v={k}",
    "https://{host}/{noun}/{rid}/edit?lang={lang}&ref={noun2}",
)
URL_KEYS = frozenset({"https", "page", "sort", "search", "q", "city", "limit", "users", "tab", "v", "edit", "lang",
                      "ref", *(h for host in URL_HOSTS for h in host.split("."))})  # the URLs' schema
URL_INSTRUCTION = "Which query parameters does this URL set, and to what?"
URL_REWORDED = ["List the query string's keys and values of the URL below.",
                "Parse the query parameters of this link.", "What does the query part of this URL hold?"]


def _url(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(URL_TEMPLATES))
    text = URL_TEMPLATES[k].format(host=rng.choice(URL_HOSTS), noun=rng.choice(NOUNS), n=rng.randint(1, 99),
                                   col=rng.choice(COLUMNS), item=rng.choice(ITEMS), city=rng.choice(CITIES),
                                   first=rng.choice(FIRST), last=rng.choice(LAST),
                                   tab=rng.choice(("profile", "orders", "settings", "billing")),
                                   k=rng.randint(1, 9), rid=rng.randint(100, 99999),
                                   lang=rng.choice(("en", "de", "fr", "pl", "pt", "fi")), noun2=rng.choice(NOUNS))
    return f"url{k}", text


def urls(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [URL_INSTRUCTION, url]) for kind, url in (_url(rng) for _ in range(3 * N))])

    return instructed("url", "a fixed instruction and one URL with a query string (4 templates, 6 hosts: paths, ids, "
                      "names, cities, numbers as keys' values)", rows[:N], URL_REWORDED, types, _among_its_kind(_url),
                      URL_KEYS)


# --- shell command ----------------------------------------------------------------------------------

SHELL_TEMPLATES = (
    "tar -czf /backup/{noun}-{day}-{n}.tar.gz /var/{noun2}/{first}",
    "rsync -avz --delete /srv/{noun}/{k}/ {first}@{city}-{n}:/backup/{noun2}",
    'grep -rn -m {n} "{col}" src/{noun}/{first} --include=*.{lang}',
    "docker run -d -p {port}:{port} --name {noun}-{k} {noun2}-api:{k}.{n}",
    'find /home/{first}/{noun} -name "*.{ext}" -mtime +{n} -size +{m}M -delete',
    "scp -P {port} {first}@{city}-{k}:/var/log/{noun}.log ./{day}/",
)
SHELL_FIXED = _fixed(SHELL_TEMPLATES)
SHELL_INSTRUCTION = "Explain what this shell command does."
SHELL_REWORDED = ["Describe what the following command does.", "What happens when this shell command runs?",
                  "Explain the command below in plain words."]
SHELL_HISTORY = ("cd ..", "ls -la", "git status", "df -h", "sudo systemctl restart nginx", "history | tail -5",
                 "clear", "cat ~/.ssh/config")
EXTS = ("csv", "log", "tmp", "bak", "pdf", "jpg", "json", "gz")
LANGS = ("py", "js", "go", "rs", "sql", "sh")
PORTS = (80, 443, 2222, 3000, 5432, 6379, 8000, 8080, 9000)


def _shell(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(SHELL_TEMPLATES))
    noun, noun2 = rng.sample(NOUNS, 2)
    text = SHELL_TEMPLATES[k].format(noun=noun, noun2=noun2, n=rng.randint(1, 99), first=rng.choice(FIRST),
                                     city=rng.choice(CITIES), k=rng.randint(1, 9), col=rng.choice(COLUMNS),
                                     port=rng.choice(PORTS), ext=rng.choice(EXTS), m=rng.randint(1, 500),
                                     day=rng.choice(DAYS), lang=rng.choice(LANGS))
    return f"shell{k}", text


def shell_commands(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [SHELL_INSTRUCTION, c]) for kind, c in (_shell(rng) for _ in range(3 * N))])

    def embed(p: Parts, r: random.Random) -> Parts:  # other commands of a shell history around it
        lines = [_shell(r)[1] if r.random() < 0.5 else r.choice(SHELL_HISTORY) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(lines[:2]), "\n".join(lines[2:]), r, "\n")]

    return instructed("shell command", "a fixed instruction and one shell command (6 templates sharing flags: "
                      "tar, rsync, grep, docker, find, scp; names, paths, hosts, ports)", rows[:N], SHELL_REWORDED,
                      types, embed, SHELL_FIXED)


# --- html element (synthetic) -----------------------------------------------------------------------

HTML_TEMPLATES = (
    '<a href="/{noun}/{n}" class="btn btn-{color}">{Item} for {City}</a>',
    '<img src="/img/{noun}-{n}.png" alt="{First} {Last}" width="{w}" height="{h}">',
    '<input type="{itype}" name="{col}" value="{n}" maxlength="{k}">',
    '<td class="{col}" data-id="{n}">{First} {Last}, {City}</td>',
    '<option value="{day}-{n}" selected>{Day} {d} {Month} at {hh}:{mm}</option>',
    '<span class="badge bg-{color}" title="{n} {noun} in {city}">{k} new</span>',
)
HTML_INSTRUCTION = "What does this HTML element display?"
HTML_REWORDED = ["Describe what the following HTML element shows on the page.",
                 "What would a browser show for this element?", "Explain what this piece of HTML renders."]
COLOURS = ("primary", "secondary", "success", "danger", "warning", "info", "dark", "light")
INPUT_TYPES = ("text", "number", "hidden", "search", "tel", "password")
HTML_PAGE = ("<ul>", "</ul>", "<tr>", "</tr>", "<div class=\"row\">", "</div>", "<br>", "<hr>")


def _html(rng: random.Random, k: int | None = None) -> tuple[str, str]:
    k = rng.randrange(len(HTML_TEMPLATES)) if k is None else k
    text = HTML_TEMPLATES[k].format(noun=rng.choice(NOUNS), n=rng.randint(1, 999), color=rng.choice(COLOURS),
                                    Item=rng.choice(ITEMS).title(), City=rng.choice(CITIES).title(),
                                    city=rng.choice(CITIES), First=rng.choice(FIRST).title(),
                                    Last=rng.choice(LAST).title(), w=rng.choice((64, 120, 240, 320, 480, 640)),
                                    h=rng.choice((48, 90, 180, 240, 360)), itype=rng.choice(INPUT_TYPES),
                                    col=rng.choice(COLUMNS), k=rng.randint(1, 99), day=rng.choice(DAYS),
                                    Day=rng.choice(DAYS).title(), d=rng.randint(1, 28), Month=rng.choice(MONTHS),
                                    hh=rng.randint(8, 20), mm=rng.choice(("00", "15", "30", "45")))
    return f"html{k}", text


def html_elements(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [HTML_INSTRUCTION, e]) for kind, e in (_html(rng) for _ in range(3 * N))])

    def embed(p: Parts, r: random.Random) -> Parts:  # among sibling elements of a page
        k = int(types[p[1]].removeprefix("html"))
        siblings = [_html(r, k if r.random() < 0.6 else None)[1] if r.random() < 0.8 else r.choice(HTML_PAGE)
                    for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(siblings[:2]), "\n".join(siblings[2:]), r, "\n")]

    return instructed("html element", "a fixed question and one HTML element (6 templates: link, image, input, "
                      "table cell, option, badge; names, numbers, cities, columns, colours, dates as values)",
                      rows[:N], HTML_REWORDED, types, embed, _fixed(HTML_TEMPLATES))


# --- email header (synthetic) -------------------------------------------------------------------------

EMAIL_TEMPLATES = (
    "From: {First} {Last} <{first}.{last}@{host}>",
    "Date: {Day}, {d} {Mon} {yyyy} {hh}:{mm}:{ss} +0{tz}00",
    "Subject: Re: {noun} report for {City} ({n})",
    "Message-ID: <{hex}.{n}@mail.{host}>",
    "To: {team}-{n}@{host}",
)
EMAIL_ORDER = (3, 1, 0, 4, 2)  # a message's header lines: Message-ID, Date, From, To, Subject
EMAIL_INSTRUCTION = "Who sent this e-mail, and when?"
EMAIL_REWORDED = ["Give the sender and the time of this e-mail.", "From whom is this message, and when was it sent?",
                  "Name the e-mail's sender and its date."]
EMAIL_HOSTS = ("fabrikam.com", "tailspin.io", "wingtip.net", "litware.org", "proseware.de", "lucerne.co.uk",
               "woodgrove.bank", "fourthcoffee.com")


def _email_values(rng: random.Random) -> dict[str, str | int]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    return dict(First=first.title(), Last=last.title(), first=first, last=last, host=rng.choice(EMAIL_HOSTS),
                Day=rng.choice(WEEKDAYS), d=rng.randint(1, 28), Mon=rng.choice(MONTH_ABBR),
                yyyy=rng.randint(2015, 2025), hh=f"{rng.randint(0, 23):02d}", mm=f"{rng.randint(0, 59):02d}",
                ss=f"{rng.randint(0, 59):02d}", tz=rng.randint(1, 9), noun=rng.choice(NOUNS),
                City=rng.choice(CITIES).title(), n=rng.randint(1, 999), hex=f"{rng.getrandbits(40):010x}",
                team=rng.choice(NOUNS))


def _email(rng: random.Random, k: int | None = None) -> tuple[str, str, dict[str, str | int]]:
    """(its type, the header line, the values it was written with)."""
    k = rng.randrange(len(EMAIL_TEMPLATES)) if k is None else k
    values = _email_values(rng)
    return f"email{k}", EMAIL_TEMPLATES[k].format(**values), values


def email_headers(rng: random.Random) -> Shape:
    drawn = [_email(rng) for _ in range(3 * N)]
    rows, types = _typed([(kind, [EMAIL_INSTRUCTION, h]) for kind, h, _ in drawn])
    values = {h: v for _, h, v in reversed(drawn)}  # a line's values where it was first drawn

    def change(p: Parts, r: random.Random) -> Parts | None:  # one value drawn again, wherever it is in the line
        template = EMAIL_TEMPLATES[int(types[p[1]].removeprefix("email"))]
        fields = sorted(set(re.findall(r"\{(\w+)\}", template)) - {"host"})  # a host is two tokens and more
        field = r.choice(fields)
        for _ in range(100):
            new = template.format(**{**values[p[1]], field: _email_values(r)[field]})
            if new != p[1]:
                return [p[0], new]
        return None

    def embed(p: Parts, r: random.Random) -> Parts:  # among the other header lines of one message
        at = EMAIL_ORDER.index(int(types[p[1]].removeprefix("email")))
        lines = [_email(r, j)[1] for j in EMAIL_ORDER]
        return [p[0], _around(p[1], "\n".join(lines[:at]), "\n".join(lines[at + 1 :]), r, "\n")]

    shape = instructed("email header", "a fixed instruction and one e-mail header line (5 templates: From, Date, "
                       "Subject, Message-ID, To; names, numbers, dates, cities, nouns as values; hosts never "
                       "changed)", rows[:N], EMAIL_REWORDED, types, embed)
    return dataclasses.replace(shape, change=change)


# --- config line (synthetic) ---------------------------------------------------------------------------

CONFIG_TEMPLATES = (
    "{key}: {n}",
    "[{section}]\nhost = {city}-db{k}.internal\nport = {port}",
    "{section}:\n  timeout: {n}s\n  retries: {k}\n  log_file: /var/log/{noun}/{first}.log",
    "DATABASE_URL=postgres://{first}:{secret}@{city}-db{k}.internal:{port}/{noun}",
    "upstream {section} {{ server {city}-app{k}.internal:{port} weight={m}; }}",
    "max_{thing} = {n}  ; raised by {first} on {d} {Month} {year}",
)
CONFIG_KEYS = frozenset({"key", "section", "thing"})  # the fields that are keys: never drawn again
KEYS = ("timeout", "retries", "workers", "max_connections", "pool_size", "batch_size", "cache_ttl", "threads",
        "queue_depth", "max_body_kb", "idle_seconds", "backlog", "keepalive", "read_timeout", "shards", "replicas")
SECTIONS = ("database", "cache", "queue", "search", "auth", "metrics", "storage", "mailer", "billing", "scheduler")
CONFIG_INSTRUCTION = "Which settings does this configuration set, and to what values?"
CONFIG_REWORDED = ["List the settings in the configuration below with their values.",
                   "What does this config snippet configure?", "Name each key of this configuration and its value."]
CONFIG_FILE = ("# managed by ansible, do not edit", "[logging]", "level = info", "---", "debug: false",
               "# see docs/config.md")


def _config_values(rng: random.Random) -> Values:
    return dict(key=rng.choice(KEYS), section=rng.choice(SECTIONS), thing=rng.choice(NOUNS), n=rng.randint(1, 9999),
                city=rng.choice(CITIES), k=rng.randint(1, 9), port=rng.randint(1024, 9999), noun=rng.choice(NOUNS),
                first=rng.choice(FIRST), secret=f"{rng.choice(LAST)}{rng.randint(10, 99)}", m=rng.randint(1, 10),
                d=rng.randint(1, 28), Month=rng.choice(MONTHS), year=rng.randint(2015, 2025))


def _config(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("config", CONFIG_TEMPLATES, _config_values, rng)


def config_lines(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("config", CONFIG_TEMPLATES, _config_values, rng, (CONFIG_INSTRUCTION,),
                                     lambda template: CONFIG_KEYS)  # (never a key)

    def embed(p: Parts, r: random.Random) -> Parts:  # among other lines of a config file
        other = [_config(r)[1] if r.random() < 0.5 else r.choice(CONFIG_FILE) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    shape = instructed("config line", "a fixed instruction and one config line or short block (6 templates: YAML, "
                       "INI, env, nginx; numbers, ports, hosts, paths, names, dates as values; keys never changed)",
                       rows[:N], CONFIG_REWORDED, types, embed)
    return dataclasses.replace(shape, change=change)
