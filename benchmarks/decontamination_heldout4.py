"""Held-out task shapes for the decontamination benchmark (issue 50, fourth batch).

Four shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` and the ten of ``benchmarks/decontamination_heldout.py``,
``_heldout2.py`` and ``_heldout3.py`` (the first three batches). They were written by an engineer who
did not change the rule and never read it, and were never run against it: only their generators and
the planting were checked (row counts, types, samples of each leak kind next to their evaluation
input). Registered as held out in ``decontamination_unseen.py`` and measured once, with issue 50's
fourth-round rule final (docs/benchmarks.md):

    python benchmarks/decontamination_unseen.py --shapes "with statement,for-loop header,trivia question,config line"

- ``with statement`` (natural data, a task with many near-identical legitimate rows): one ``with
  ...:`` header line of the standard library's sources (tests included), as written (``with
  open(path, 'rb') as f:``), on one line, no comment, at most 100 characters; 2,440 unique rows from
  a run of consecutive files (the stdlib holds about 4,000; its tests' ``with
  self.assertRaises(TypeError):`` and kin differ in one name), shuffled; the question in the
  template, one type;
- ``for-loop header`` (natural data): one ``for ... in ...:`` header line of the stdlib's sources
  (tests included), as ``with statement`` (about 6,000 in the stdlib: ``for i in range(n):``);
  ``decorator line``, the other candidate, has about 1,400 unique ones: too few for 2,440 rows;
- ``trivia question`` (synthetic natural language, 13-17 tokens): one question of 6 templates (its
  type: a city's population, a novel's author, a prize's year, a distance, a painting, an orchestra)
  whose 3-5 values are cities, names, years, title words, prizes and instruments (with fewer, most
  pool rows would be one value from an evaluation input: natural overlaps); one field, no instruction;
- ``config line`` (synthetic): a fixed instruction and one configuration line or short block of 6
  templates (its type: a YAML scalar, an INI section, a YAML block, an environment variable, an
  nginx upstream, an INI line with a comment; 3-20 tokens) whose keys are fixed or drawn from key
  lists and whose values are numbers, ports, hosts, paths, names and dates.

How each leak kind is made (besides ``exact`` and ``case+space``, as in ``decontamination.py``):

- ``re-instructed``: the natural shapes and trivia have no instruction in the input: a few words put
  before it (``Q: ``, ``Quiz question: ``); config lines: the instruction reworded;
- ``embedded``: a natural line among its neighbouring lines of its file (up to as many tokens again;
  a line of fewer than 3 tokens is not embedded); a question inside a short paragraph of other
  questions and quiz-master prose; a config line among other lines of a config file;
- ``one token changed``: natural lines: one name or number respelled, or one word of a string literal
  replaced by another word of these lines' strings, wherever it is, where the line has two or more
  such tokens (a name or number: every occurrence of it, ``[-1, 0, 1]`` to ``[-5, 0, 5]``). Never a
  Python keyword (``with``, ``as``, ``for``, ``in``, ``not``, ``None``), nor ``self``/``cls``, nor a
  builtin (``open``, ``range``, ``TypeError``), nor a keyword argument's name (``encoding=``): a copy
  edited by hand renames a local, an attribute or a helper, or changes a literal; one that respells
  ``range`` or ``encoding=`` no longer runs. So ``with self.assertRaises(TypeError):`` (one such
  token) plants none: the kind applies to 84% of the with statements' evaluation rows, 92% of the
  for-loop headers'. Synthetic rows: one value drawn again as the generator draws it (a city, a
  year, a port, ``db3`` to ``db7``), never a key or section name (``timeout``, ``[cache]``,
  ``max_orders``), where the row has two or more values (``timeout: 30`` plants none: 84% of the
  config lines apply, all questions); each one checked to differ from its source in one token.

Each has ``2 * EVAL + POOL`` unique rows but the two natural ones (2,440, as ``signature``), and plants
the five leak kinds, 40 each, half from each split (seeds 0-2: all 40 of each kind on all four). Natural
overlaps at seed 0 (pool rows kept apart, as ``decontamination.py`` decides them): with statement
1,021 of 2,040 (its tests' ``with self.assertRaises(...)`` lines share most 5-grams: as class header's
1,037), for-loop header 443, trivia question 32 of 3,000, config line 23.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import functools
import io
import random
import re
import string
import tokenize
from collections.abc import Callable

import decontamination as bench
from decontamination import CITIES, FIRST, ITEMS, LAST, NOUNS, TOKEN, Parts, Shape, _typed, instructed
from decontamination_heldout import MONTHS, _around, lines_around, stdlib_modules
from decontamination_heldout2 import NATURAL_ROWS, Context, _neighbours, _run
from decontamination_heldout3 import LONGEST, _one_token_changed, _string_words

N = 2 * bench.EVAL + bench.POOL
Values = dict[str, str | int]


# --- the stdlib's with and for headers, with their neighbouring lines ----------------------------------

def _has_comment(line: str) -> bool:
    try:
        return any(t.type == tokenize.COMMENT for t in tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError):  # (not met: a one-line header tokenizes alone)
        return True


@functools.cache
def stdlib_headers() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``with`` headers, ``for`` headers) of the standard library's sources (tests included): each
    unique one written on one line of at most ``LONGEST`` characters, its body on later lines, with
    its neighbouring lines where it first occurs, in file order."""
    withs: dict[str, Context] = {}
    fors: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.With):
                parts: list[ast.AST] = [i.optional_vars or i.context_expr for i in node.items]
                found.append((withs, "with ", node, parts))
            elif isinstance(node, ast.For):
                found.append((fors, "for ", node, [node.target, node.iter]))
        for out, word, node, parts in sorted(found, key=lambda x: x[2].lineno):
            line = lines[node.lineno - 1].strip()
            one_line = all(p.end_lineno == node.lineno for p in parts) and node.body[0].lineno > node.lineno
            if (one_line and line.startswith(word) and line.endswith(":") and len(line) <= LONGEST
                    and line not in out and not _has_comment(line)):
                out[line] = lines_around(lines, node.lineno, node.lineno)
    return withs, fors


