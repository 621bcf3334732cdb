"""Where the seconds before training go in `recipetune ft run examples/ft-arith.yaml` (run in the checkout,
with RECIPETUNE_CACHE set; benchmarks/first_experiment.sh runs it after the cold and the warm run)."""

from __future__ import annotations

import importlib
import time
from pathlib import Path


def timed(what: str, seconds: dict[str, tuple[float, float]], fn, *args):  # type: ignore[no-untyped-def]
    """``fn(*args)``, its wall and CPU seconds kept under ``what`` (CPU: what a busy machine does not inflate)."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn(*args)
    seconds[what] = (time.perf_counter() - t0, time.process_time() - c0)
    return out


def main() -> None:
    s: dict[str, tuple[float, float]] = {}
    timed("import the CLI", s, importlib.import_module, "recipetune.finetune.cli")
    timed("import the experiment", s, importlib.import_module, "recipetune.finetune.experiment")
    timed("import the reference route (torch, peft)", s, importlib.import_module, "recipetune.finetune.reference")
    from recipetune.finetune.base_model import shipped_refusal, stdlib_fingerprint
    from recipetune.finetune.experiment import load_experiment
    from recipetune.finetune.reference import ReferenceRoute

    fingerprint = timed("stdlib corpus fingerprint", s, stdlib_fingerprint)
    exp = timed("load the experiment (task files, splits)", s, load_experiment, Path("examples/ft-arith.yaml"))
    why = timed("shipped base check (sha256; fingerprint known)", s, shipped_refusal, exp.spec.model)
    route = timed("load the model", s, ReferenceRoute, exp.spec.model, exp.base_dir, exp.spec.recipe)
    rows = exp.splits.train
    timed(f"tokenise {len(rows)} training rows", s, lambda: [
        route.encode(r["question"], r["answer"] + "\n", 32, True) for r in rows])
    print("  wall s     CPU s")
    for what, (wall, cpu) in s.items():
        print(f"{wall:8.3f}  {cpu:8.3f}  {what}")
    print(f"stdlib corpus {fingerprint}; shipped base: {why or 'used'}")


if __name__ == "__main__":
    main()
