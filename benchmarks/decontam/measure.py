"""The measurement: plant the leaks in a shape's rows, run a rule over the training rows, count
what it removed per leak kind against the clean rows it must keep, and write the table
(``benchmarks/decontamination.py`` says what each column means).
"""

from __future__ import annotations

import importlib.util
import random
import re
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

try:
    from recipetune.data.decontam import ContaminationIndex
except ImportError:  # the rule before issue 46 kept it in data/text.py
    from recipetune.data.text import ContaminationIndex
from recipetune.data.ops import Decontaminate
from recipetune.data.text import normalize

from .base import EVAL, KINDS, NAME_OR_NUMBER, PER_KIND, TOKEN, Parts, Shape
from .registry import REGISTRY

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
        shape = REGISTRY[name].make(rng)
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
        if explain and not REGISTRY[name].held_out:  # a held-out shape is never explained
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
