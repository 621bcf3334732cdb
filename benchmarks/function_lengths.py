"""How long the functions of ``src/recipetune`` are: the counts over 50 and over 80 lines, and the list over 80.

    python benchmarks/function_lengths.py [--src OTHER_CHECKOUT/src] [--over 50]

A function's length is its lines from ``def`` (decorators left out) to its last line, docstring,
comments and blank lines included: what a reader scrolls through. A nested function counts inside
its outer one and on its own too (a nested function of 60 lines inside one of 90 is two rows).
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def lengths(src: Path) -> list[tuple[int, str]]:
    """(length, "file: Class.function") for every function under ``src/recipetune``, longest first."""
    pkg = src / "recipetune"
    rows: list[tuple[int, str]] = []

    def walk(node: ast.AST, rel: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                rows.append(((child.end_lineno or child.lineno) - child.lineno + 1, f"{rel}: {name}"))
                walk(child, rel, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                walk(child, rel, f"{prefix}{child.name}.")
            else:
                walk(child, rel, prefix)

    for path in sorted(pkg.rglob("*.py")):
        walk(ast.parse(path.read_text(), str(path)), path.relative_to(pkg).as_posix(), "")
    return sorted(rows, key=lambda r: (-r[0], r[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    ap.add_argument("--over", type=int, default=80, help="list the functions longer than this")
    args = ap.parse_args()
    rows = lengths(args.src)
    over50 = sum(n > 50 for n, _ in rows)
    over80 = sum(n > 80 for n, _ in rows)
    print(f"{len(rows)} functions; {over50} over 50 lines, {over80} over 80")
    for n, name in rows:
        if n > args.over:
            print(f"{n:4d}  {name}")


if __name__ == "__main__":
    main()
