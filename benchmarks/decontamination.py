"""Planted leaks: decontamination's recall per kind of leak and its false removals, per shape of task.

    python benchmarks/decontamination.py --out benchmarks/results/decontamination.md
    python benchmarks/decontamination.py --set ngram=13 common_share=0.1     # other settings
    python benchmarks/decontamination.py --before                            # + the rule of commit 8464ad6
    python benchmarks/decontamination.py --shapes "short code" --explain     # which rule removed which clean rows

Each shape of task is built from what is on the machine (generated sums, the standard library's
docstrings, function sources and expressions): 200 validation and 200 test rows, and a pool of
training rows that are not copies of them. "Not a copy" is decided apart from the rule under test:
a pool row whose exact character 5-gram Jaccard similarity with some evaluation input reaches 0.5 is
a natural overlap (the stdlib repeats itself): kept in the training rows, neither planted nor clean,
and reported apart (how many the rule removed). A training input that holds a whole evaluation input
and is at most about twice as long is such an overlap; one more than twice as long is clean. Then 40
leaks of each kind are planted, half from validation and half from test rows:

- ``exact``: the evaluation input copied;
- ``case+space``: the same with its case changed and runs of spaces, tabs or newlines inserted;
- ``re-instructed``: what comes before the evaluation content reworded (the instruction, the chat
  turn's lead-in) or, where nothing does, a few words put before it;
- ``embedded``: the evaluation content inside a longer input, with up to as much other text again
  around it (words before and after it; for code expressions, code around it: ``print(...)``,
  ``x = ...``);
- ``one token changed``: an identifier renamed everywhere (the function's name, a word of a
  docstring); for short code, one name or one number changed. Not planted for sums: a sum with one
  number changed is another question with another answer.

A kind that cannot apply to a row is not planted from it (a row without a word to rename; an
evaluation input of fewer than 3 tokens, a bare name, is a copy only when copied whole, so it is not
embedded or changed). Recall = planted rows removed / planted; false removals = clean rows removed /
clean rows (the target: at most 1%); precision = planted rows removed / (planted + clean rows
removed). Beside the one-token recall: those of the one-token copies that can be told apart from the
task's legitimate rows (no other row and no other input fills the copy's frame), and the legitimate
rows of that same form (an input with one token changed, its frame theirs alone) the rule removed:
what finding those copies costs (``told_apart``; both decided from the rows, apart from the rule).
The rows are input parts as the task hands them to decontamination
(``TaskConfig.input_parts``). ``--before`` also runs the previous rule, which matched the rendered
prompt (template included) with datasketch's MinHash.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import json
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

try:
    from recipetune.data.decontam import ContaminationIndex
except ImportError:  # the rule before issue 46 (PYTHONPATH=<a checkout before it>/src) kept it in data/text.py
    from recipetune.data.text import ContaminationIndex
from recipetune.data.ops import Decontaminate
from recipetune.data.text import normalize
from recipetune.finetune.bench_tasks import stdlib_functions
from recipetune.trainer.data import STDLIB_SKIP_DIRS, walk_files

EVAL = 200
PER_KIND = 40
POOL = 3000
Parts = list[str]
KINDS = ("exact", "case+space", "re-instructed", "embedded", "one token changed")
TOKEN = re.compile(r"\w+|[^\w\s]")  # the rule's tokens (data/text.py), to size what is planted


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


WORDS = re.compile(r"[A-Za-z_][A-Za-z_0-9]{3,}")


def _rename(text: str, rng: random.Random, name: str | None = None) -> str | None:
    names = sorted(set(WORDS.findall(text)))
    if not names:
        return None
    name = name or rng.choice(names)
    new = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(len(name)))
    return re.sub(rf"\b{re.escape(name)}\b", new, text)


LEAD_INS = ["From the docs: ", "The docstring says: ", "Doc: ", "Summary - ", "It reads: "]


def docstrings(rng: random.Random) -> Shape:
    docs = sorted({doc for _, _, doc in stdlib_functions()})
    rng.shuffle(docs)
    rows = [[d] for d in docs[: 2 * EVAL + POOL]]
    return Shape("docstring", "a stdlib docstring's first line (20-160 chars), template `Docstring: {doc}\\nModule: `",
                 rows, lambda p: f"Docstring: {p[0]}\nModule: ",
                 lambda p, r: [x] if (x := _rename(p[0], r)) else None,
                 lambda p, r: [r.choice(LEAD_INS) + p[0]], lambda p, r: [embedded(p[0], r)])


INSTRUCTION = ("Read the Python function below carefully. Count how many parameters it declares, "
               "including self, and answer with that number only.")
REWORDED = ["Look at this Python function and tell me the number of parameters it takes (count self too).",
            "How many parameters does the following function declare? Include self; reply with a number.",
            "Count the declared parameters of the function below, self included. Just the number."]


def stdlib_sources(limit: int) -> list[tuple[str, str]]:
    """(function name, source) of short stdlib functions (3-12 lines), unique sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, seen = [], set()
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and 3 <= node.end_lineno - node.lineno + 1 <= 12:
                src = ast.get_source_segment(text, node)
                key = normalize(src or "")
                if src and key not in seen and len(src) < 700:
                    seen.add(key)
                    out.append((node.name, src))
        if len(out) >= limit:
            break
    return out


