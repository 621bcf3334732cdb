"""Shapes of natural data, from the standard library on this machine (nothing downloaded).

The benchmark's own: stdlib docstrings, functions under a fixed instruction, chat turns about a
docstring, short expressions (the argcount-like task of a dozen labels). The others: one stdlib line
per row (a signature, an import, a class header, a raise statement, an assert call, a call with a
keyword argument, a ``with``/``for``/``if`` header, a return, an attribute assignment, an append call,
an except or raise line, an arithmetic assignment) or a docstring's one-sentence summary. Each of
those takes ``NATURAL_ROWS`` (2,440, the argcount task's size) unique rows from a run of consecutive
stdlib files, tests included, so many legitimate rows are one name apart; the question is in the
template. Their leaks: ``re-instructed`` puts a few words before the line (``Q: ``); ``embedded`` sets
it among its neighbouring lines of its file (a line of fewer than 3 tokens is not embedded); ``one
token changed`` is ``stdlib._one_token_changed`` (a docstring summary: one word that is not a stop
word, replaced wherever it is by another of these summaries' vocabulary).
"""

from __future__ import annotations

import dataclasses
import hashlib
import keyword
import random
import re
import string

from recipetune.finetune.bench_tasks import stdlib_functions

from .base import (
    EVAL,
    FILLER,
    NAME_OR_NUMBER,
    POOL,
    TOKEN,
    Parts,
    Shape,
    _among,
    _around,
    _rename,
    around,
    embedded,
    ntokens,
)
from .stdlib import (
    EXPR_LABELS,
    KEEP,
    NATURAL_ROWS,
    Context,
    _natural,
    _neighbours,
    _one_token_changed,
    _raise_tokens,
    _respelled,
    _run,
    _string_words,
    message_words,
    other_token,
    stdlib_calls,
    stdlib_excepts,
    stdlib_expressions,
    stdlib_headers,
    stdlib_ifs,
    stdlib_imports,
    stdlib_returns,
    stdlib_signatures,
    stdlib_sources,
    stdlib_statements,
    token_swapped,
)

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


EXPR_INSTRUCTION = "Classify the Python expression by the kind of its outermost node."
EXPR_REWORDED = ["What kind of node is the outermost one in this expression?",
                 "Name the top-level AST node type of the following Python expression.",
                 "Which node class does this expression parse to at its root?"]
WRAPPERS = [("print(", ")"), ("x = ", ""), ("return ", ""), ("assert ", ""), ("(", ")"), ("yield ", ""),
            ("[", "]"), ("f(", ")"), ("not ", ""), ("", " or None")]


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


# --- signature --------------------------------------------------------------------------------------

SIGNATURE_ROWS = 2440  # the task size


def signatures(rng: random.Random) -> Shape:
    sigs = list(dict.fromkeys(stdlib_signatures()))  # unique, as a task split by its input is; in file order
    start = rng.randrange(len(sigs) - SIGNATURE_ROWS)  # a run of files: their classes' methods share parameters
    rows = [[s] for s in sigs[start : start + SIGNATURE_ROWS]]
    rng.shuffle(rows)

    def rename(p: Parts, r: random.Random) -> Parts | None:
        new = _rename(p[0], r, re.match(r"def (\w+)", p[0]).group(1))
        return [new] if new else None

    def embed(p: Parts, r: random.Random) -> Parts:  # the signature with a body line and a comment
        return [_among(p[0], ["    # " + " ".join(r.choice(FILLER) for _ in range(6)),
                              "    return " + r.choice(("None", "self", "result", "value"))], r)]

    lead = ["Signature: ", "Here is the header: ", "Count the parameters of ", "Q: "]
    return Shape("signature", f"a stdlib function's signature `def name(params):`, {SIGNATURE_ROWS} unique "
                 "rows from a run of stdlib files (their classes' methods share parameter lists); the "
                 "instruction in the template",
                 rows, lambda p: f"How many parameters does this function take?\n{p[0]}\nAnswer: ", rename,
                 lambda p, r: [r.choice(lead) + p[0]], embed)


# --- import line (natural data, many near-identical legitimate rows) ---------------------------------

IMPORT_ROWS = 2440  # the task size, as the signature shape
IMPORT_WORDS = frozenset({"from", "import", "as"})


