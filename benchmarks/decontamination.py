"""Planted leaks: decontamination's recall per kind of leak and its false removals, per shape of task.

    python benchmarks/decontamination.py --out benchmarks/results/decontamination.md
    python benchmarks/decontamination.py --set ngram=13 common_share=0.1     # other settings
    python benchmarks/decontamination.py --before                            # + the rule of commit 8464ad6

Each shape of task is built from what is on the machine (generated sums, the standard library's
docstrings and function sources): 200 validation and 200 test rows, and a pool of training rows that
are not copies of them. "Not a copy" is decided apart from the rule under test: a pool row whose
exact character 5-gram Jaccard similarity with some evaluation input reaches 0.5 is a natural
overlap (the stdlib repeats itself): kept in the training rows, neither planted nor clean, and
reported apart (how many the rule removed). Then 40
leaks of each kind are planted, half from validation and half from test rows:

- ``exact``: the evaluation input copied;
- ``case+space``: the same with its case changed and runs of spaces, tabs or newlines inserted;
- ``renamed``: an identifier (the function's name, or a word of a docstring) renamed everywhere;
- ``reworded prefix``: what comes before the evaluation content reworded (the instruction, the
  chat turn's lead-in) or, where nothing does, a few words put before it.

Recall = planted rows removed / planted; false removals = clean rows removed / clean rows (the
target: at most 1%); precision = planted rows removed / (planted + clean rows removed). The rows
are input parts as the task hands them to decontamination (``TaskConfig.input_parts``).
``--before`` also runs the previous rule, which matched the rendered prompt (template included)
with datasketch's MinHash.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import importlib.util
import random
import re
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from recipetune.data.ops import Decontaminate
from recipetune.data.text import ContaminationIndex, normalize
from recipetune.finetune.bench import stdlib_functions
from recipetune.trainer.data import STDLIB_SKIP_DIRS, _walk_files

EVAL = 200
PER_KIND = 40
POOL = 3000
Parts = list[str]
KINDS = ("exact", "case+space", "renamed", "reworded prefix")


@dataclass
class Shape:
    name: str
    what: str
    rows: list[Parts]  # all rows, shuffled: the first 2 * EVAL are validation and test
    render: Callable[[Parts], str]  # the task's rendered prompt (what the rule before this one matched)
    rename: Callable[[Parts, random.Random], Parts | None]
    reword: Callable[[Parts, random.Random], Parts | None]
    content: Callable[[Parts], str] = lambda p: " ".join(p)  # noqa: E731  what the generator varied


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
                 lambda p: p[0], lambda p, r: None, lambda p, r: [r.choice(prefixes) + p[0]])


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
                 lambda p, r: [r.choice(LEAD_INS) + p[0]])


INSTRUCTION = ("Read the Python function below carefully. Count how many parameters it declares, "
               "including self, and answer with that number only.")
REWORDED = ["Look at this Python function and tell me the number of parameters it takes (count self too).",
            "How many parameters does the following function declare? Include self; reply with a number.",
            "Count the declared parameters of the function below, self included. Just the number."]


def stdlib_sources(limit: int) -> list[tuple[str, str]]:
    """(function name, source) of short stdlib functions (3-12 lines), unique sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out, seen = [], set()
    for path in _walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
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

    return Shape("instruction+code", "a fixed 22-word instruction then a stdlib function (3-12 lines), "
                 "in one field; template `{prompt}\\nAnswer: `", rows, lambda p: f"{p[0]}\nAnswer: ",
                 rename, lambda p, r: [r.choice(REWORDED) + p[0][len(INSTRUCTION):]],
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

    return Shape("chat", "system prompt (fixed, 24 words) + user turn with a docstring + assistant turn + "
                 "fixed follow-up; plain rendering `System: ...\\nUser: ...`", rows, render, rename, reword,
                 lambda p: p[1].removeprefix("I found this docstring: ") + " " + p[2].split()[-1])


SHAPES = {"arith": arith, "docstring": docstrings, "instruction+code": code, "chat": chat}


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
    """Pool rows whose exact 5-gram Jaccard with an evaluation input is >= 0.5, over what the
    generator varied (the shape's fixed instruction or system prompt left out)."""
    ev = [shingles(shape.content(p)) for p in evals]
    by_gram: dict[str, list[int]] = {}
    for j, s in enumerate(ev):
        for g in s:
            by_gram.setdefault(g, []).append(j)
    out = set()
    for i, p in enumerate(pool):
        s = shingles(shape.content(p))
        shared: dict[int, int] = {}
        for g in s:
            for j in by_gram.get(g, ()):
                shared[j] = shared.get(j, 0) + 1
        if any(c / (len(s) + len(ev[j]) - c) >= 0.5 for j, c in shared.items()):
            out.add(i)
    return out


def plant(shape: Shape, rng: random.Random) -> tuple[dict[str, list[Parts]], list[Parts], list[str | None]]:
    """(evaluation rows by split, training rows, the leak kind of each training row or None)."""
    val, test, pool = shape.rows[:EVAL], shape.rows[EVAL : 2 * EVAL], shape.rows[2 * EVAL :]
    natural = natural_overlaps(shape, pool, val + test)
    clean = [p for i, p in enumerate(pool) if i not in natural]
    kinds: dict[str, Callable[[Parts, random.Random], Parts | None]] = {
        "exact": lambda p, r: list(p), "case+space": case_space, "renamed": shape.rename,
        "reworded prefix": shape.reword}
    train = [(p, None) for p in clean] + [(p, "natural") for i, p in enumerate(pool) if i in natural]
    for kind, leak in kinds.items():
        sources = rng.sample(val, PER_KIND // 2) + rng.sample(test, PER_KIND // 2)
        train += [(m, kind) for m in (leak(p, rng) for p in sources) if m is not None]
    rng.shuffle(train)
    return {"validation": val, "test": test}, [p for p, _ in train], [k for _, k in train]


# --- rules ----------------------------------------------------------------------------------------------

def current_rule(settings: Decontaminate) -> Callable[[Shape, dict, list[Parts]], list[bool]]:
    def run(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts]) -> list[bool]:
        index = ContaminationIndex(evals, settings)
        return [h is not None for h in index.hits_batch(train)]

    return run


def before_rule(ngram: int = 8, near: float = 0.8) -> Callable[[Shape, dict, list[Parts]], list[bool]]:
    """The rule of commit 8464ad6 (rendered prompts, datasketch MinHash), loaded from git."""
    source = subprocess.run(["git", "show", "8464ad6:src/recipetune/data/text.py"], capture_output=True,
                            text=True, check=True, cwd=Path(__file__).resolve().parents[1]).stdout
    path = Path(tempfile.mkdtemp()) / "text_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("text_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    def run(shape: Shape, evals: dict[str, list[Parts]], train: list[Parts]) -> list[bool]:
        index = module.ContaminationIndex(ngram, near, 64)
        for split, rows in evals.items():
            index.add(split, [shape.render(p) for p in rows])
        return [index.hits(shape.render(p)) is not None for p in train]

    return run


def measure(rule, shapes: list[str], seed: int) -> list[dict]:
    out = []
    for name in shapes:
        rng = random.Random(seed)
        shape = SHAPES[name](rng)
        evals, train, kinds = plant(shape, rng)
        t0 = time.perf_counter()
        removed = rule(shape, evals, train)
        seconds = time.perf_counter() - t0
        row = {"shape": name, "what": shape.what, "natural": kinds.count("natural"), "seconds": seconds,
               "natural_removed": sum(r for r, k in zip(removed, kinds, strict=True) if k == "natural"),
               "clean": sum(k is None for k in kinds),
               "false": sum(r for r, k in zip(removed, kinds, strict=True) if k is None)}
        for kind in KINDS:
            planted = [r for r, k in zip(removed, kinds, strict=True) if k == kind]
            row[kind] = (sum(planted), len(planted))
        out.append(row)
    return out


def table(rows: list[dict]) -> str:
    kinds = KINDS
    lines = ["| shape | " + " | ".join(f"recall: {k}" for k in kinds) + " | recall, all | clean rows removed "
             "| precision | natural overlaps removed | seconds |",
             "|---|" + "---|" * (len(kinds) + 5)]
    for r in rows:
        got = sum(r[k][0] for k in kinds)
        planted = sum(r[k][1] for k in kinds)
        cells = [f"{r[k][0]}/{r[k][1]}" if r[k][1] else "n/a" for k in kinds]
        precision = got / (got + r["false"]) if got + r["false"] else 1.0
        lines.append(f"| {r['shape']} | " + " | ".join(cells) + f" | {got / planted:.1%} | {r['false']}/{r['clean']} "
                     f"({r['false'] / r['clean']:.2%}) | {precision:.1%} | {r['natural_removed']}/{r['natural']} "
                     f"| {r['seconds']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="decontaminate settings, e.g. ngram=13")
    parser.add_argument("--before", action="store_true", help="also measure the rule of commit 8464ad6")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    settings = Decontaminate(op="decontaminate", **dict(kv.split("=", 1) for kv in args.set))
    shapes = args.shapes.split(",")
    text = [f"`python benchmarks/decontamination.py {' '.join(sys.argv[1:])}`", "",
            f"Settings: {settings.model_dump(exclude={'op'})}; seed {args.seed}; {EVAL} validation + {EVAL} test "
            f"rows, {PER_KIND} leaks of each kind (half from each split).", "",
            table(measure(current_rule(settings), shapes, args.seed))]
    if args.before:
        text += ["", "The rule of commit 8464ad6 (rendered prompt, 8-gram, datasketch MinHash 0.8):", "",
                 table(measure(before_rule(), shapes, args.seed))]
    print("\n".join(text))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
