"""Held-out task shapes for the decontamination benchmark (issue 50, part 2, third round, third batch).

Three shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` (which registers these three as held out) and the seven of
``benchmarks/decontamination_heldout.py`` and ``benchmarks/decontamination_heldout2.py`` (the first
two batches, measured since). They were written in issue 50's third round, while the rule was being
changed again, by an engineer who did not change the rule, and were never run against the rule until
it was final: only their generators and the planting were checked (row counts, types, samples of
each leak kind). Once the rule is final:

    python benchmarks/decontamination_unseen.py --shapes "assert call,keyword call,email header"

- ``assert call`` (natural data, a task with many near-identical legitimate rows): one
  ``self.assert...(...)`` call statement of the standard library's sources (its tests, nearly all)
  written on one line, as written (``self.assertEqual(len(result), 3)``), at most 100 characters;
  2,440 unique rows from a run of consecutive files (the stdlib holds about 46,500; its tests check
  the same things with one name or number apart), shuffled; the question in the template, one type.
  One token changed: one name or number respelled, or one word of a string literal replaced by
  another word of these lines' strings, wherever it is (never ``self``, the ``assert...`` method's
  name or a Python keyword), where the line has two or more such tokens; embedded: among its
  neighbouring lines;
- ``keyword call`` (natural data): one call of the stdlib's sources (tests included) with at least one
  keyword argument, written on one line, as written (``subprocess.run(cmd, check=True, text=True)``),
  the outermost such call of its statement, at most 100 characters, ``self.assert...`` calls left
  out; 2,440 unique rows from a run of consecutive files (the stdlib holds about 11,400), shuffled;
  the question in the template, one type. One token changed: one name (a keyword argument's name
  included) or number respelled, or one word of a string literal replaced, wherever it is (never a
  Python keyword, ``True``, ``False`` or ``None``), where the call has two or more such tokens;
  embedded: among the neighbouring lines of its statement;
- ``email header`` (synthetic): a fixed instruction and one header line of an e-mail of 5 templates
  (its type: From, Date, Subject, Message-ID, To) whose values are names, numbers, dates, cities,
  nouns and hosts; one token changed: one value of the line drawn again as the generator draws it (a
  name, a number, a weekday, a month, the id's hex digits: ``17:58:00`` becomes ``17:21:00``), never a
  header's name, a template word (``Re``, ``report``, ``mail``) or a host (two tokens and more);
  embedded: among the other header lines of one message.

Each has ``2 * EVAL + POOL`` unique rows but the two natural ones (2,440, as ``signature``), and plants
the five leak kinds of ``benchmarks/decontamination.py``.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import re

import decontamination as bench
from decontamination import CITIES, FIRST, LAST, NOUNS, Parts, Shape, _typed, instructed
from decontamination_heldout import _around, lines_around, stdlib_modules
from decontamination_heldout2 import NATURAL_ROWS, Context, _neighbours, _raise_tokens, _respelled, _run

N = 2 * bench.EVAL + bench.POOL
LONGEST = 100  # characters of a natural row


# --- the stdlib's calls, with their neighbouring lines ------------------------------------------------

def _is_assert(node: ast.Call) -> bool:
    f = node.func
    return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self"
            and f.attr.startswith("assert"))


def _keyword_calls(node: ast.AST, out: list[ast.Call]) -> None:
    """The outermost calls under ``node`` that pass a keyword argument (``f(x, k=1)``; ``**kw`` is not
    one): a call inside one of them is part of its row, not a row of its own."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Call) and any(k.arg for k in child.keywords) and not _is_assert(child):
            out.append(child)
        else:
            _keyword_calls(child, out)