def code(rng: random.Random) -> Shape:
    """The issue's case: every prompt opens with the same instruction, inside the field itself."""
    funcs = stdlib_sources(2 * (2 * EVAL + POOL))
    funcs.sort(key=lambda f: hashlib.sha256(f[1].encode()).hexdigest())
    rows = [[f"{INSTRUCTION}\n{src}"] for _, src in funcs[: 2 * EVAL + POOL]]

    def rename(p: Parts, r: random.Random) -> Parts | None:  # the function's name, everywhere
        name = re.search(r"def (\w+)", p[0])
        return [_rename(p[0], r, name.group(1))] if name else None

    def embed(p: Parts, r: random.Random) -> Parts:  # comment lines around the function
        before, after = around(p[0][len(INSTRUCTION):], r)
        return [f"{INSTRUCTION}\n# {before}{p[0][len(INSTRUCTION):]}\n# {after}"]

    return Shape("instruction+code", "a fixed 22-word instruction then a stdlib function (3-12 lines), "
                 "in one field; template `{prompt}\\nAnswer: `", rows, lambda p: f"{p[0]}\nAnswer: ",
                 rename, lambda p, r: [r.choice(REWORDED) + p[0][len(INSTRUCTION):]], embed,
                 lambda p: p[0][len(INSTRUCTION):])


SYSTEM = ("You are a careful assistant for Python developers. Answer in one word, the name of the "
          "standard-library module, with no explanation.")


def chat(rng: random.Random) -> Shape:
    """Chat turns: a fixed system prompt, a user turn with a docstring, an assistant turn and a fixed
    follow-up question; the input parts are the messages' contents before the target."""
    funcs = sorted({(doc, name) for _, name, doc in stdlib_functions()})
    rng.shuffle(funcs)
    rows = [[SYSTEM, f"I found this docstring: \"{doc}\"", f"It documents a function called {name}.",
             "Which module is it from?"] for doc, name in funcs[: 2 * EVAL + POOL]]

    def render(p: Parts) -> str:
        roles = ["System", "User", "Assistant", "User"]
        return "".join(f"{role}: {text}\n" for role, text in zip(roles, p, strict=True)) + "Assistant: "

    def rename(p: Parts, r: random.Random) -> Parts | None:
        name = p[2].removeprefix("It documents a function called ").rstrip(".")
        new = _rename(p[1] + "\n" + p[2], r, name)
        return [p[0], *new.split("\n"), p[3]] if new else None

    def reword(p: Parts, r: random.Random) -> Parts:
        return [p[0], "Here is a docstring: " + p[1].removeprefix("I found this docstring: "), p[2], p[3]]

    def embed(p: Parts, r: random.Random) -> Parts:  # words around the quoted docstring, in the same turn
        before, after = around(p[1].removeprefix("I found this docstring: "), r)
        return [p[0], f"{before} {p[1]} {after}".strip(), p[2], p[3]]

    return Shape("chat", "system prompt (fixed, 24 words) + user turn with a docstring + assistant turn + "
                 "fixed follow-up; plain rendering `System: ...\\nUser: ...`", rows, render, rename, reword, embed,
                 lambda p: p[1].removeprefix("I found this docstring: ") + " " + p[2].split()[-1])