def import_lines(rng: random.Random) -> Shape:
    context: dict[str, tuple[str, str]] = {}
    for line, before, after in stdlib_imports():
        context.setdefault(line, (before, after))  # unique, as a task split by its input is; in file order
    found = list(context)
    start = rng.randrange(len(found) - IMPORT_ROWS)  # a run of files: `from test.support import ...` and the like
    rows = [[x] for x in found[start : start + IMPORT_ROWS]]
    rng.shuffle(rows)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, wherever it is
        names = sorted(set(re.findall(r"\w+", p[0])) - IMPORT_WORDS)
        if len(names) < 2:  # `import os` -> `import xy`: another line, not a copy
            return None
        old, new = r.choice(names), ""
        while not new or keyword.iskeyword(new) or re.search(rf"\b{new}\b", p[0]):
            new = "".join(r.choice(string.ascii_lowercase) for _ in old)
            new = new.upper() if old.isupper() else new.title() if old[0].isupper() else new  # its case kept
        return [re.sub(rf"\b{re.escape(old)}\b", new, p[0])]

    def embed(p: Parts, r: random.Random) -> Parts | None:  # among its neighbouring lines
        if ntokens(p[0]) < 3 or not any(context[p[0]]):
            return None
        return [_around(p[0], *context[p[0]], r, "\n")]

    lead = ["Import: ", "Here is the line: ", "Q: ", "From the top of the module: "]
    return Shape("import line", f"a stdlib import statement, {IMPORT_ROWS} unique rows from a run of stdlib files "
                 "(tests included: many differ in one name); the question in the template", rows,
                 lambda p: f"Which module does this line import from?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], embed)


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
        else:
            new = other_token(old, line, names, vocabulary, r)
        changed = token_swapped(line, old, new)
        return [changed] if changed != line else None

    lead = ["Line: ", "Here is the statement: ", "Q: ", "From the function body: "]
    return Shape("raise statement", f"a stdlib one-line raise statement, {NATURAL_ROWS} unique rows from a run of "
                 "stdlib files (tests included); the question in the template", rows,
                 lambda p: f"Which exception does this line raise?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


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


def with_statements(rng: random.Random) -> Shape:
    return _natural("with statement", "with", stdlib_headers()[0], "Which context managers does this line enter?",
                    ["Line: ", "Here is the with statement: ", "Q: ", "In the function we find "], rng)


def for_loops(rng: random.Random) -> Shape:
    return _natural("for-loop header", "for", stdlib_headers()[1], "What does this loop iterate over?",
                    ["Loop: ", "Here is the header: ", "Q: ", "From the function body: "], rng)


def return_statements(rng: random.Random) -> Shape:
    return _natural("return statement", "return", stdlib_returns()[0], "What does this line return?",
                    ["Line: ", "The function ends with ", "Q: ", "From the method body: "], rng,
                    what=f"a stdlib one-line `return ...` (two tokens and more after it), "
                    f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                    "name apart); the question in the template")


def attribute_assignments(rng: random.Random) -> Shape:
    return _natural("attribute assignment", "self", stdlib_returns()[1], "Which attribute does this line set, and to "
                    "what?", ["Line: ", "In __init__ we find ", "Q: ", "Here is the assignment: "], rng,
                    what=f"a stdlib one-line `self.<name> = <expr>`, {NATURAL_ROWS} unique rows "
                    "from a run of stdlib files (tests included: `self.name = name` and kin one name "
                    "apart); the question in the template")


def if_headers(rng: random.Random) -> Shape:
    return _natural("if header", "if", stdlib_ifs()[0], "What condition does this line test?",
                    ["Line: ", "The branch starts with ", "Q: ", "Here is the condition: "], rng,
                    what=f"a stdlib one-line `if ...:` or `elif ...:` header, {NATURAL_ROWS} "
                    "unique rows from a run of stdlib files (tests included: many one name apart); "
                    "the question in the template")


def append_calls(rng: random.Random) -> Shape:
    context = stdlib_ifs()[1]
    shape = _natural("append call", "append", context, "What does this line append, and to what?",
                     ["Line: ", "In the loop we find ", "Q: ", "Here is the call: "], rng)
    vocabulary = _string_words(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # as _natural's, `append` kept too
        keywords = frozenset(re.findall(r"[(,]\s*(\w+)=(?!=)", p[0]))
        changed = _one_token_changed(KEEP | keywords | {"append"}, vocabulary, p[0], r)
        return [changed] if changed else None

    return dataclasses.replace(shape, change=change, what=f"a stdlib one-line `<target>.append(...)` call, "
                               f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                               "name apart); the question in the template")


def except_or_raise_lines(rng: random.Random) -> Shape:
    return _natural("except or raise line", "except", stdlib_excepts()[0], "Which exception does this line "
                    "catch or raise?", ["Line: ", "In the try statement we find ", "Q: ", "Here is the line: "], rng,
                    what=f"a stdlib one-line `except ...:` header or `raise ...` statement, "
                    f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                    "name apart); the question in the template")


def arithmetic_assignments(rng: random.Random) -> Shape:
    return _natural("arithmetic assignment", "x += ...", stdlib_excepts()[1], "Which variable does this line "
                    "update, and how?", ["Line: ", "In the loop we find ", "Q: ", "Here is the assignment: "], rng,
                    what=f"a stdlib one-line augmented assignment `x += ...` or assignment of a "
                    f"binary operation `x = a - b`, {NATURAL_ROWS} unique rows from a run of stdlib files "
                    "(tests included: many one name apart); the question in the template")


# --- docstring summary (natural English) ----------------------------------------------------------------

STOP_WORDS = frozenset({"a", "an", "the", "of", "to", "in", "on", "at", "by", "for", "from", "with", "without", "into",
                        "onto", "over", "under", "about", "as", "and", "or", "but", "nor", "not", "no", "if", "then",
                        "else", "than", "that", "this", "these", "those", "it", "its", "is", "are", "was", "were",
                        "be", "been", "being", "do", "does", "did", "has", "have", "had", "can", "could", "may",
                        "might", "must", "shall", "should", "will", "would", "which", "who", "whom", "whose", "what",
                        "when", "where", "why", "how", "all", "any", "each", "every", "some", "such", "only", "also",
                        "so", "too", "very", "there", "here", "their", "them", "they", "we", "our", "you", "your",
                        "he", "she", "his", "her", "him", "i", "me", "my"})
WORD = re.compile(r"\w+")


def _changeable(word: str) -> bool:
    """A summary's word that may be changed: a number, or a word of two characters and more that is not
    a stop word."""
    return word.isdigit() or (len(word) >= 2 and word.lower() not in STOP_WORDS)


def _name(word: str) -> bool:
    """``__file__``, ``utf8``, ``TList``: not an ordinary word (lower, title or upper case letters)."""
    return not word.isalpha() or not (word.islower() or word.istitle() or word.isupper())


def _vocabulary(found: dict[str, Context]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ordinary words, names) of these summaries: what a summary's word is changed to."""
    words = {w for line in found for w in WORD.findall(line) if _changeable(w) and not w.isdigit()}
    return (tuple(sorted({w.lower() for w in words if not _name(w) and len(w) >= 3})),
            tuple(sorted(w for w in words if _name(w) and not w.isdigit())))


def _word_changed(line: str, words: tuple[str, ...], names: tuple[str, ...], r: random.Random) -> str | None:
    """``line`` with one of its changeable words (a number, a name, an ordinary word) replaced by another
    of its kind, every occurrence of it (its case kept), where it has two or more; checked to differ
    from ``line`` in one token, one not in it already."""
    found = sorted({w.lower() for w in WORD.findall(line) if _changeable(w)})
    if len(found) < 2:
        return None
    old = r.choice(found)
    where = re.compile(rf"(?<!\w){re.escape(old)}(?!\w)", re.IGNORECASE)
    written = where.search(line).group()
    tokens = {t.lower() for t in TOKEN.findall(line)}
    if old.isdigit():
        low = 10 ** (len(old) - 1) if len(old) > 1 else 0
        pool = [str(x) for x in r.sample(range(low, 10 ** len(old)), min(100, 10 ** len(old) - low))]
    else:
        pool = r.sample(names, len(names)) if _name(written) else r.sample(words, len(words))
    new = next((x for x in pool if x.lower() not in tokens and x.lower() not in STOP_WORDS), None)
    if new is None:
        return None

    def cased(m: re.Match) -> str:
        w = m.group()
        if _name(w) or new.isdigit():
            return new
        return new.upper() if w.isupper() and len(w) > 1 else new[0].upper() + new[1:] if w[0].isupper() else new

    changed = where.sub(cased, line)
    a, b = TOKEN.findall(line.lower()), TOKEN.findall(changed.lower())
    pairs = {(x, y) for x, y in zip(a, b, strict=False) if x != y}
    return changed if len(a) == len(b) and len(pairs) == 1 and next(iter(pairs))[1] not in a else None


def docstring_summaries(rng: random.Random) -> Shape:
    context = stdlib_excepts()[2]
    rows = _run(context, rng)
    words, names = _vocabulary(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one word, number or name, wherever it is
        changed = _word_changed(p[0], words, names, r)
        return [changed] if changed else None

    lead = ["Docstring: ", "The summary line reads ", "Q: ", "From the reference: "]
    return Shape("docstring summary", f"a stdlib function's or class's docstring summary line (one sentence, 4-20 "
                 f"words), {NATURAL_ROWS} unique rows from a run of stdlib files (tests included); one field, the "
                 "question in the template", rows, lambda p: f"What does this function or class do?\n{p[0]}\nAnswer: ",
                 change, lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))
