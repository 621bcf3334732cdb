"""Held-out task shapes for the decontamination benchmark (issue 50, part 2, third round, second batch).

Three shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` (which registers these three as held out) and the four of
``benchmarks/decontamination_heldout.py`` (the first batch, measured and studied since). They were
written in issue 50's third round, while the rule was being changed again, by an engineer who did
not change the rule, and were never run against the rule until it was final: only their generators
and the planting were checked (row counts, types, samples of each leak kind). Once the rule is final:

    python benchmarks/decontamination_unseen.py --shapes "class header,raise statement,html element"

- ``class header`` (natural data, a task with many near-identical legitimate rows): one class
  statement of the standard library's sources (tests included), ``class {name}({bases and
  keywords}):`` as ``ast`` unparses it (``class Foo:`` without them), at most 120 characters; 2,440
  unique rows from a run of consecutive files (the stdlib holds about 9,400; its tests' classes differ
  in one name: ``class Test_StreamWriter(unittest.TestCase):``), shuffled; the question in the template,
  one type. One token changed: one name (the class's, or one of a base's dotted components) respelled
  wherever it is (never ``class``, ``metaclass``, a keyword argument's name or a Python keyword),
  where the header has two or more names; embedded: the header among its neighbouring lines of its
  file (the lines above it, its docstring or first body lines);
- ``raise statement`` (natural data): one ``raise`` statement of the stdlib's sources (tests
  included) written on one line, as written (``raise ValueError("invalid mode: %r" % mode)``), at most
  120 characters, a bare ``raise`` left out; 2,440 unique rows from a run of consecutive files (the
  stdlib holds about 2,700), shuffled; the question in the template, one type. One token changed: one
  name or number respelled, or one word of the message replaced by another word of the stdlib's
  messages, wherever it is (never ``raise``, ``from`` or another Python keyword, a string's prefix or
  a format's letter), where the line has two or more such tokens; embedded: among its neighbouring lines;
- ``html element`` (synthetic): a fixed question and one HTML element of 6 templates (its type:
  a link, an image, an input, a table cell, an option, a badge) whose values are names, numbers,
  cities, columns, colours and dates; one token changed: a value (a name or a number), never a tag,
  attribute or template word; embedded: among sibling elements of a page.

Each has ``2 * EVAL + POOL`` unique rows but the two natural ones (2,440, as ``signature``), and plants
the five leak kinds of ``benchmarks/decontamination.py``.
"""

from __future__ import annotations

import ast
import functools
import io
import keyword
import random
import re
import string
import tokenize
from collections.abc import Callable

import decontamination as bench
from decontamination import CITIES, COLUMNS, DAYS, FIRST, ITEMS, LAST, NOUNS, Parts, Shape, _typed, instructed, ntokens
from decontamination_heldout import MONTHS, _around, _fixed, lines_around, stdlib_modules

N = 2 * bench.EVAL + bench.POOL
NATURAL_ROWS = 2440  # the task size, as the signature shape


# --- the stdlib's statements, with their neighbouring lines -------------------------------------------

Context = tuple[str, str]  # up to 4 non-blank lines of its file before it, and after it


@functools.cache
def stdlib_statements() -> tuple[dict[str, Context], dict[str, Context]]:
    """(class headers, one-line raise statements) of the standard library's sources (tests included),
    each unique one of at most 120 characters with its neighbouring lines where it first occurs, in
    file order."""
    classes: dict[str, Context] = {}
    raises: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                args = ", ".join([*map(ast.unparse, node.bases), *map(ast.unparse, node.keywords)])
                found.append((classes, f"class {node.name}({args}):" if args else f"class {node.name}:",
                              node.lineno, max(node.lineno, node.body[0].lineno - 1)))
            elif isinstance(node, ast.Raise) and node.exc is not None and node.lineno == node.end_lineno:
                line = lines[node.lineno - 1].encode()  # the offsets count UTF-8 bytes
                found.append((raises, line[node.col_offset : node.end_col_offset].decode(), node.lineno,
                              node.lineno))
        for out, statement, first, last in sorted(found, key=lambda x: x[2]):
            if len(statement) <= 120 and statement not in out:
                out[statement] = lines_around(lines, first, last)
    return classes, raises


def _run(found: dict[str, Context], rng: random.Random) -> list[Parts]:
    """``NATURAL_ROWS`` consecutive statements (a run of files: their tests' classes and checks alike),
    shuffled."""
    keys = list(found)
    start = rng.randrange(len(keys) - NATURAL_ROWS)
    rows = [[x] for x in keys[start : start + NATURAL_ROWS]]
    rng.shuffle(rows)
    return rows


def _respelled(old: str, text: str, rng: random.Random) -> str:
    """Another name of ``old``'s length: each letter another of its case, digits and underscores kept;
    never a keyword or a word of ``text`` (``old`` holds a letter)."""
    while True:
        new = "".join(rng.choice(string.ascii_uppercase if c.isupper() else string.ascii_lowercase)
                      if c.isalpha() else c for c in old)
        if new != old and not keyword.iskeyword(new) and not re.search(rf"\b{re.escape(new)}\b", text):
            return new