EXPR_LABELS = ("Call", "Attribute", "Constant", "Name", "Compare", "BinOp", "Tuple", "Subscript", "UnaryOp",
               "BoolOp", "JoinedStr", "IfExp")
EXPR_INSTRUCTION = "Classify the Python expression by the kind of its outermost node."
EXPR_REWORDED = ["What kind of node is the outermost one in this expression?",
                 "Name the top-level AST node type of the following Python expression.",
                 "Which node class does this expression parse to at its root?"]
WRAPPERS = [("print(", ")"), ("x = ", ""), ("return ", ""), ("assert ", ""), ("(", ")"), ("yield ", ""),
            ("[", "]"), ("f(", ")"), ("not ", ""), ("", " or None")]
NAME_OR_NUMBER = re.compile(r"\b(?:[A-Za-z_]\w*|\d+)\b")


def stdlib_expressions(limit: int) -> list[tuple[str, str]]:
    """(source, node type) of unique one-line stdlib expressions of 3-60 ASCII characters whose
    outermost node is one of ``EXPR_LABELS``: a dozen labels, as in the issue's task."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out: dict[str, str] = {}
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        try:
            data = path.read_bytes()
            tree = ast.parse(data)
        except (SyntaxError, ValueError):
            continue
        lines = data.splitlines()
        for node in ast.walk(tree):  # (offsets are in bytes: sliced from the line's bytes)
            label = type(node).__name__
            if isinstance(node, ast.expr) and label in EXPR_LABELS and node.lineno == node.end_lineno:
                src = lines[node.lineno - 1][node.col_offset : node.end_col_offset]
                if 3 <= len(src) <= 60 and src.isascii():
                    out.setdefault(src.decode(), label)
        if len(out) >= limit:
            break
    return sorted(out.items())


def short_code(rng: random.Random) -> Shape:
    """The issue's own task: Alpaca rows (a fixed instruction, a short code expression as the input),
    the answer one of a dozen labels. Code contains code: a short input recurs inside longer ones."""
    exprs = stdlib_expressions(6 * (2 * EVAL + POOL))
    rng.shuffle(exprs)
    rows = [[EXPR_INSTRUCTION, src] for src, _ in exprs[: 2 * EVAL + POOL]]

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name or one number, wherever it is
        tokens = sorted(set(NAME_OR_NUMBER.findall(p[1])))
        if len(tokens) < 3:  # `self.x` -> `self.y`, `len(a)` -> `len(b)`: another input, not a copy
            return None
        old = r.choice(tokens)
        while (new := (str(r.randint(0, 10 ** len(old))) if old.isdigit() else
                       "".join(r.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(len(old))))) == old:
            pass
        return [p[0], re.sub(rf"\b{re.escape(old)}\b", new, p[1])]

    def embed(p: Parts, r: random.Random) -> Parts | None:
        if ntokens(p[1]) < 3:
            return None
        before, after = r.choice(WRAPPERS)
        return [p[0], f"{before}{p[1]}{after}"]

    return Shape("short code", f"Alpaca rows: a fixed instruction, a stdlib expression of 3-60 characters as the "
                 f"input, {len(EXPR_LABELS)} labels (the issue's task)", rows,
                 lambda p: f"### Instruction:\n{p[0]}\n\n### Input:\n{p[1]}\n\n### Response:\n",
                 change, lambda p, r: [r.choice(EXPR_REWORDED), p[1]], embed, lambda p: p[1])


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


PROBLEMS = (
    "{a} has {x} {item}. {a} buys {y} more {item} and gives {z} to {b}. How many {item} does {a} have now?",
    "A box holds {x} {item}. {a} fills {y} boxes and sells {z} {item}. How many {item} are left?",
    "{a} reads {x} pages a day for {y} days. The book has {z} pages. How many pages are left?",
    "{a} and {b} share {x} {item} equally. Then {a} eats {y}. How many {item} does {a} have?",
    "A train leaves {city} and travels {x} km in {y} hours. How far does it go in {z} hours?",
    "{a} saves {x} euros a week. After {y} weeks {a} spends {z} euros. How much is left?",
)


def word_problems(rng: random.Random) -> Shape:
    """One field, a grade-school word problem from one of 6 templates (its type): 15-30 tokens, the
    length where one changed token costs an 8-gram rule most of its n-grams."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(PROBLEMS))
        a, b = rng.sample(FIRST, 2)
        text = PROBLEMS[k].format(a=a.title(), b=b.title(), item=rng.choice(ITEMS), city=rng.choice(CITIES).title(),
                                  x=rng.randint(2, 99), y=rng.randint(2, 99), z=rng.randint(2, 99))
        return f"problem{k}", [text]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    lead = ["Solve: ", "Homework question: ", "Please work this out: ", "Q: "]
    return Shape("word problem", "one field, a word problem (6 templates, 50 names, 20 items, numbers 2-99)",
                 rows[: 2 * EVAL + POOL], lambda p: f"Problem: {p[0]}\nAnswer: ",
                 lambda p, r: [x] if (x := _name_or_number_changed(p[0], r)) else None,
                 lambda p, r: [r.choice(lead) + p[0]], lambda p, r: [embedded(p[0], r)], lambda p: p[0], types)


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


