"""The small benchmark: tasks of different shapes generated on every machine, nothing downloaded.

- ``arith``: multi-digit addition ``347+589=`` -> ``936`` (generated; exact match);
- ``stdlib-module``: which standard-library module a function's docstring comes from
  (classification over the 8 modules with most docstrings; accuracy and macro-F1);
- ``funcname``: a function's name from its docstring (generation; exact match and ROUGE-L);
- ``argcount``: the number of parameters of a stdlib function signature, under a long instruction
  every prompt shares (the instruction is the example file's template; exact match);
- ``default-value``: the default of a named parameter in a stdlib signature (span extraction: the
  answer is a substring of the prompt; exact match);
- ``product``: two-digit products ``47*86=`` -> ``4042`` (generated; ``numeric``: within a
  relative tolerance set on the task);
- ``exception``: which built-in exception a stdlib ``raise`` with this message raises (multi-token
  labels, imbalanced: ValueError about half; macro-F1);
- ``chat-rename``: a chat task (``messages`` with a system prompt): rewrite a stdlib function's
  snake_case name in the style the system prompt names (exact match);
- ``chat-recall``: a multi-turn chat whose answer was said in an earlier turn: two user turns each
  give a stdlib module's name a number, the third asks for one of them (exact match);
- ``exec-expr``: a one-line Python program for a phrase (``the sum of 47 and 83``), scored by running
  it in a sandbox and comparing what it prints with the reference program's output (``exec_output``).

The docstring tasks read the running Python's standard library (the same files the reference
trainer's ``stdlib`` corpus reads, so the base model has seen this code: a knowledge-recall task,
stated as such in docs/finetune.md). Splits are by a hash of the input, so they are deterministic
and disjoint in exact inputs; near-duplicates across splits remain, and decontamination removes
the training rows that overlap. Files are cached under ``<cache>/tasks/``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import random
import re
import shutil
import sys
import sysconfig
from collections import Counter
from functools import cache
from pathlib import Path

from recipetune.trainer.data import STDLIB_SKIP_DIRS, walk_files

VERSION = "1"
TASK_VERSIONS = {"chat-rename": "3"}  # a task whose generator changed (its cached files are regenerated)
EVAL_SIZE = 200  # validation and test rows per task


def _hash_mod(text: str, n: int) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % n


def _split_of(text: str) -> str:
    h = _hash_mod(text, 10)
    return "validation" if h == 0 else "test" if h == 1 else "train"


def arith_rows(seed: int = 0, n_train: int = 4000) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    seen: set[tuple[int, int]] = set()
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    sizes = {"train": n_train, "validation": EVAL_SIZE, "test": EVAL_SIZE}
    for split in ("validation", "test", "train"):
        while len(out[split]) < sizes[split]:
            a, b = rng.randint(0, 999), rng.randint(0, 999)
            if (a, b) in seen:
                continue
            seen.add((a, b))
            out[split].append({"question": f"{a}+{b}=", "answer": str(a + b)})
    return out


def stdlib_functions() -> list[tuple[str, str, str]]:
    """(module, function name, first docstring line) of public stdlib functions, unique docstrings."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[tuple[str, str, str]] = []
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        module = path.relative_to(root).parts[0].removesuffix(".py")
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
                doc = ast.get_docstring(node)
                line = doc.strip().splitlines()[0].strip() if doc and doc.strip() else ""
                if 20 <= len(line) <= 160:
                    found.append((module, node.name, line))
    counts = Counter(line for _, _, line in found)
    return [f for f in found if counts[f[2]] == 1]  # a docstring shared by several functions is ambiguous


def _by_hash(rows: list[dict], key: str, cap_eval: int = EVAL_SIZE) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for row in sorted(rows, key=lambda r: hashlib.sha256(r[key].encode()).hexdigest()):
        out[_split_of(row[key])].append(row)
    for split in ("validation", "test"):
        out[split] = out[split][:cap_eval]
    return out


def module_rows(n_classes: int = 8, per_class: int = 300) -> dict[str, list[dict]]:
    funcs = stdlib_functions()
    top = [m for m, _ in Counter(m for m, _, _ in funcs).most_common(n_classes)]
    rows, taken = [], Counter()
    for module, _, doc in sorted(funcs, key=lambda f: hashlib.sha256(f[2].encode()).hexdigest()):
        if module in top and taken[module] < per_class:
            taken[module] += 1
            rows.append({"docstring": doc, "module": module})
    return _by_hash(rows, "docstring")


