"""`recipetune verify` of an equivalent with a seed knob the trainer reads, and with one it does not (a deaf knob).

tests/fixtures/seed_trainer.py as a command workload (the campaigns of tests/test_guard_seeds.py): 4 x 8 against
8 x 4 (the same global batch), the ``seed`` knob passed as ``--seed`` (honest: it picks half of each batch), in an
environment variable the trainer never reads (deaf: bit-identical repeats), and the same with 1e-6 relative
float noise on each gradient (deaf, float noise). One row per way: the decision, the parity test's pairs and
runs, its T and what T rests on, and the verdict's note on the seed.

    PYTHONPATH=src python benchmarks/seed_knobs.py --out /tmp/seed-knobs
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_guard_seeds import GUARD, HOW, workload_doc  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True, help="a folder for the campaign files and the verdicts")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print("| seed knob | decision | parity | pairs (seeds) | parity runs | T (what it rests on) | the seed note |\n"
          "|---|---|---|---|---|---|---|")
    for how in HOW:
        file = args.out / f"{how.replace(', ', '-').replace(' ', '-')}.yaml"
        file.write_text(yaml.safe_dump({"workload": workload_doc(how), "baseline": {"micro": 4, "accum": 8},
                                        "guard": GUARD}))
        res = subprocess.run([sys.executable, "-m", "recipetune", "verify", str(file), str(file), "micro=8", "accum=4",
                              "--out", str(args.out / f"out-{file.stem}"), "--json"], capture_output=True, text=True)
        doc = json.loads(res.stdout)
        p = doc["parity"]
        note = next((n for n in p["notes"] if "seed" in n), "")
        print(f"| {how} | {doc['decision']} (exit {res.returncode}) | {p['outcome']} | {p['seeds']} | "
              f"{doc['cost']['parity_runs']:g} | {p['tolerance']:.4f} ({p['reference_kind']}) | {note} |", flush=True)


if __name__ == "__main__":
    main()