BOOKING = (
    "Hi, I would like to book a table for {x} at {place} on {day} at {h} pm.",
    "Can you move my {day} booking at {place} to {h} pm? It is under {a}.",
    "Please cancel the reservation for {x} people under the name {a} {b}.",
    "Is {place} open on {day}? We are {x} and would arrive around {h}.",
)
PLACES = ("Bistro", "Grill", "Kitchen", "Trattoria", "House", "Garden", "Table", "Cafe", "Tavern", "Deli")
DIALOGUE_SYSTEM = "You are the booking assistant of a restaurant group. Reply with the intent only."


def dialogue(rng: random.Random) -> Shape:
    """Short chat turns: a fixed system prompt and one user turn from one of 4 intents (its type)."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(BOOKING))
        place = f"{rng.choice(LAST).title()} {rng.choice(PLACES)}"
        day = f"{rng.choice(DAYS).title()} the {rng.randint(1, 28)}th"
        text = BOOKING[k].format(x=rng.randint(2, 12), place=place, day=day, h=rng.randint(5, 10),
                                 a=rng.choice(FIRST).title(), b=rng.choice(LAST).title())
        return f"intent{k}", [DIALOGUE_SYSTEM, text]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    return Shape("dialogue", "chat: a fixed system prompt and one short user turn (4 intents, 12-20 tokens)",
                 rows[: 2 * EVAL + POOL], lambda p: f"System: {p[0]}\nUser: {p[1]}\nAssistant: ",
                 lambda p, r: [p[0], x] if (x := _name_or_number_changed(p[1], r)) else None,
                 lambda p, r: [p[0], "Quick question. " + p[1]], lambda p, r: [p[0], embedded(p[1], r)],
                 lambda p: p[1], types)


SHAPES = {"arith": arith, "docstring": docstrings, "instruction+code": code, "chat": chat, "short code": short_code,
          "sql": sql, "word problem": word_problems, "json record": json_records, "dialogue": dialogue}


# --- leaks --------------------------------------------------------------------------------------------

def case_space(parts: Parts, rng: random.Random) -> Parts:
    def vary(text: str) -> str:
        text = rng.choice([str.upper, str.lower, str.title, str.swapcase])(text)
        words = text.split(" ")
        for _ in range(max(1, len(words) // 4)):
            i = rng.randrange(len(words))
            words[i] = words[i] + rng.choice(["  ", "\t", "\n", "   "])
        return " ".join(words)

    return [vary(p) for p in parts]


def shingles(text: str, k: int = 5) -> set[str]:
    t = normalize(text)
    return {t[i : i + k] for i in range(len(t) - k + 1)} or {t}


def natural_overlaps(shape: Shape, pool: list[Parts], evals: list[Parts]) -> set[int]:
    """Pool rows that are what a planted leak would be, over what the generator varied (the shape's
    fixed instruction or system prompt left out): an exact 5-gram Jaccard with an evaluation input of
    0.5 or more; or, in tokens, an evaluation input inside at most as much other text again (the
    ``embedded`` kind) or the same tokens with one name (or, but for sums, number) changed wherever it
    is, where the input has 3 names or numbers (the ``one token changed`` kind). A row built as a leak
    is not clean because the pool happens to hold it."""
    ev = [shingles(shape.content(p)) for p in evals]
    by_gram: dict[str, list[int]] = {}
    for j, s in enumerate(ev):
        for g in s:
            by_gram.setdefault(g, []).append(j)
    ev_tokens = [TOKEN.findall(shape.content(p).lower()) for p in evals]
    ev_runs = [f" {' '.join(t)} " for t in ev_tokens]
    by_len: dict[int, list[list[str]]] = {}
    for t in ev_tokens:
        if len(set(NAME_OR_NUMBER.findall(" ".join(t)))) >= 3:
            by_len.setdefault(len(t), []).append(t)
    out = set()
    for i, p in enumerate(pool):
        s = shingles(shape.content(p))
        shared: dict[int, int] = {}
        for g in s:
            for j in by_gram.get(g, ()):
                shared[j] = shared.get(j, 0) + 1
        u = TOKEN.findall(shape.content(p).lower())
        run = f" {' '.join(u)} "
        # (templated shapes share most characters by construction: there only the token kinds decide)
        if (not shape.types and any(c / (len(s) + len(ev[j]) - c) >= 0.5 for j, c in shared.items())
                or any(len(t) >= 3 and len(u) <= 2 * len(t) and r in run for t, r in zip(ev_tokens, ev_runs,
                                                                                          strict=True))
                or any(one_token_apart(u, t, shape.name != "arith") for t in by_len.get(len(u), ()))):
            out.add(i)
    return out


def one_token_apart(u: list[str], t: list[str], numbers: bool) -> bool:
    """``u`` is ``t`` with one name (or number) changed wherever it is, and nothing else."""
    changed = {(a, b) for a, b in zip(t, u, strict=True) if a != b}
    if len(changed) != 1:
        return False
    (a, b), = changed
    kind = r"[^\W\d]\w*|\d+" if numbers else r"[^\W\d]\w*"
    return bool(re.fullmatch(kind, a) and re.fullmatch(kind, b)) and b not in t


def plant(shape: Shape, rng: random.Random) -> tuple[dict[str, list[Parts]], list[Parts], list[str | None]]:
    """(evaluation rows by split, training rows, the leak kind of each training row or None)."""
    val, test, pool = shape.rows[:EVAL], shape.rows[EVAL : 2 * EVAL], shape.rows[2 * EVAL :]
    natural = natural_overlaps(shape, pool, val + test)
    clean = [p for i, p in enumerate(pool) if i not in natural]
    near = near_same_type(shape, clean, val + test)
    kinds: dict[str, Callable[[Parts, random.Random], Parts | None]] = {
        "exact": lambda p, r: list(p), "case+space": case_space, "re-instructed": shape.reword,
        "embedded": shape.embed, "one token changed": shape.change}
    train = [(p, "near" if i in near else None) for i, p in enumerate(clean)]
    train += [(p, "natural") for i, p in enumerate(pool) if i in natural]
    for kind, leak in kinds.items():
        for rows in (val, test):  # half from each split, from rows the kind applies to
            planted = 0
            for p in rng.sample(rows, len(rows)):
                if planted < PER_KIND // 2 and (m := leak(p, rng)) is not None:
                    train.append((m, kind))
                    planted += 1
    rng.shuffle(train)
    return {"validation": val, "test": test}, [p for p, _ in train], [k for _, k in train]


def near_same_type(shape: Shape, rows: list[Parts], evals: list[Parts]) -> set[int]:
    """The rows with an evaluation input of their own type (template; one type for the stdlib shapes)
    close by: at most two tokens changed, and at most a quarter of the row's (counted as half the
    difference of their bags of tokens: a token put in or left out counts half). A rule may take
    these for copies without removing rows that are plainly not."""
    def bag(p: Parts) -> Counter:
        return Counter(TOKEN.findall(shape.content(p).lower()))

    by_type: dict[str, list[Counter]] = {}
    for p in evals:
        by_type.setdefault(shape.types.get(p[-1], ""), []).append(bag(p))
    out = set()
    for i, p in enumerate(rows):
        b = bag(p)
        most = 2 * min(2, b.total() // 4)  # the bags' difference of two tokens changed
        for e in by_type.get(shape.types.get(p[-1], ""), ()):
            if abs(e.total() - b.total()) <= most and ((b - e) + (e - b)).total() <= most:
                out.add(i)
                break
    return out


# --- rules ----------------------------------------------------------------------------------------------

def current_rule(settings: Decontaminate) -> Callable[[Shape, dict, list[Parts]], list[str | None]]:
    def run(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts]) -> list[str | None]:
        index = ContaminationIndex(evals, settings)
        return [None if h is None else h[1] for h in index.hits_batch(train)]

    return run


def before_rule(ngram: int = 8, near: float = 0.8) -> Callable[[Shape, dict, list[Parts]], list[str | None]]:
    """The rule of commit 8464ad6 (rendered prompts, datasketch MinHash), loaded from git."""
    source = subprocess.run(["git", "show", "8464ad6:src/recipetune/data/text.py"], capture_output=True,
                            text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp()) / "text_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("text_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts]) -> list[str | None]:
        index = module.ContaminationIndex(ngram, near, 64)
        for split, rows in evals.items():
            index.add(split, [shape.render(p) for p in rows])
        return ["overlap" if index.hits(shape.render(p)) is not None else None for p in train]

    return run


def measure(rule, shapes: list[str], seed: int, explain: int = 0) -> list[dict]:
    out = []
    for name in shapes:
        rng = random.Random(seed)
        shape = SHAPES[name](rng)
        evals, train, kinds = plant(shape, rng)
        t0 = time.perf_counter()
        removed = rule(shape, evals, train)
        seconds = time.perf_counter() - t0
        pairs = list(zip(removed, kinds, strict=True))
        row = {"shape": name, "what": shape.what, "natural": kinds.count("natural"), "seconds": seconds,
               "natural_removed": sum(r is not None for r, k in pairs if k == "natural"),
               "clean": sum(k in (None, "near") for k in kinds),
               "false": sum(r is not None for r, k in pairs if k in (None, "near")),
               "far": kinds.count(None), "rows": len(train), "renamed": removed.count("renamed copy"),
               "false_far": sum(r is not None for r, k in pairs if k is None),
               "removed": sum(r is not None for r in removed), "true": true_copies(shape, evals, train, kinds)}
        for kind in KINDS:
            planted = [r is not None for r, k in pairs if k == kind]
            row[kind] = (sum(planted), len(planted))
        apart, alike = told_apart(shape, evals, train, kinds)
        row["told apart"] = (sum(r is not None for (r, _), a in zip(pairs, apart, strict=True) if a), sum(apart))
        row["alike"] = (sum(r is not None for (r, _), a in zip(pairs, alike, strict=True) if a), sum(alike))
        if explain:
            explained(shape, evals, train, removed, kinds, explain)
        out.append(row)
    return out


def true_copies(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts], kinds: list[str | None]) -> int:
    """The planted leaks plus the natural pool rows that are an evaluation input exactly (its tokens)."""
    def key(p: Parts) -> tuple[str, ...]:
        return tuple(TOKEN.findall(shape.content(p).lower()))

    inputs = {key(p) for rows in evals.values() for p in rows}
    return sum(k in KINDS or (k == "natural" and key(p) in inputs) for p, k in zip(train, kinds, strict=True))


def told_apart(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts], kinds: list[str | None]
               ) -> tuple[list[bool], list[bool]]:
    """Which rows are one-token copies that can be told from the task's legitimate rows: no other
    evaluation input and no pool row (clean or natural) fills the copy's frame (its evaluation input
    with the changed places open). Where one does, any rule that removes the copy removes a row that
    is no copy too (`def _(self, other):`, `class _(unittest.TestCase):`): decided here apart from the
    rule, from the rows themselves. Second, which legitimate rows (clean or natural, no evaluation
    input exactly) have that form too: an evaluation input with one token changed, whose frame no
    other row and no other input fills (`self.cmp = lzma.LZMADecompressor()` beside the input
    `self.cmp = lzma.LZMACompressor()`). A rule sees such a row as a told-apart copy in all but the
    changed token itself; what it removes of them is what finding those copies costs."""
    def key(p: Parts) -> tuple[str, ...]:
        return tuple(TOKEN.findall(shape.content(p).lower()))

    inputs = [key(p) for rows in evals.values() for p in rows]
    by_input_length: dict[int, list[tuple[str, ...]]] = {}
    for e in inputs:
        by_input_length.setdefault(len(e), []).append(e)
    others = [key(p) for p, k in zip(train, kinds, strict=True) if k not in KINDS] + inputs
    by_length: dict[int, list[tuple[str, ...]]] = {}
    for t in others:
        by_length.setdefault(len(t), []).append(t)

    def unique_frame(u: tuple[str, ...], itself: int) -> bool:
        """``u`` is an input with one token changed (every place it is at) and nothing else fills that
        frame (``itself``: how often ``u`` is among ``others``)."""
        source = next((e for e in by_input_length.get(len(u), ())
                       if len({(a, b) for a, b in zip(e, u, strict=True) if a != b}) == 1), None)
        if source is None:
            return False
        shut = [i for i, (a, b) in enumerate(zip(source, u, strict=True)) if a == b]
        return sum(t != source and all(t[i] == source[i] for i in shut) for t in by_length[len(u)]) == itself

    inputs_exactly = set(inputs)
    copies, alike = [], []
    for p, k in zip(train, kinds, strict=True):
        u = key(p)
        copies.append(k == "one token changed" and unique_frame(u, 0))
        alike.append(k not in KINDS and u not in inputs_exactly and unique_frame(u, 1))
    return copies, alike


def explained(shape: Shape, evals: dict, train: list[Parts], removed: list, kinds: list, n: int) -> None:
    """What removed the clean rows and the natural overlaps (and which planted rows were missed), with a
    few examples and the evaluation content each contains, if any (found here by brute force: the index never says)."""
    contents = [shape.content(p) for rows in evals.values() for p in rows]

    toks = [TOKEN.findall(c.lower()) for c in contents]

    def inside(p: Parts) -> str:
        """The longest evaluation content that is a run of this row's tokens, or one token off one."""
        u = TOKEN.findall(shape.content(p).lower())
        runs = [(sum(a != b for a, b in zip(ct, u[k:], strict=False)), -len(ct), c)
                for c, ct in zip(contents, toks, strict=True) if len(ct) >= 3 or len(ct) == len(u)
                for k in range(len(u) - len(ct) + 1)]
        best = min((r for r in runs if r[0] <= 1), default=None)
        return "" if best is None else f"  ({'holds' if best[0] == 0 else 'one token off'} {best[2]!r})"

    false = [(r, p) for r, k, p in zip(removed, kinds, train, strict=True) if k in (None, "near") and r is not None]
    print(f"\n{shape.name}: {len(false)} clean rows removed, by reason: "
          f"{dict(Counter(r for r, _ in false).most_common())}")
    for r, p in false[:n]:
        print(f"  {r}: {shape.content(p)[:100]!r}{inside(p)}")
    natural = [(r, p) for r, k, p in zip(removed, kinds, train, strict=True) if k == "natural" and r is not None]
    print(f"{shape.name}: {len(natural)} natural overlaps removed, by reason: "
          f"{dict(Counter(r for r, _ in natural).most_common())}")
    for r, p in natural[:n]:
        print(f"  {r}: {shape.content(p)[:100]!r}{inside(p)}")
    missed = [(k, p) for r, k, p in zip(removed, kinds, train, strict=True) if k in KINDS and r is None]
    print(f"{shape.name}: {len(missed)} planted rows missed, by kind: {dict(Counter(k for k, _ in missed))}")
    for k, p in missed[:n]:
        print(f"  {k}: {shape.content(p)[:100]!r}")