def funcname_rows(limit: int = 3000) -> dict[str, list[dict]]:
    funcs = sorted(stdlib_functions(), key=lambda f: hashlib.sha256(f[2].encode()).hexdigest())[:limit]
    return _by_hash([{"docstring": doc, "name": name} for _, name, doc in funcs], "docstring")


def _stdlib_trees():
    """(top-level module, parsed tree) of every standard-library source file, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        try:
            yield path.relative_to(root).parts[0].removesuffix(".py"), ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue


def _message(node: ast.expr) -> str | None:
    """The literal text of an exception's message: a string, an f-string's source, or the format
    string of ``"..." % x`` and ``"...".format(x)``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return ast.unparse(node)[2:-1]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
        return _message(node.left)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "format":
        return _message(node.func.value)
    return None


@cache
def stdlib_code_facts() -> tuple[tuple[tuple[str, int, tuple[tuple[str, str], ...]], ...], tuple[tuple[str, str], ...]]:
    """One pass over the standard library's sources (cached per process):

    - signatures: (``def name(args):`` as ``ast.unparse`` writes it, number of parameters, the
      (parameter, default's source) pairs), unique signatures of at most 160 characters;
    - raises: (message, exception name) of ``raise Name("message" ...)``, messages of 10-120
      characters (whitespace collapsed) raised with one exception only.
    """
    sigs: dict[str, tuple[int, tuple[tuple[str, str], ...]]] = {}
    raised: dict[str, set[str]] = {}
    for _, tree in _stdlib_trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                a = node.args
                sig = f"def {node.name}({ast.unparse(a)}):"
                if len(sig) > 160 or sig in sigs:
                    continue
                pos = a.posonlyargs + a.args
                n = len(pos) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
                pairs = [*zip([p.arg for p in pos[len(pos) - len(a.defaults):]], a.defaults, strict=True),
                         *((p.arg, d) for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None)]
                sigs[sig] = (n, tuple((p, ast.unparse(d)) for p, d in pairs))
            elif (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)
                  and isinstance(node.exc.func, ast.Name) and node.exc.args):
                text = _message(node.exc.args[0])
                text = " ".join(text.split()) if text else ""
                if 10 <= len(text) <= 120:
                    raised.setdefault(text, set()).add(node.exc.func.id)
    return (tuple((s, n, d) for s, (n, d) in sigs.items()),
            tuple((m, next(iter(e))) for m, e in raised.items() if len(e) == 1))


def _capped(out: dict[str, list[dict]], n_train: int) -> dict[str, list[dict]]:
    out["train"] = out["train"][:n_train]
    return out


def argcount_rows(n_train: int = 3000) -> dict[str, list[dict]]:
    """Long fixed instruction, short answer: the prompt (the example file's template) opens with the
    same multi-sentence instruction; the row holds only the signature (at most 100 characters) and
    its parameter count."""
    signatures, _ = stdlib_code_facts()
    rows = [{"signature": s, "count": str(n)} for s, n, _ in signatures if len(s) <= 100]
    return _capped(_by_hash(rows, "signature"), n_train)


def default_rows(n_train: int = 3000) -> dict[str, list[dict]]:
    """Span extraction: a signature, one of its parameters with a default, and that default's source
    text, which is a substring of the signature. A default written twice in the same signature is
    left out (the answer would not identify one span), and so are three ``None`` defaults in four;
    defaults of at most 24 characters. Splits are by signature, so the rows of one signature stay in
    one split."""
    signatures, _ = stdlib_code_facts()
    rows = []
    for sig, _, pairs in signatures:
        counts = Counter(d for _, d in pairs)
        rows += [{"signature": sig, "param": p, "default": d} for p, d in pairs
                 if counts[d] == 1 and len(d) <= 24 and d in sig
                 and (d != "None" or _hash_mod(sig + p, 4) == 0)]  # else "None" would be 40% of answers
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for row in sorted(rows, key=lambda r: (hashlib.sha256(r["signature"].encode()).hexdigest(), r["param"])):
        out[_split_of(row["signature"])].append(row)
    for split in ("validation", "test"):
        out[split] = out[split][:EVAL_SIZE]
    return _capped(out, n_train)


