"""What every shape of task is built from: the ``Shape`` a generator returns, the sizes, the word
lists synthetic rows draw from, and the shared ways a leak is made (a name or number changed, text put
around an input, one value of a template drawn again).
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from dataclasses import dataclass, field

EVAL = 200
PER_KIND = 40
POOL = 3000
Parts = list[str]
KINDS = ("exact", "case+space", "re-instructed", "embedded", "one token changed")
TOKEN = re.compile(r"\w+|[^\w\s]")  # the rule's tokens (data/text.py), to size what is planted
N = 2 * EVAL + POOL  # the rows a synthetic shape draws: validation, test and the training pool


@dataclass
class Shape:
    name: str
    what: str
    rows: list[Parts]  # all rows, shuffled: the first 2 * EVAL are validation and test
    render: Callable[[Parts], str]  # the task's rendered prompt (what the rule before this one matched)
    change: Callable[[Parts, random.Random], Parts | None]  # one token changed
    reword: Callable[[Parts, random.Random], Parts | None]
    embed: Callable[[Parts, random.Random], Parts | None]
    content: Callable[[Parts], str] = lambda p: " ".join(p)  # noqa: E731  what the generator varied
    types: dict[str, str] = field(default_factory=dict)  # a row's last part -> its type (template); default one


def ntokens(text: str) -> int:
    return len(TOKEN.findall(text))


FILLER = ("see", "also", "the", "notes", "below", "from", "our", "module", "reference", "page", "this", "one",
          "was", "found", "in", "an", "old", "review", "thread", "and", "kept", "here", "for", "context")


def around(text: str, rng: random.Random) -> tuple[str, str]:
    """Words to put before and after ``text``: as much text again as it holds tokens, or up to half less."""
    n = ntokens(text)
    k = rng.randint(max(1, (n + 1) // 2), max(1, n))
    words = [rng.choice(FILLER) for _ in range(k)]
    cut = rng.randint(0, k)
    return " ".join(words[:cut]), " ".join(words[cut:])


def embedded(text: str, rng: random.Random) -> str:
    before, after = around(text, rng)
    return f"{before} {text} {after}".strip()


WORDS = re.compile(r"[A-Za-z_][A-Za-z_0-9]{3,}")


def _rename(text: str, rng: random.Random, name: str | None = None) -> str | None:
    names = sorted(set(WORDS.findall(text)))
    if not names:
        return None
    name = name or rng.choice(names)
    new = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(len(name)))
    return re.sub(rf"\b{re.escape(name)}\b", new, text)


NAME_OR_NUMBER = re.compile(r"\b(?:[A-Za-z_]\w*|\d+)\b")


# --- generated shapes unlike the stdlib ones (issue 46): SQL, word problems, JSON records, dialogue ------

FIRST = ("maria", "sofia", "liam", "noah", "emma", "olivia", "ava", "mia", "lucas", "ethan", "amir", "yuki",
         "chen", "priya", "omar", "lena", "jonas", "ines", "pablo", "nadia", "tomas", "greta", "ivan", "hana",
         "kofi", "zara", "diego", "elena", "felix", "irene", "karim", "laura", "marco", "nina", "oscar", "paula",
         "rosa", "samir", "tariq", "vera", "wanda", "xavier", "yasmin", "aaron", "bianca", "carla", "dmitri",
         "esther", "farah", "gustav")
LAST = ("moreno", "tanaka", "okafor", "schmidt", "novak", "silva", "kowalski", "haddad", "larsen", "rossi",
        "dubois", "ivanova", "nguyen", "patel", "garcia", "fischer", "mendes", "horvat", "lindqvist", "costa")
NOUNS = ("orders", "customers", "invoices", "products", "shipments", "employees", "accounts", "payments",
         "tickets", "sessions", "devices", "vendors", "refunds", "reviews", "courses", "students", "flights",
         "bookings", "patients", "visits", "sensors", "readings", "branches", "loans", "assets", "contracts",
         "drivers", "routes", "warehouses", "batches")
COLUMNS = ("price", "quantity", "status", "created_at", "email", "region", "score", "balance", "rating",
           "weight", "duration", "priority", "discount", "country", "level", "amount", "budget", "capacity",
           "category", "owner", "stock", "total", "tax", "age", "city", "grade", "speed", "cost", "margin",
           "tier", "channel", "source", "label", "rank")
CITIES = ("lyon", "porto", "graz", "turku", "lodz", "ghent", "bergen", "cork", "split", "brno", "malmo",
          "aarhus", "bilbao", "trieste", "utrecht", "leipzig", "tartu", "kaunas", "varna", "nantes")
ITEMS = ("apples", "pencils", "marbles", "stickers", "cookies", "books", "stamps", "shells", "coins", "cards",
         "balloons", "candles", "buttons", "ribbons", "tickets", "plates", "cups", "seeds", "bricks", "beads")
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTH_ABBR = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


def _name_or_number_changed(text: str, rng: random.Random, fixed: frozenset[str] = frozenset()) -> str | None:
    """One name (a person, place, table, column, item) or one number of ``text`` changed wherever it
    is, to another of its kind (case kept); never one of ``fixed`` (a record's keys: its schema)."""
    found = sorted({t for t in NAME_OR_NUMBER.findall(text)
                    if t not in fixed and (t.lower() in KIND_OF or t.isdigit())})
    if not found:
        return None
    old = rng.choice(found)
    pool = [str(rng.randint(2, 999)) for _ in range(20)] if old.isdigit() else list(KIND_OF[old.lower()])
    new = next((x for x in rng.sample(pool, len(pool))
                if x != old.lower() and not re.search(rf"\b{x}\b", text, re.IGNORECASE)), None)
    if new is None:
        return None
    return re.sub(rf"\b{re.escape(old)}\b", new.title() if old.istitle() else new, text)


KIND_OF = {w: kind for kind in (FIRST, LAST, NOUNS, COLUMNS, CITIES, ITEMS, DAYS) for w in kind}


def _typed(rows: list[tuple[str, Parts]]) -> tuple[list[Parts], dict[str, str]]:
    """Unique rows (by their last part) and each one's type (the template it came from)."""
    out, types = [], {}
    for kind, parts in rows:
        if parts[-1] not in types:
            types[parts[-1]] = kind
            out.append(parts)
    return out, types


def alpaca(p: Parts) -> str:
    return f"### Instruction:\n{p[0]}\n\n### Input:\n{p[1]}\n\n### Response:\n"


def instructed(name: str, what: str, rows: list[Parts], reworded: list[str], types: dict[str, str],
               embed: Callable[[Parts, random.Random], Parts | None] | None = None,
               fixed: frozenset[str] = frozenset()) -> Shape:
    """Alpaca rows of a fixed instruction and the input the generator varied: a copy changes one name or
    number of the input (never one of ``fixed``, the input's schema), rewords the instruction (one of
    ``reworded``), or sets the input among other text (``embed``; by default filler around it)."""
    return Shape(name, what, rows, alpaca,
                 lambda p, r: [p[0], x] if (x := _name_or_number_changed(p[1], r, fixed)) else None,
                 lambda p, r: [r.choice(reworded), p[1]], embed or (lambda p, r: [p[0], embedded(p[1], r)]),
                 lambda p: p[1], types)


def _around(text: str, before: str, after: str, rng: random.Random, sep: str = " ") -> str:
    """``text`` after the end of ``before`` and before the start of ``after``, with as many tokens again
    as it holds around it or up to half less (less only where the context runs out): a copy inside a
    longer training row."""
    n = ntokens(text)
    budget = rng.randint(max(1, (n + 1) // 2), max(1, n))
    tail = _cut(after, budget - ntokens(_cut(before, rng.randint(0, budget), True)), False)
    head = _cut(before, budget - ntokens(tail), True)
    return sep.join(x for x in (head, text, tail) if x)


def _cut(text: str, most: int, from_end: bool) -> str:
    """The end (or start) of ``text`` that holds ``most`` of its tokens (all of them if it has fewer)."""
    found = list(TOKEN.finditer(text))
    if most >= len(found):
        return text.strip()
    if most <= 0:
        return ""
    return (text[found[-most].start() :] if from_end else text[: found[most - 1].end()]).strip()


def _fixed(templates: tuple[str, ...]) -> frozenset[str]:
    """The templates' own words (commands, flags, keys, words like ``budget``): never changed."""
    return frozenset(w for t in templates for w in re.findall(r"\w+", re.sub(r"\{\w+\}", " ", t)))


def _among_its_kind(draw: Callable[[random.Random], tuple[str, str]]) -> Callable[[Parts, random.Random], Parts]:
    """An embedded copy for a shape whose generator is ``draw``: the input among three more of its kind
    (a CSV row among rows of an export, a log line in its log, a URL among a page's links)."""
    def embed(p: Parts, r: random.Random) -> Parts:
        return [p[0], _among(p[1], [draw(r)[1] for _ in range(3)], r)]
    return embed


def _among(text: str, other: list[str], rng: random.Random, sep: str = "\n") -> str:
    """``text`` among other lines (before, after or both), at most as many tokens again as it holds
    and at least half as many where the lines allow: a copy inside a longer training row."""
    n = ntokens(text)
    budget = rng.randint(max(1, (n + 1) // 2), max(1, n))
    before, after = [], []
    for line in other:
        toks = ntokens(line)
        if toks > budget:
            words = line.split(" ")
            while words and ntokens(" ".join(words)) > budget:
                words.pop()
            line, toks = " ".join(words), ntokens(" ".join(words))
        if not line:
            break
        (before if rng.random() < 0.5 else after).append(line)
        budget -= toks
        if budget <= 0:
            break
    return sep.join([*before, text, *after])


Values = dict[str, str | int]


# --- one value drawn again (the synthetic shapes) -------------------------------------------------------

def _redrawn(template: str, values: Values, draw: Callable[[random.Random], Values], fixed: frozenset[str],
             r: random.Random) -> str | None:
    """``template`` written with one of its value fields (never one of ``fixed``: keys) drawn again,
    where it has two or more: checked to differ in exactly one token, one not in the row already."""
    fields = sorted({f for _, f, _, _ in string.Formatter().parse(template) if f} - fixed)
    if len(fields) < 2:  # `timeout: 30` -> `timeout: 45`: another setting, not a copy
        return None
    old = TOKEN.findall(template.format(**values).lower())
    field = r.choice(fields)
    for _ in range(100):
        new = template.format(**{**values, field: draw(r)[field]})
        toks = TOKEN.findall(new.lower())
        diff = [b for a, b in zip(old, toks, strict=True) if a != b] if len(toks) == len(old) else []
        if len(diff) == 1 and diff[0] not in old:
            return new
    return None


def _drawn(kind: str, templates: tuple[str, ...], draw, rng: random.Random) -> tuple[str, str, Values]:
    """(its type, a row of one of ``templates``, the values ``draw`` gave it)."""
    k = rng.randrange(len(templates))
    values = draw(rng)
    return f"{kind}{k}", templates[k].format(**values), values


def drawn_rows(kind: str, templates: tuple[str, ...], draw: Callable[[random.Random], Values], rng: random.Random,
               lead: tuple[str, ...] = (), fixed: Callable[[str], frozenset[str]] = lambda template: frozenset()
               ) -> tuple[list[Parts], dict[str, str], Callable[[Parts, random.Random], Parts | None]]:
    """A synthetic shape's ``3 * N`` drawn rows (``lead``, a fixed instruction, then the drawn text), unique,
    their types (``kind`` and the template's index), and its one-token change: one value of the row's
    template drawn again (``_redrawn``, never one of ``fixed(template)``), wherever it is."""
    drawn = [_drawn(kind, templates, draw, rng) for _ in range(3 * N)]
    rows, types = _typed([(k, [*lead, text]) for k, text, _ in drawn])
    values = {text: v for _, text, v in reversed(drawn)}  # a row's values where it was first drawn

    def change(p: Parts, r: random.Random) -> Parts | None:
        template = templates[int(types[p[-1]].removeprefix(kind))]
        new = _redrawn(template, values[p[-1]], draw, fixed(template), r)
        return [*p[:-1], new] if new else None

    return rows, types, change


# --- one value drawn again (the synthetic shapes) -------------------------------------------------------

def _repeated(template: str) -> frozenset[str]:
    """The fields ``template`` writes twice (a bump's major and minor): never drawn again, two tokens."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    return frozenset(f for f in fields if fields.count(f) > 1)