def _neighbours(context: dict[str, Context]) -> Callable[[Parts, random.Random], Parts | None]:
    """The embedded kind of a natural shape: the statement among its neighbouring lines of its file."""
    def embed(p: Parts, r: random.Random) -> Parts | None:
        if ntokens(p[0]) < 3 or not any(context[p[0]]):
            return None
        return [_around(p[0], *context[p[0]], r, "\n")]
    return embed


# --- class header (natural data, many near-identical legitimate rows) -------------------------------

CLASS_WORDS = frozenset({"class", "metaclass"})


def class_headers(rng: random.Random) -> Shape:
    context = stdlib_statements()[0]
    rows = _run(context, rng)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, wherever it is
        names = sorted(set(re.findall(r"\b[A-Za-z_]\w*\b(?!\s*=[^=])", p[0])) - CLASS_WORDS
                       - {w for w in re.findall(r"\w+", p[0]) if keyword.iskeyword(w)})
        names = [x for x in names if any(c.isalpha() for c in x)]
        if len(names) < 2:  # `class Foo:` -> `class Xyz:`: another class, not a copy
            return None
        old = r.choice(names)
        return [re.sub(rf"\b{re.escape(old)}\b(?!\s*=[^=])", _respelled(old, p[0], r), p[0])]

    lead = ["Header: ", "Look at this class: ", "Q: ", "In the module we find "]
    return Shape("class header", f"a stdlib class statement `class Name(bases):`, {NATURAL_ROWS} unique rows from "
                 "a run of stdlib files (tests included: many differ in one name); the question in the template",
                 rows, lambda p: f"Which classes does this class inherit from?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


# --- raise statement (natural data) -----------------------------------------------------------------

MESSAGE_WORD = re.compile(r"(?<![%!\\])\b[A-Za-z]\w+\b")  # not a format's letter (%r, !r) nor an escape (\n)
STRING_PREFIXES = frozenset({"r", "u", "f", "b", "br", "rb", "fr", "rf"})
STRING_TOKENS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # f-strings' text, 3.12+


def _raise_tokens(line: str) -> tuple[set[str], set[str], set[str]]:
    """(names, numbers, words of its strings) of a raise statement, keywords left out."""
    names, numbers, words = set(), set(), set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                names.add(tok.string)
            elif tok.type == tokenize.NUMBER and tok.string.isdigit():
                numbers.add(tok.string)
            elif tok.type in STRING_TOKENS:
                body = tok.string.lstrip("rRbBuUfF") if tok.type == tokenize.STRING else tok.string
                if tok.type == tokenize.STRING and "f" in tok.string[: len(tok.string) - len(body)].lower():
                    for field in re.findall(r"\{([^{}]*)\}", body):  # an f-string's fields: code, not message
                        code = re.split(r"![rsa]|:(?!=)", field)[0]  # its conversion and format left out
                        names |= {w for w in re.findall(r"[A-Za-z_]\w*", code) if not keyword.iskeyword(w)}
                    body = re.sub(r"\{[^{}]*\}", " ", body)
                words |= {w for w in MESSAGE_WORD.findall(body) if not keyword.iskeyword(w)}
                numbers |= set(re.findall(r"(?<![%\\])\b\d+\b", body))
    except (tokenize.TokenError, SyntaxError):
        pass
    names = {x for x in names if any(c.isalpha() for c in x)}  # `_` is not a name to respell
    return names, numbers, words - names


@functools.cache
def message_words() -> tuple[str, ...]:
    """The words of the stdlib's raise messages: what a message word is changed to."""
    return tuple(sorted({w for line in stdlib_statements()[1] for w in _raise_tokens(line)[2]
                         if w.isalpha() and w.islower() and len(w) >= 3}))


def raise_statements(rng: random.Random) -> Shape:
    context = stdlib_statements()[1]
    rows = _run(context, rng)
    vocabulary = message_words()

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, number or message word, wherever it is
        line = p[0]
        names, numbers, words = _raise_tokens(line)
        found = sorted(names | numbers | words)
        if len(found) < 2:  # `raise StopIteration` -> `raise Xyz`: another line, not a copy
            return None
        old = r.choice(found)
        if old in numbers:
            new = old
            while new == old or re.search(rf"\b{new}\b", line):
                new = str(r.randint(10 ** (len(old) - 1) if len(old) > 1 else 0, 10 ** len(old) - 1))
        elif old in names:
            new = _respelled(old, line, r)
        else:
            new = next(w for w in r.sample(vocabulary, len(vocabulary))
                       if w != old.lower() and not re.search(rf"\b{w}\b", line, re.IGNORECASE))
            new = new.upper() if old.isupper() and len(old) > 1 else new.title() if old[0].isupper() else new
        prefix = "(?![\"'])" if old.lower() in STRING_PREFIXES else ""  # never f"..."'s f
        changed = re.sub(rf"(?<![%!\\\w]){re.escape(old)}\b{prefix}", new, line)
        return [changed] if changed != line else None

    lead = ["Line: ", "Here is the statement: ", "Q: ", "From the function body: "]
    return Shape("raise statement", f"a stdlib one-line raise statement, {NATURAL_ROWS} unique rows from a run of "
                 "stdlib files (tests included); the question in the template", rows,
                 lambda p: f"Which exception does this line raise?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


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