KEEP = frozenset({"self", "cls", *dir(builtins)})  # Python keywords are never changed either


def _natural(name: str, word: str, context: dict[str, Context], question: str, lead: list[str],
             rng: random.Random, what: str | None = None) -> Shape:
    """A stdlib line, a run of ``NATURAL_ROWS`` of them, the question in the template (``what``: the shape's
    description, a header's by default)."""
    rows = _run(context, rng)
    vocabulary = _string_words(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, number or string word, wherever it is
        keywords = frozenset(re.findall(r"[(,]\s*(\w+)=(?!=)", p[0]))  # `encoding=`: a callee's, as a builtin
        changed = _one_token_changed(KEEP | keywords, vocabulary, p[0], r)
        return [changed] if changed else None

    what = what or (f"a stdlib one-line `{word} ...:` header, {NATURAL_ROWS} unique rows from a run of stdlib "
                     "files (tests included: many one name apart); the question in the template")
    return Shape(name, what, rows, lambda p: f"{question}\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


def with_statements(rng: random.Random) -> Shape:
    return _natural("with statement", "with", stdlib_headers()[0], "Which context managers does this line enter?",
                    ["Line: ", "Here is the with statement: ", "Q: ", "In the function we find "], rng)


def for_loops(rng: random.Random) -> Shape:
    return _natural("for-loop header", "for", stdlib_headers()[1], "What does this loop iterate over?",
                    ["Loop: ", "Here is the header: ", "Q: ", "From the function body: "], rng)


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


# --- trivia question (synthetic natural language) ----------------------------------------------------

TRIVIA_TEMPLATES = (  # three values and more each: two random questions are rarely one value apart
    "What was the population of {City} when {First} {Last} was its mayor in {year}?",
    "Who wrote The {Adj} {Noun}, the {year} novel set in {City}?",
    "In which year did {First} {Last} of {City} win the {Prize} Prize?",
    "How many kilometres did {First} {Last} travel by {mode} from {City} to {City2}?",
    "Which museum in {City} bought the Still Life with {Item} that {First} {Last} painted in {year}?",
    "Which {instrument} player led the {City} orchestra under {First} {Last} in {year}?",
)
ADJECTIVES = ("Silent", "Golden", "Broken", "Last", "Hidden", "Northern", "Crimson", "Quiet", "Winter", "Distant",
              "Burning", "Forgotten", "Little", "Second", "Glass", "Hollow", "Bitter", "Restless", "Painted", "Iron")
TITLE_NOUNS = ("Harbour", "Garden", "Letter", "River", "Mirror", "Lantern", "Orchard", "Bridge", "Shore", "Tower",
               "Island", "Season", "Voyage", "Kingdom", "Widow", "Station", "Archive", "Meadow", "Road", "Summer")
PRIZES = ("Nobel", "Pulitzer", "Booker", "Turing", "Abel", "Pritzker", "Goncourt", "Wolf")
MODES = ("train", "road", "ferry", "bicycle", "bus", "air")
INSTRUMENTS = ("violin", "cello", "oboe", "flute", "horn", "trumpet", "clarinet", "viola", "harp", "bassoon")
TRIVIA_LEAD = ["Quiz question: ", "Here is one for the pub quiz. ", "Round three, question five: ",
               "Can you answer this? "]
TRIVIA_PROSE = ("Welcome back to the quiz.", "The next round is about history and the arts.",
                "Take your time, there is no penalty for guessing.", "Write your answers on the sheet.",
                "Last week's winners were the team by the window.", "Points are doubled in this round.")


def _trivia_values(rng: random.Random) -> Values:
    city, city2 = rng.sample(CITIES, 2)
    return dict(City=city.title(), City2=city2.title(), year=rng.randint(1850, 2020), Adj=rng.choice(ADJECTIVES),
                Noun=rng.choice(TITLE_NOUNS), First=rng.choice(FIRST).title(), Last=rng.choice(LAST).title(),
                Prize=rng.choice(PRIZES), mode=rng.choice(MODES), Item=rng.choice(ITEMS).title(),
                instrument=rng.choice(INSTRUMENTS))


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


def _trivia(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("trivia", TRIVIA_TEMPLATES, _trivia_values, rng)


def trivia_questions(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("trivia", TRIVIA_TEMPLATES, _trivia_values, rng)

    def embed(p: Parts, r: random.Random) -> Parts:  # inside a paragraph of other questions and prose
        other = [_trivia(r)[1] if r.random() < 0.5 else r.choice(TRIVIA_PROSE) for _ in range(4)]
        return [_around(p[0], " ".join(other[:2]), " ".join(other[2:]), r)]

    return Shape("trivia question", "one field, a trivia question of 13-17 tokens (6 templates: cities, names, years, "
                 "titles, prizes, instruments as values), no instruction", rows[:N],
                 lambda p: f"Question: {p[0]}\nAnswer: ", change, lambda p, r: [r.choice(TRIVIA_LEAD) + p[0]], embed,
                 lambda p: p[0], types)


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


SHAPES_4 = {"with statement": with_statements, "for-loop header": for_loops, "trivia question": trivia_questions,
            "config line": config_lines}