@functools.cache
def stdlib_calls() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``self.assert...`` call statements, calls with a keyword argument) of the standard library's
    sources (tests included), each unique one written on one line of at most ``LONGEST`` characters
    with its neighbouring lines where it first occurs, in file order."""
    asserts: dict[str, Context] = {}
    calls: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found: list[tuple[dict[str, Context], ast.Call]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and _is_assert(node.value):
                found.append((asserts, node.value))
        keyword_calls: list[ast.Call] = []
        _keyword_calls(tree, keyword_calls)
        found += [(calls, c) for c in keyword_calls]
        for out, node in sorted(found, key=lambda x: (x[1].lineno, x[1].col_offset)):
            if node.lineno != node.end_lineno:
                continue
            line = lines[node.lineno - 1].encode()  # the offsets count UTF-8 bytes
            call = line[node.col_offset : node.end_col_offset].decode()
            if len(call) <= LONGEST and call not in out:
                out[call] = lines_around(lines, node.lineno, node.lineno)
    return asserts, calls


def _string_words(found: dict[str, Context]) -> tuple[str, ...]:
    """The words of these lines' string literals: what a string's word is changed to."""
    return tuple(sorted({w for line in found for w in _raise_tokens(line)[2]
                         if w.isalpha() and w.islower() and len(w) >= 3}))


def _one_token_changed(keep: frozenset[str], vocabulary: tuple[str, ...], line: str,
                       r: random.Random) -> str | None:
    """``line`` with one name or number respelled, or one word of its strings replaced by another of
    ``vocabulary``, wherever it is (never one of ``keep`` nor a Python keyword), where it has two or
    more such tokens."""
    names, numbers, words = _raise_tokens(line)  # a line's (names, numbers, words of strings), keywords left out
    found = sorted((names | numbers | words) - keep)
    if len(found) < 2:  # `f(x=1)` -> `f(y=1)`: another line, not a copy
        return None
    old = r.choice(found)
    if old in numbers:  # another number of its digits, not in the line already (`[0, 1, ..., 9]` has none)
        low = 10 ** (len(old) - 1) if len(old) > 1 else 0
        new = next((x for x in map(str, r.sample(range(low, 10 ** len(old)), min(100, 10 ** len(old) - low)))
                    if x != old and not re.search(rf"\b{x}\b", line)), None)
        if new is None:
            return None
    elif old in names:
        new = _respelled(old, line, r)
    else:
        new = next(w for w in r.sample(vocabulary, len(vocabulary))
                   if w != old.lower() and not re.search(rf"\b{w}\b", line, re.IGNORECASE))
        new = new.upper() if old.isupper() and len(old) > 1 else new.title() if old[0].isupper() else new
    prefix = "(?![\"'])" if old.lower() in {"r", "u", "f", "b", "br", "rb", "fr", "rf"} else ""  # never f"..."'s f
    changed = re.sub(rf"(?<![%!\\\w]){re.escape(old)}\b{prefix}", new, line)
    return changed if changed != line else None


# --- assert call (natural data, many near-identical legitimate rows) -----------------------------------

def assert_calls(rng: random.Random) -> Shape:
    context = stdlib_calls()[0]
    rows = _run(context, rng)
    vocabulary = _string_words(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, number or string word, wherever it is
        method = re.match(r"self\.(assert\w*)", p[0]).group(1)
        changed = _one_token_changed(frozenset({"self", method}), vocabulary, p[0], r)
        return [changed] if changed else None

    lead = ["Check: ", "In the test we read ", "Q: ", "Here is the assertion: "]
    return Shape("assert call", f"a stdlib test's one-line `self.assert...(...)` call, {NATURAL_ROWS} unique rows "
                 "from a run of stdlib files (its tests check alike things one name or number apart); the "
                 "question in the template", rows,
                 lambda p: f"What does this assertion check?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


# --- keyword call (natural data) ----------------------------------------------------------------------

def keyword_calls(rng: random.Random) -> Shape:
    context = stdlib_calls()[1]
    rows = _run(context, rng)
    vocabulary = _string_words(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, number or string word, wherever it is
        changed = _one_token_changed(frozenset(), vocabulary, p[0], r)  # True, False, None: keywords
        return [changed] if changed else None

    lead = ["Call: ", "Look at this line: ", "Q: ", "From the module: "]
    return Shape("keyword call", f"a stdlib one-line call with a keyword argument, {NATURAL_ROWS} unique rows from "
                 "a run of stdlib files (tests included); the question in the template", rows,
                 lambda p: f"Which keyword arguments does this call pass?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


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
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
MONTH_ABBR = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


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
