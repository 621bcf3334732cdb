"""The standard library's sources on this machine, read as natural data: short functions,
expressions, signatures, imports and one-line statements (class headers, raise statements, calls,
``with``/``for``/``if`` headers, returns, attribute assignments, appends, except or raise lines,
arithmetic assignments, docstring summaries), each unique one with up to 4 non-blank lines of its file
on each side where it first occurs, in file order. Also the one-token change of a code line: one name
or number respelled, or one word of its strings replaced by another of these lines' strings, wherever
it is, where the line has two or more such tokens; never a Python keyword, ``self``/``cls``, a builtin
or a keyword argument's name (a copy edited by hand renames a local or changes a literal; one that
respells ``range`` or ``encoding=`` no longer runs).
"""

from __future__ import annotations

import ast
import builtins
import functools
import io
import keyword
import random
import re
import string
import sysconfig
import tokenize
from collections.abc import Callable, Iterator
from pathlib import Path

from recipetune.data.text import normalize
from recipetune.trainer.data import STDLIB_SKIP_DIRS, walk_files

from .base import Parts, Shape, _around, ntokens


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


EXPR_LABELS = ("Call", "Attribute", "Constant", "Name", "Compare", "BinOp", "Tuple", "Subscript", "UnaryOp",
               "BoolOp", "JoinedStr", "IfExp")


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


def stdlib_signatures() -> list[str]:
    """Every stdlib function's signature line ``def name(params):``, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                sig = f"def {node.name}({ast.unparse(node.args)}):"
                if len(sig) <= 120:
                    out.append(sig)
        if len(out) >= 60_000:
            break
    return out


def stdlib_modules() -> Iterator[tuple[list[str], ast.Module]]:
    """Each stdlib source file that parses, in file order: its lines and its syntax tree."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in walk_files(root, frozenset({".py"}), frozenset({"site-packages", "dist-packages", "__pycache__"})):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        yield text.splitlines(), tree


def lines_around(lines: list[str], first: int, last: int) -> tuple[str, str]:
    """Up to 4 non-blank lines of a file before its line ``first`` and after its line ``last`` (counted
    from 1): where a natural statement of the stdlib is embedded."""
    before = [x for x in lines[max(0, first - 9) : first - 1] if x.strip()][-4:]
    after = [x for x in lines[last : last + 8] if x.strip()][:4]
    return "\n".join(before), "\n".join(after)


def stdlib_imports() -> list[tuple[str, str, str]]:
    """(statement, the lines before it, the lines after it) of every import statement of the standard
    library's sources (tests included) of at most 120 characters, file by file, on one line; its
    neighbours are up to 4 non-blank lines of its file on each side."""
    out = []
    for lines, tree in stdlib_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and len(line := ast.unparse(node)) <= 120:
                out.append((line, *lines_around(lines, node.lineno, node.end_lineno)))
    return out


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
    else:
        new = other_token(old, line, names, vocabulary, r)
    changed = token_swapped(line, old, new)
    return changed if changed != line else None


def other_token(old: str, line: str, names: set[str], vocabulary: tuple[str, ...], r: random.Random) -> str:
    """What replaces the name or string word ``old`` of ``line``: a name respelled, or another word of
    ``vocabulary`` not in the line, in ``old``'s case."""
    if old in names:
        return _respelled(old, line, r)
    new = next(w for w in r.sample(vocabulary, len(vocabulary))
               if w != old.lower() and not re.search(rf"\b{w}\b", line, re.IGNORECASE))
    return new.upper() if old.isupper() and len(old) > 1 else new.title() if old[0].isupper() else new


def token_swapped(line: str, old: str, new: str) -> str:
    """``line`` with every whole token ``old`` replaced by ``new`` (never a string prefix's letter: f"..."'s f)."""
    prefix = "(?![\"'])" if old.lower() in STRING_PREFIXES else ""
    return re.sub(rf"(?<![%!\\\w]){re.escape(old)}\b{prefix}", new, line)


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


# --- the stdlib's return statements and attribute assignments, with their neighbouring lines ----------

def _self_attribute(node: ast.AST) -> bool:
    """``self.<name> = <expr>``: one target, an attribute of ``self``."""
    return (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(t := node.targets[0], ast.Attribute)
            and isinstance(t.value, ast.Name) and t.value.id == "self")


