"""The decontamination benchmark's generated rows and planted leaks, hashed: a refactor of the
generators must leave every hash as it was.

    python benchmarks/decontamination_hashes.py --out benchmarks/results/decontamination-hashes.json
    python benchmarks/decontamination_hashes.py --check benchmarks/results/decontamination-hashes.json

For every shape and seed (0 and 1 unless ``--seeds``), as the benchmark draws them: the shape's
generator called with ``random.Random(seed)``, then the leaks planted with that same generator. The
dump hashed per shape and seed: the shape's name and description, every row with its rendered prompt,
its content and its type, then the evaluation rows by split and every training row with its kind
(planted leak, natural overlap, near or clean). The rows come from this machine's standard library:
the hashes hold for one Python installation.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path

from decontam.measure import plant
from decontam.registry import REGISTRY


def dump(name: str, seed: int) -> str:
    rng = random.Random(seed)
    shape = REGISTRY[name].make(rng)
    evals, train, kinds = plant(shape, rng)
    rows = [[p, shape.render(p), shape.content(p), shape.types.get(p[-1])] for p in shape.rows]
    return json.dumps({"name": shape.name, "what": shape.what, "rows": rows, "evals": evals,
                       "train": [[p, k] for p, k in zip(train, kinds, strict=True)]}, ensure_ascii=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--shapes", default=",".join(REGISTRY))
    parser.add_argument("--out", type=Path, help="write the hashes here (JSON)")
    parser.add_argument("--check", type=Path, help="compare with these hashes; exit 1 on any difference")
    args = parser.parse_args()
    hashes = {f"{name} / seed {seed}": hashlib.sha256(dump(name, int(seed)).encode()).hexdigest()
              for name in args.shapes.split(",") for seed in args.seeds.split(",")}
    hashes["all"] = hashlib.sha256(json.dumps(hashes, sort_keys=True).encode()).hexdigest()
    for key, value in hashes.items():
        print(f"{value}  {key}")
    if args.out:
        args.out.write_text(json.dumps(hashes, indent=1) + "\n")
    if args.check:
        want = json.loads(args.check.read_text())
        differ = sorted(k for k in want.keys() | hashes.keys() if want.get(k) != hashes.get(k))
        print(f"{len(differ)} of {len(want)} differ" + (f": {', '.join(differ)}" if differ else ""))
        sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
