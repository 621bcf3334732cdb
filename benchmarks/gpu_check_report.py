"""Collect what benchmarks/gpu_check.sh measured into benchmarks/results/gpu_check-<date>-<gpu>.{json,md}.

    python benchmarks/gpu_check_report.py runs/gpu_check-<time>

Reads the check's folder: pytest's junit XML, the measured run's result.json, the campaign's
verdict.json, the layouts' figures (layouts-moe.json, layouts-dense.json). Exits 1 when any phase failed
(its figures are still written, marked as such).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from recipetune.core.measure import RunResult

RESULTS = Path(os.environ.get("GPU_CHECK_RESULTS", Path(__file__).resolve().parent / "results"))


def rc(folder: Path, phase: str) -> int | None:
    try:
        return int((folder / f"{phase}.rc").read_text().strip())
    except (OSError, ValueError):
        return None


def pytest_counts(folder: Path) -> dict[str, int]:
    try:
        suite = ET.parse(folder / "pytest.xml").getroot()
    except (OSError, ET.ParseError):
        return {}
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def run_figures(folder: Path) -> dict:
    try:
        result = RunResult.load(folder / "run" / "result.json")
    except (OSError, ValueError):
        return {}
    s = result.summary()
    info = json.loads((folder / "run" / "run.json").read_text()) if (folder / "run" / "run.json").exists() else {}
    return {
        "status": result.status, "cause": result.cause, "recipe_id": result.recipe_id,
        "device_name": info.get("device_name"), "params": info.get("params"),
        "tokens_per_s": round(s.tokens_per_s), "tokens_per_s_per_device": round(s.tokens_per_s_per_device),
        "mfu": s.mfu, "peak_flops_per_device": result.peak_flops_per_device,
        "mean_step_time_s": s.mean_step_time_s, "peak_mem_gib": (s.peak_mem_bytes or 0) / 2**30,
        "loss_first": s.loss_first, "loss_last": s.loss_last, "measured_steps": s.measured_steps,
    }


def tune_figures(folder: Path) -> dict:
    try:
        v = json.loads((folder / "tune" / "verdict.json").read_text())
    except (OSError, ValueError):
        return {}
    verdict = v.get("verdict") or {}
    return {"decision": v.get("decision"), "change": v.get("change"), "runs": v.get("runs"),
            "trials": v.get("trials"), "speedup": verdict.get("speedup"), "reasons": v.get("reasons", [])[:4]}


def layout_figures(folder: Path) -> dict:
    """Per preset and layout: tokens/s, peak memory, the profile; and the layouts left out (too few GPUs)."""
    out: dict = {}
    for suite in ("moe", "dense"):
        try:
            data = json.loads((folder / f"layouts-{suite}.json").read_text())
        except (OSError, ValueError):
            continue
        for preset, layouts in data.get("figures", {}).items():
            out[preset] = {name: {k: v for k, v in fig.items() if k != "losses"} for name, fig in layouts.items()}
        out.setdefault("left_out", []).extend(data.get("skipped", []))
    return out


def main(folder: Path) -> int:
    gpus = (folder / "gpus.txt").read_text().strip().splitlines() if (folder / "gpus.txt").exists() else []
    codes = {p: rc(folder, p) for p in ("pytest", "run", "tune", "layouts")}
    figures = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "gpus": gpus, "folder": str(folder),
        "exit_codes": codes, "pytest": pytest_counts(folder), "run": run_figures(folder), "tune": tune_figures(folder),
        "layouts": layout_figures(folder),
    }
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", (figures["run"].get("device_name") or (gpus[0] if gpus else "gpu")))
    stem = f"gpu_check-{figures['date']}-{gpu.strip('-')[:40]}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(figures, indent=2) + "\n")
    r, t, p = figures["run"], figures["tune"], figures["pytest"]
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a (GPU not in measure.GPU_PEAK_FLOPS)"
    lines = [
        f"GPU check of {figures['date']} on {', '.join(gpus) or 'unknown GPU'} (`bash benchmarks/gpu_check.sh`)",
        "",
        f"- pytest -m gpu: {p.get('passed', '?')} passed, {p.get('failures', '?')} failed, "
        f"{p.get('skipped', '?')} skipped (exit {codes['pytest']})",
        f"- recipetune run gpt2-124m bf16 ({r.get('params', '?')} params): {r.get('tokens_per_s', '?')} tokens/s, "
        f"MFU {mfu}, step {1000 * r.get('mean_step_time_s', 0):.0f} ms, "
        f"peak memory {r.get('peak_mem_gib', 0):.1f} GiB, "
        f"loss {r.get('loss_first')} -> {r.get('loss_last')} (exit {codes['run']})",
        f"- recipetune tune: {t.get('decision', '?')} {t.get('change', '')} speed-up {t.get('speedup')} "
        f"after {t.get('runs', '?')} runs (exit {codes['tune']})",
    ]
    for preset, layouts in figures["layouts"].items():
        if preset == "left_out":
            continue
        for name, fig in layouts.items():
            prof = fig.get("profile", {})
            step = prof.get("step_time_s") or 1.0
            extra = "".join([
                f", all-to-all {prof['a2a_s'] / step:.0%} of the step" if "a2a_s" in prof else "",
                f", pipeline bubble {prof['pp_bubble']:.0%}" if "pp_bubble" in prof else "",
                f", expert imbalance {prof['expert_imbalance']:.2f}" if "expert_imbalance" in prof else ""])
            lines.append(f"- layouts {preset}, {name}: {fig['tokens_per_s']:,.0f} tokens/s, "
                         f"peak memory {fig['peak_mem_mib'] / 1024:.1f} GiB{extra}")
    lines += [f"- layout left out: {x}" for x in figures["layouts"].get("left_out", [])]
    if codes["layouts"] is not None:
        lines.append(f"- layouts phase exit {codes['layouts']}")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {RESULTS / stem}.json, .md")
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/gpu_check_report.py RUNS/GPU_CHECK_FOLDER")
    sys.exit(main(Path(sys.argv[1])))
