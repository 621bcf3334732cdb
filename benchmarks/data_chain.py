"""The data chain at scale: rows/s and peak memory per operator, before and after (issue 19).

    nice -n 5 .venv/bin/python benchmarks/data_chain.py --rows 10000 100000 1000000
    # the code before, from a worktree of it:
    git worktree add /work/scratch/before 8464ad6
    PYTHONPATH=/work/scratch/before/src nice -n 5 .venv/bin/python benchmarks/data_chain.py \\
        --label before --rows 10000 100000

For each size, N instruction rows are generated once (``instruction``/``input``/``output``: a
handful of fixed instructions, inputs of 60-200 characters from a random vocabulary, 2% exact
duplicates with case and spacing changed, 2% near duplicates with one word changed, 0.2% copies
of a validation or test input), with 1,000 validation and 1,000 test rows, under ``--data``. Each
run is a fresh process (``--one``) with an empty cache, running the chain ``dedup_exact,
dedup_near (0.9), filter_length, decontaminate (ngram 13)``. A sampler thread reads the RSS of the
process and its workers (psutil) every 20 ms; a wrapper round the chain's ``apply`` marks each
operator's start and end, so every operator gets its seconds, rows/s and the peak RSS seen while it
ran. ``ru_maxrss`` (RUSAGE_SELF, RUSAGE_CHILDREN) gives the high-water marks of the whole run.
Results go to stdout as a markdown table and, with ``--json``, to a file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

INSTRUCTIONS = [
    "Summarise the following text in one sentence.",
    "Translate the following sentence into French.",
    "Classify the sentiment of the following review as positive or negative.",
    "Extract the names of all people mentioned in the text.",
    "Rewrite the following text in a formal tone.",
    "Give a title for the following paragraph.",
    "List the main keywords of the following text.",
    "Answer the question using the text below.",
]
CHAIN = [{"op": "dedup_exact"}, {"op": "dedup_near", "threshold": 0.9}, {"op": "filter_length", "max_chars": 4000},
         {"op": "decontaminate", "ngram": 13}]
N_EVAL = 1000


def vocabulary(rng: random.Random, size: int = 5000) -> list[str]:
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "an", "or", "el", "is", "um", "ph", "st", "gr"]
    return sorted({"".join(rng.choice(syll) for _ in range(rng.randint(1, 4))) for _ in range(size)})


def sentence(rng: random.Random, words: list[str]) -> str:
    target = rng.randint(60, 200)
    out: list[str] = []
    while sum(len(w) + 1 for w in out) < target:
        out.append(rng.choice(words))
    text = " ".join(out)[:200].strip()
    return text[0].upper() + text[1:] + "."


def generate(folder: Path, n: int, seed: int = 0) -> dict[str, Path]:
    """The N training rows and the evaluation files (written once per size and seed)."""
    folder = folder / f"rows-{n}-seed{seed}"
    paths = {s: folder / f"{s}.jsonl" for s in ("train", "validation", "test")}
    if all(p.is_file() for p in paths.values()):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words = vocabulary(rng)
    row = lambda: {"instruction": rng.choice(INSTRUCTIONS), "input": sentence(rng, words),  # noqa: E731
                   "output": sentence(rng, words)[:80]}
    evals = {s: [row() for _ in range(N_EVAL)] for s in ("validation", "test")}
    train: list[dict] = []
    for i in range(n):
        u = rng.random()
        if train and u < 0.02:  # an exact duplicate, case and spacing changed
            r = dict(train[rng.randrange(len(train))])
            r["input"] = r["input"].upper().replace(" ", "  ", 1)
        elif train and u < 0.04:  # a near duplicate: one word changed
            r = dict(train[rng.randrange(len(train))])
            w = r["input"].split(" ")
            w[rng.randrange(len(w))] = rng.choice(words)
            r["input"] = " ".join(w)
        elif u < 0.042:  # a copy of a validation or test input
            r = dict(rng.choice(evals[rng.choice(("validation", "test"))]))
            r["output"] = "leaked"
        else:
            r = row()
        r["id"] = i
        train.append(r)
    for split, rows in (("train", train), *evals.items()):
        tmp = paths[split].with_suffix(".tmp")
        with tmp.open("w") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
        os.replace(tmp, paths[split])
    return paths


class Sampler(threading.Thread):
    """The memory of this process and its workers every ``period`` seconds; ``peak`` since the last
    reset. Forked workers share the parent's pages, so their RSS counted twice would overstate the
    total: each process counts its proportional share (PSS, Linux), or its RSS where PSS is unknown."""

    def __init__(self, period: float = 0.05):
        super().__init__(daemon=True)
        import psutil

        self.proc, self.period, self.peak, self.stop = psutil.Process(), period, 0, False
        self.highest = 0  # over the whole run

    @staticmethod
    def _mem(proc) -> int:
        try:
            return proc.memory_full_info().pss
        except (AttributeError, OSError, Exception):  # psutil.AccessDenied, no PSS on this system
            return proc.memory_info().rss

    def rss(self) -> int:
        import psutil

        total = self._mem(self.proc)
        for child in self.proc.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                total += self._mem(child)
        return total

    def run(self) -> None:
        while not self.stop:
            self.peak = max(self.peak, self.rss())
            self.highest = max(self.highest, self.peak)
            time.sleep(self.period)

    def reset(self) -> int:
        peak, self.peak = self.peak, self.rss()
        return max(peak, self.peak)


def cpu() -> float:
    """CPU seconds of this process and its finished workers (user + system)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def one(n: int, data: Path, label: str, workers: int | None) -> dict:
    """One measured run in this process (a fresh one per size: peaks are per run)."""
    from pydantic import TypeAdapter

    import recipetune.data.chain as chain_mod
    from recipetune.data import ops
    from recipetune.finetune.task import Splits, TaskConfig

    paths = generate(data, n)
    cache = Path(tempfile.mkdtemp(prefix="rt-bench-cache-", dir=data))
    os.environ["RECIPETUNE_CACHE"] = str(cache)
    sampler = Sampler()
    sampler.start()
    t0 = time.perf_counter()
    task = TaskConfig(prompt="{instruction}\n{input}\n", target="output",
                      files={s: str(p) for s, p in paths.items()})
    splits = Splits(task, paths)
    t_load = time.perf_counter() - t0
    load_peak = sampler.reset()
    adapter = TypeAdapter(ops.Operator)
    chain = [adapter.validate_python(op) for op in CHAIN]
    marks: list[dict] = []
    inner = chain_mod.apply

    def apply(op, rows, ctx):  # marks the operator's span, its CPU time and the peak memory inside it
        sampler.reset()
        t, c = time.perf_counter(), cpu()
        out = inner(op, rows, ctx)
        marks.append({"op": op.op, "seconds": time.perf_counter() - t, "cpu": cpu() - c, "peak_rss": sampler.reset()})
        return out

    chain_mod.apply = apply
    kwargs = {"workers": workers} if workers is not None else {}
    t1, c1 = time.perf_counter(), cpu()
    rows, version = chain_mod.run_chain(chain, splits, data, cache=cache / "data", **kwargs)
    t_chain, c_chain = time.perf_counter() - t1, cpu() - c1
    sampler.reset()
    chain_peak = max([sampler.highest, *(m["peak_rss"] for m in marks)])
    sampler.stop = True
    ops_out = []
    for st, mark in zip(version.operators, marks, strict=True):
        ops_out.append({"op": st.op, "rows_in": st.rows_in, "rows_out": st.rows_out, "removed": st.removed,
                        "seconds": st.seconds, "apply_seconds": round(mark["seconds"], 3),
                        "cpu_seconds": round(mark["cpu"], 2),
                        "rows_per_s": round(st.rows_in / max(st.seconds, 1e-9)), "peak_rss": mark["peak_rss"]})
    self_max = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    children_max = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    subprocess.run(["rm", "-rf", str(cache)], check=False)
    return {"label": label, "rows": n, "rows_out": len(rows), "load_seconds": round(t_load, 2),
            "load_peak_rss": load_peak, "chain_seconds": round(t_chain, 2),
            "chain_cpu_seconds": round(c_chain, 2), "chain_peak_rss": chain_peak,
            "ru_maxrss_self": self_max, "ru_maxrss_children": children_max, "operators": ops_out,
            "loadavg": os.getloadavg(), "cpus": os.cpu_count()}


