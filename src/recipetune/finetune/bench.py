"""The small benchmark: three tasks generated on every machine, nothing downloaded.

- ``arith``: multi-digit addition ``347+589=`` -> ``936`` (generated; exact match);
- ``stdlib-module``: which standard-library module a function's docstring comes from
  (classification over the 8 modules with most docstrings; accuracy and macro-F1);
- ``funcname``: a function's name from its docstring (generation; exact match and ROUGE-L).

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
import shutil
import sys
import sysconfig
from collections import Counter
from pathlib import Path

from recipetune.trainer.data import STDLIB_SKIP_DIRS, _walk_files

VERSION = "1"
EVAL_SIZE = 200  # validation and test rows per task


def _split_of(text: str) -> str:
    h = int(hashlib.sha256(text.encode()).hexdigest()[:8], 16) % 10
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
    for path in _walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
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


GENERATORS = {"arith": arith_rows, "stdlib-module": module_rows, "funcname": funcname_rows}


def builtin_files(name: str, cache: Path | None = None) -> dict[str, Path]:
    """Generate (once) and return the task's split files."""
    from recipetune.measure import cache_dir

    v = sys.version_info
    where = hashlib.sha256(sysconfig.get_paths()["stdlib"].encode()).hexdigest()[:8]
    folder = (cache or cache_dir()) / "tasks" / f"{name}-v{VERSION}-py{v.major}.{v.minor}.{v.micro}-{where}"
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