def product_rows(seed: int = 0, n_train: int = 3000) -> dict[str, list[dict]]:
    """Numeric answer with a tolerance: ``a*b=`` for two-digit a <= b (each unordered pair once, so
    ``b*a`` never crosses splits), scored by the ``numeric`` metric within the task's tolerance."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(10, 100) for b in range(a, 100)]
    rng.shuffle(pairs)
    rows = [{"question": f"{a}*{b}=", "answer": str(a * b)} for a, b in pairs]
    return {"validation": rows[:EVAL_SIZE], "test": rows[EVAL_SIZE:2 * EVAL_SIZE],
            "train": rows[2 * EVAL_SIZE:2 * EVAL_SIZE + n_train]}


EXCEPTIONS_MIN = 15  # a built-in exception needs this many distinct messages to be a label


def exception_rows() -> dict[str, list[dict]]:
    """Multi-token labels with imbalance: the built-in exception (``ValueError``, ``TypeError`` ...)
    that a stdlib ``raise`` with this message raises, for the built-ins raised with at least
    ``EXCEPTIONS_MIN`` distinct messages; kept at their natural, imbalanced shares."""
    import builtins

    _, raised = stdlib_code_facts()
    builtin = {e for _, e in raised if isinstance(getattr(builtins, e, None), type)
               and issubclass(getattr(builtins, e), BaseException)}
    counts = Counter(e for _, e in raised if e in builtin)
    labels = {e for e, n in counts.items() if n >= EXCEPTIONS_MIN}
    return _by_hash([{"message": m, "exception": e} for m, e in raised if e in labels], "message")


STYLES = {  # name style -> (how the system prompt calls it, its example, the rewrite of snake_case words)
    "camel": ("camelCase", "openFile", lambda w: w[0] + "".join(x.capitalize() for x in w[1:])),
    "pascal": ("PascalCase", "OpenFile", lambda w: "".join(x.capitalize() for x in w)),
    "kebab": ("kebab-case", "open-file", lambda w: "-".join(w)),
    "constant": ("SCREAMING_SNAKE_CASE", "OPEN_FILE", lambda w: "_".join(w).upper()),
}
RENAME_SYSTEM = "Rewrite the user's snake_case name in {style} (open_file: {example}). Reply with the name only."


def rename_rows(n_train: int = 3000) -> dict[str, list[dict]]:
    """A chat task with a system prompt: ``messages`` of (system, user, assistant). The system prompt
    names one of four styles (camelCase, PascalCase, kebab-case, SCREAMING_SNAKE_CASE), the user sends a
    stdlib function's snake_case name of 2-4 words (at most 24 characters), the assistant answers the
    name in that style: the user's message alone does not say which answer is right. Splits are by
    name; a training name comes in two styles, an evaluation name in one."""
    import re

    signatures, _ = stdlib_code_facts()
    names = sorted({s[4:s.index("(")] for s, _, _ in signatures})
    names = [n for n in names if re.fullmatch(r"[a-z][a-z0-9]*(_[a-z][a-z0-9]*){1,3}", n) and len(n) <= 24]
    styles = list(STYLES)
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    for name in sorted(names, key=lambda n: hashlib.sha256(n.encode()).hexdigest()):
        split = _split_of(name)
        first = _hash_mod("style " + name, len(styles))
        for k in ((first, (first + 2) % len(styles)) if split == "train" else (first,)):
            style, example, rewrite = STYLES[styles[k]]
            out[split].append({"messages": [
                {"role": "system", "content": RENAME_SYSTEM.format(style=style, example=example)},
                {"role": "user", "content": name},
                {"role": "assistant", "content": rewrite(name.split("_"))}]})
    for split in ("validation", "test"):
        out[split] = out[split][:EVAL_SIZE]
    return _capped(out, n_train)


def _module_names() -> list[str]:
    """Short, plain standard-library module names (``heapq``, ``shutil``): the names of chat-recall's
    facts and the words of exec-expr's string phrases. ``sys.stdlib_module_names`` is fixed per Python
    version, so the rows are too."""
    return sorted(n for n in sys.stdlib_module_names if re.fullmatch(r"[a-z]{3,8}", n))


def _drawn_by_hash(draw, n_train: int) -> dict[str, list[dict]]:
    """Rows from ``draw() -> (key, row)`` until every split is full, each key once, in the split its hash
    names (the generated tasks' splits: deterministic for a seeded ``draw``, disjoint in keys)."""
    out: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    sizes = {"train": n_train, "validation": EVAL_SIZE, "test": EVAL_SIZE}
    seen: set[str] = set()
    while any(len(out[s]) < sizes[s] for s in out):
        key, row = draw()
        split = _split_of(key)
        if key not in seen and len(out[split]) < sizes[split]:
            seen.add(key)
            out[split].append(row)
    return out


def recall_rows(seed: int = 0, n_train: int = 3000) -> dict[str, list[dict]]:
    """A multi-turn chat whose answer is in an earlier turn: the first two user turns each tell a
    module name's number (``heapq is 47.``, ``shutil is 83.``: two different names and numbers of
    10-99, the assistant answering ``OK.``), the third asks for one of them (``What is shutil?``), the
    first or the second with equal odds, and the answer restates it (``shutil is 83``: the number then
    follows the same words as where it was told; the reference model still does not copy it, see
    docs/finetune.md). The number is drawn independently of the names, so the last user message alone
    says nothing about it (chance: 1 in 90); a model that copies one of the two numbers without
    reading which was asked gets 1 in 2. Splits by a hash of the user turns; the same question recurs
    across rows and splits with other answers."""
    rng = random.Random(seed)
    names = _module_names()

    def draw() -> tuple[str, dict]:
        (a, b), (x, y), asked = rng.sample(names, 2), rng.sample(range(10, 100), 2), rng.randrange(2)
        turns = [f"{a} is {x}.", f"{b} is {y}.", f"What is {(a, b)[asked]}?"]
        messages = []
        for turn, reply in zip(turns, ["OK.", "OK.", f"{(a, b)[asked]} is {(x, y)[asked]}"], strict=True):
            messages += [{"role": "user", "content": turn}, {"role": "assistant", "content": reply}]
        return "\n".join(turns), {"messages": messages}

    return _drawn_by_hash(draw, n_train)


# exec-expr's phrases: (the phrase, the reference program) over two numbers a, b and a word w
EXEC_OPS = (
    ("the sum of {a} and {b}", "print({a} + {b})"),
    ("{a} minus {b}", "print({a} - {b})"),
    ("the product of {a} and {b}", "print({a} * {b})"),
    ("the larger of {a} and {b}", "print(max({a}, {b}))"),
    ("the remainder of {a} divided by {b}", "print({a} % {b})"),
    ("{a} squared", "print({a} ** 2)"),
    ("the length of '{w}'", "print(len('{w}'))"),
    ("'{w}' in upper case", "print('{w}'.upper())"),
)


def exec_rows(seed: int = 0, n_train: int = 3000) -> dict[str, list[dict]]:
    """Code scored by running it: a phrase (``the remainder of 47 divided by 8``) and the one-line
    program that prints it (``print(47 % 8)``), one of ``EXEC_OPS`` with numbers of 2-99 and a module
    name for the word. The metric runs the generated program in a sandbox, so any program that
    prints the same (``print(7)``, ``print(47-40)``) is right. Splits by a hash of the phrase."""
    rng = random.Random(seed)
    words = _module_names()

    def draw() -> tuple[str, dict]:
        phrase, program = rng.choice(EXEC_OPS)
        values = {"a": rng.randint(2, 99), "b": rng.randint(2, 99), "w": rng.choice(words)}
        return phrase.format(**values), {"phrase": phrase.format(**values), "program": program.format(**values)}

    return _drawn_by_hash(draw, n_train)


GENERATORS = {"arith": arith_rows, "stdlib-module": module_rows, "funcname": funcname_rows,
              "argcount": argcount_rows, "default-value": default_rows, "product": product_rows,
              "exception": exception_rows, "chat-rename": rename_rows, "chat-recall": recall_rows,
              "exec-expr": exec_rows}


def builtin_files(name: str, cache: Path | None = None) -> dict[str, Path]:
    """Generate (once) and return the task's split files."""
    from recipetune.core.measure import cache_dir

    v = sys.version_info
    where = hashlib.sha256(sysconfig.get_paths()["stdlib"].encode()).hexdigest()[:8]
    version = TASK_VERSIONS.get(name, VERSION)
    folder = (cache or cache_dir()) / "tasks" / f"{name}-v{version}-py{v.major}.{v.minor}.{v.micro}-{where}"
    files = {s: folder / f"{s}.jsonl" for s in ("train", "validation", "test")}
    if all(p.is_file() for p in files.values()):
        return files
    tmp = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    for split, rows in GENERATORS[name]().items():
        (tmp / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if folder.exists():
        shutil.rmtree(tmp, ignore_errors=True)  # another process generated it first
    else:
        os.replace(tmp, folder)  # atomic: concurrent experiments never read half a task
    return files
