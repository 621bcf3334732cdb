"""The path of one campaign command through the code, from the command to the search loop, counted.

    python benchmarks/trace_command.py tune examples/tiny-campaign.yaml
    python benchmarks/trace_command.py finetune FILE [--depth 3] [--src OTHER_CHECKOUT/src]

Runs the real command under ``sys.setprofile`` until it enters ``engine/loop.py: run_search`` (the
loop is not run: ``Search`` is replaced by a stop), and writes down where control is at each call
and return between two files of ``src/recipetune``: a *stay* is one uninterrupted visit to a file,
a *return* a stay in a file already left, a *climb* a step into a file of a higher layer than the
one just left (tests/test_architecture.py: LAYERS; returning from a call down is a climb too, as a
reader follows it back). A function is followed the first time it is called, as a reader reads it
once (``--every-call``: each time). Module code run by an import is left out; ``--depth N`` keeps
the calls at most N files below the command (1: what the command calls itself), and the loop. ``--src`` traces another
checkout's code (an older commit: ``git archive REV src | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


class Reached(BaseException):
    """The command got to the search loop (a BaseException: no command's error handling takes it)."""


def layer_of(rel: str) -> int:
    sys.path.insert(0, str(ROOT / "tests"))
    from test_architecture import LAYER_OF

    unit = rel.split("/")[0].removesuffix(".py")
    return LAYER_OF.get(unit, LAYER_OF["core"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=("tune", "finetune"))
    ap.add_argument("file", type=Path)
    ap.add_argument("overrides", nargs="*")
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--every-call", action="store_true", help="follow a function each time it is called")
    ap.add_argument("--src", type=Path, default=ROOT / "src")
    args = ap.parse_args()
    sys.path.insert(0, str(args.src.resolve()))
    pkg = (args.src / "recipetune").resolve()
    loop = importlib.import_module("recipetune.engine.loop")
    cli = importlib.import_module("recipetune.cli")

    def stop(*_: Any, **__: Any) -> None:
        raise Reached

    loop.Search = stop  # type: ignore[attr-defined]
    path: list[str] = []

    def where(frame: FrameType | None) -> tuple[str | None, int]:
        """The recipetune file of ``frame`` and how many recipetune files deep it is; None inside an import."""
        depth, here, last, f = 0, None, None, frame
        while f is not None:
            name = f.f_code.co_filename
            if "importlib" in name or (f.f_code.co_name == "<module>" and name.startswith(str(pkg))):
                return None, 0
            if name.startswith(str(pkg)):
                rel = str(Path(name).relative_to(pkg))
                if rel != last:  # one more file between here and the command
                    depth, last = depth + 1, rel
                here = here or rel
            f = f.f_back
        return here, depth

    read: set[Any] = set()  # the functions entered once already: a reader reads a function once
    skipped: list[FrameType] = []  # a function entered again, and everything it calls, until it returns

    def profile(frame: FrameType, event: str, _: Any) -> None:
        if event not in ("call", "return") or (skipped and event == "call"):
            return
        if skipped:  # a return: the skipped call is over when its own frame returns
            if frame is skipped[-1]:
                skipped.pop()
            return
        here, depth = where(frame if event == "call" else frame.f_back)
        if here is None or (args.depth is not None and depth > args.depth and here != "engine/loop.py"):
            return
        if event == "call" and frame.f_code.co_filename.startswith(str(pkg)):
            if frame.f_code in read and not args.every_call:
                skipped.append(frame)
                return
            read.add(frame.f_code)
        if not path or path[-1] != here:
            path.append(here)

    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(profile)
        try:
            cli.app([args.command, str(args.file), *args.overrides, "--out", str(Path(tmp) / "c")],
                    standalone_mode=False)
        except Reached:
            pass
        finally:
            sys.setprofile(None)
    if "engine/loop.py" not in path:
        raise SystemExit(f"the command did not reach engine/loop.py: run_search; it went {' -> '.join(path)}")
    path = path[:path.index("engine/loop.py") + 1]
    left: set[str] = set()
    returns = climbs = 0
    for prev, cur in zip(path, path[1:], strict=False):
        left.add(prev)
        returns += cur in left
        climbs += layer_of(cur) > layer_of(prev)
    print(" -> ".join(path))
    print(f"{len(path)} stays in {len(set(path))} files, {returns} returns, {climbs} climbs")


if __name__ == "__main__":
    main()