def table(rows: list[dict]) -> str:
    """One line per shape and a total over them: recall per kind, clean rows removed (and those with
    no evaluation input of their own type close by), precision, natural overlaps, time."""
    kinds = KINDS
    lines = ["| shape | " + " | ".join(f"recall: {k}" for k in kinds) + " | of them told apart from legitimate rows "
             "| legitimate rows alike removed | recall, all | clean rows removed "
             "| of them with no same-type input near | precision | natural overlaps removed "
             "| removed as renamed copies | rows removed / true copies | seconds (per 10k rows) |",
             "|---|" + "---|" * (len(kinds) + 10)]
    total = {k: (sum(r[k][0] for r in rows), sum(r[k][1] for r in rows)) for k in (*kinds, "told apart", "alike")}
    total |= {k: sum(r[k] for r in rows) for k in ("false", "clean", "far", "false_far", "natural_removed",
                                                    "natural", "seconds", "rows", "renamed", "removed", "true")}
    for r in [*rows, {"shape": "**all**", **total}] if len(rows) > 1 else rows:
        got = sum(r[k][0] for k in kinds)
        planted = sum(r[k][1] for k in kinds)
        cells = [f"{r[k][0]}/{r[k][1]} ({r[k][0] / r[k][1]:.0%})" if r[k][1] else "n/a" for k in kinds]
        precision = got / (got + r["false"]) if got + r["false"] else 1.0
        for found, of in (r["told apart"], r["alike"]):
            cells.append(f"{found}/{of} ({found / of:.0%})" if of else "n/a")
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + f" | {got / planted:.1%} | {r['false']}/{r['clean']} "
                     f"({r['false'] / max(1, r['clean']):.2%}) | {r['false_far']}/{r['far']} "
                     f"({r['false_far'] / max(1, r['far']):.2%}) "
                     f"| {precision:.1%} | {r['natural_removed']}/{r['natural']} | {r['renamed']} "
                     f"| {r['removed']}/{r['true']} ({r['removed'] / max(1, r['true']):.2f}x) "
                     f"| {r['seconds']:.1f} ({r['seconds'] / r['rows'] * 1e4:.1f}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="decontaminate settings, e.g. ngram=13")
    parser.add_argument("--before", action="store_true", help="also measure the rule of commit 8464ad6")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="print what removed the clean rows and which leaks were missed (N examples each)")
    args = parser.parse_args()
    settings = Decontaminate(op="decontaminate", **dict(kv.split("=", 1) for kv in args.set))
    shapes = [s.strip() for s in args.shapes.split(",")]
    text = [f"`python benchmarks/decontamination.py {' '.join(sys.argv[1:])}`", "",
            f"Settings: {settings.model_dump(exclude={'op'})}; seed {args.seed}; {EVAL} validation + {EVAL} test "
            f"rows, {PER_KIND} leaks of each kind (half from each split).", "",
            table(measure(current_rule(settings), shapes, args.seed, args.explain))]
    if args.before:
        text += ["", "The rule of commit 8464ad6 (rendered prompt, 8-gram, datasketch MinHash 0.8):", "",
                 table(measure(before_rule(), shapes, args.seed))]
    print("\n".join(text))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