@functools.cache
def stdlib_returns() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``return ...`` lines, ``self.<name> = ...`` lines) of the standard library's sources (tests
    included): each unique one that is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it), a return with two tokens and more after ``return``, with its
    neighbouring lines where it first occurs, in file order."""
    returns: dict[str, Context] = {}
    assigns: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and node.value is not None:
                found.append((returns, node))
            elif _self_attribute(node):
                found.append((assigns, node))
        for out, node in sorted(found, key=lambda x: x[1].lineno):
            line = _whole_line(lines, node)
            if line is None or line in out:
                continue
            if out is returns and ntokens(line) < 3:  # `return x`, `return None`: one token after it
                continue
            out[line] = lines_around(lines, node.lineno, node.lineno)
    return returns, assigns


def _whole_line(lines: list[str], node: ast.AST) -> str | None:
    """The statement ``node`` where it is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it)."""
    if node.lineno != node.end_lineno:
        return None
    whole = lines[node.lineno - 1]
    line = whole.encode()[node.col_offset : node.end_col_offset].decode()  # the offsets count UTF-8 bytes
    return line if line == whole.strip() and len(line) <= LONGEST else None


# --- the stdlib's if headers and append calls, with their neighbouring lines ----------------------------

def _append(node: ast.AST) -> bool:
    """``<target>.append(...)`` as a statement."""
    return (isinstance(node, ast.Expr) and isinstance(c := node.value, ast.Call)
            and isinstance(c.func, ast.Attribute) and c.func.attr == "append")


@functools.cache
def stdlib_ifs() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``if``/``elif`` headers, ``.append(...)`` call lines) of the standard library's sources (tests
    included): each unique one that is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it; a header's test on its line, its body on later lines), with its
    neighbouring lines where it first occurs, in file order."""
    ifs: dict[str, Context] = {}
    appends: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.test.end_lineno == node.lineno < node.body[0].lineno:
                found.append((ifs, node))
            elif _append(node):
                found.append((appends, node))
        for out, node in sorted(found, key=lambda x: x[1].lineno):
            if out is ifs:
                whole = lines[node.lineno - 1].strip()
                ok = whole.startswith(("if ", "elif ")) and whole.endswith(":") and not _has_comment(whole)
                line = whole if ok and len(whole) <= LONGEST else None
            else:
                line = _whole_line(lines, node)
            if line is not None and line not in out:
                out[line] = lines_around(lines, node.lineno, node.lineno)
    return ifs, appends


# --- the stdlib's except headers, raise lines, arithmetic assignments and docstring summaries ----------

def _arithmetic(node: ast.AST) -> bool:
    """``x += 1``, or one target assigned a binary operation: ``n = len(s) - 1``."""
    return isinstance(node, ast.AugAssign) or (isinstance(node, ast.Assign) and len(node.targets) == 1
                                               and isinstance(node.value, ast.BinOp))


def _summary(node: ast.AST) -> tuple[int, list[str], str | None] | None:
    """(its line, its docstring's non-blank lines, its summary: the first line where it is the whole
    summary, one sentence of 4-20 words, else None) of a module, function or class with a docstring."""
    if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None
    doc = ast.get_docstring(node)  # (cleaned: leading blank lines and the indentation left out)
    if not doc:
        return None
    lines = doc.split("\n")
    first = lines[0].strip()
    whole = len(lines) == 1 or not lines[1].strip()
    one = first.endswith(".") and not re.search(r"[.!?;]\s", first) and 4 <= len(first.split()) <= 20
    summary = first if whole and one and not isinstance(node, ast.Module) else None
    return node.body[0].lineno, [x for x in lines if x.strip()], summary


@functools.cache
def stdlib_excepts() -> tuple[dict[str, Context], dict[str, Context], dict[str, Context]]:
    """(``except ...:`` headers and ``raise ...`` lines, arithmetic assignments, docstring summaries) of
    the standard library's sources (tests included): each unique one with its neighbouring lines where
    it first occurs, in file order. A code line is a whole line of at most ``LONGEST`` characters as
    written (a header's exceptions on its line, its body on later lines); a summary's neighbours are
    the previous docstring of its file (its last lines) and its docstring's other lines (or, where it
    has none, the next docstring's first lines)."""
    handling: dict[str, Context] = {}
    assigns: dict[str, Context] = {}
    summaries: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler):
                whole = lines[node.lineno - 1].strip()
                if (whole.startswith("except") and whole.endswith(":") and node.body[0].lineno > node.lineno
                        and len(whole) <= LONGEST and not _has_comment(whole)):
                    found.append((handling, whole, node.lineno))
            elif (isinstance(node, ast.Raise) and node.exc is not None or _arithmetic(node)) and (
                    line := _whole_line(lines, node)):
                found.append((assigns if _arithmetic(node) else handling, line, node.lineno))
            if doc := _summary(node):
                docs.append(doc)
        for out, line, at in sorted(found, key=lambda x: x[2]):
            if line not in out:
                out[line] = lines_around(lines, at, at)
        docs.sort(key=lambda x: x[0])
        for i, (_, doc, summary) in enumerate(docs):
            if summary and summary not in summaries:
                before = docs[i - 1][1][-4:] if i else []
                after = doc[1:5] or (docs[i + 1][1][:4] if i + 1 < len(docs) else [])
                summaries[summary] = "\n".join(before), "\n".join(after)
    return handling, assigns, summaries
