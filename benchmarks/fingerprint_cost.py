"""What a command workload's fingerprint costs on a trainer folder of N files (workloads/fingerprint.py).

    python benchmarks/fingerprint_cost.py [--code 1000] [--data 10000] [--big-gb 0]

Builds a folder with ``--code`` Python files of 4 KiB (hashed by content), ``--data`` files of 4 KiB
under ``data/`` and one sparse file of ``--big-gb`` GiB (by size and modification time: never read),
then times the fingerprint twice: the first asks the trainer's interpreter for its packages (a
subprocess, once per process), the second has that answer cached.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from recipetune.workloads.command import CommandSpec, CommandWorkload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=int, default=1000)
    ap.add_argument("--data", type=int, default=10000)
    ap.add_argument("--big-gb", type=float, default=0.0)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="fingerprint-"))
    (root / "data").mkdir()
    for k in range(args.code):
        folder = root / f"pkg{k % 20}"
        folder.mkdir(exist_ok=True)
        (folder / f"m{k}.py").write_text(f"# module {k}\n" + "x = 1\n" * 680)
    for k in range(args.data):
        (root / "data" / f"shard{k}.bin").write_bytes(b"\0" * 4096)
    if args.big_gb:
        with (root / "data" / "corpus.bin").open("wb") as f:
            f.truncate(int(args.big_gb * 2**30))  # sparse: its size is all the fingerprint reads
    (root / "train.py").write_text("print('hello')\n")
    wl = CommandWorkload(CommandSpec.model_validate({"argv": ["{python}", "train.py"]}), root)
    for label in ("first (asks the interpreter for its packages)", "again (packages cached)"):
        t0 = time.perf_counter()
        manifest = wl.code_manifest()
        print(f"{label}: {time.perf_counter() - t0:.2f} s for {len(manifest)} entries "
              f"({sum(k.startswith('code:') for k in manifest)} code files hashed, "
              f"{sum(k.startswith('data:') for k in manifest)} data files by size and time, "
              f"{sum(k.startswith('package:') for k in manifest)} packages)")


if __name__ == "__main__":
    main()