def table(results: list[dict]) -> str:
    mb = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    peak = lambda r: mb(max(r["chain_peak_rss"], r["load_peak_rss"]))  # noqa: E731
    lines = ["| code | rows | operator | rows in | rows out | s | CPU s | rows/s | peak memory MB |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['rows']:,} | ({r['error']}) | | | | | | |")
            continue
        for o in r["operators"]:
            lines.append(f"| {r['label']} | {r['rows']:,} | {o['op']} | {o['rows_in']:,} | {o['rows_out']:,} | "
                         f"{o['seconds']:.2f} | {o.get('cpu_seconds', 0):.2f} | {o['rows_per_s']:,} | "
                         f"{mb(o['peak_rss'])} |")
        lines.append(f"| {r['label']} | {r['rows']:,} | **chain** (load {r['load_seconds']:.1f} s) | "
                     f"{r['rows']:,} | {r['rows_out']:,} | **{r['chain_seconds']:.2f}** | "
                     f"{r['chain_cpu_seconds']:.2f} | {round(r['rows'] / r['chain_seconds']):,} | **{peak(r)}** "
                     f"(max RSS self {mb(r['ru_maxrss_self'])}, workers {mb(r['ru_maxrss_children'])}) |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--label", default="after")
    parser.add_argument("--data", type=Path, default=Path("/work/scratch/data-chain-bench"))
    parser.add_argument("--workers", type=int, default=None, help="the chain's workers (default: its own)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per size before giving up")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tables", type=Path, nargs="+", default=None,
                        help="print one table of these --json files (before and after side by side), and exit")
    parser.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tables:
        results = [r for f in args.tables for r in json.loads(f.read_text())]
        print(table(sorted(results, key=lambda r: (r["rows"], r["label"] != "before"))))
        return
    args.data.mkdir(parents=True, exist_ok=True)
    if args.one is not None:
        print(json.dumps(one(args.one, args.data, args.label, args.workers)))
        return
    results = []
    for n in args.rows:
        generate(args.data, n)  # outside the measured process
        cmd = [sys.executable, __file__, "--one", str(n), "--label", args.label, "--data", str(args.data)]
        if args.workers is not None:
            cmd += ["--workers", str(args.workers)]
        before = os.getloadavg()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=os.environ)
        except subprocess.TimeoutExpired:
            results.append({"label": args.label, "rows": n, "error": f"over {args.timeout:.0f} s"})
            continue
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            results.append({"label": args.label, "rows": n, "error": f"exit {proc.returncode}"})
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        r["loadavg_before"] = before
        results.append(r)
        print(f"{args.label} {n:,}: chain {r['chain_seconds']:.1f} s, load {r['load_seconds']:.1f} s, "
              f"loadavg {before[0]:.2f} -> {r['loadavg'][0]:.2f}", file=sys.stderr)
    print(table(results))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
