"""Collect what benchmarks/gpu_check.sh measured into benchmarks/results/gpu_check-<date>-<gpu>.{json,md}.

    python benchmarks/gpu_check_report.py runs/gpu_check-<time>

Reads the check's folder: pytest's junit XML, the hand-tuned run's result.json, run.json and profile.json, the
campaign's verdict.json and its winner's trial, each phase's wall seconds (<phase>.s), the layouts' figures
(layouts-moe.json, layouts-dense.json). Called after each phase, so the figures of a lease that ends early are
kept. Exits 1 when any phase failed or has not run (its figures are still written, marked as such).

Keys: today's (date, gpus, folder, exit_codes, pytest, run, tune, layouts; ``run`` is the hand-tuned run since
issue 43) and ``hand_tuned: {recipe, tokens_per_s, mfu, ...}``, ``tune: {decision, recipe, tokens_per_s, mfu,
device_s, trials, ...}``, ``seconds`` per phase, so runs on other days and devices compare.
"""

from __future__ import annotations

import contextlib
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


def seconds(folder: Path, phase: str) -> float | None:
    try:
        return float((folder / f"{phase}.s").read_text().strip())
    except (OSError, ValueError):
        return None


def recipe_text(recipe: dict, keys: tuple[str, ...] = ("attention", "optimizer_impl", "compile", "compile_mode",
                                                      "micro_batch_size", "dtype", "matmul_precision")) -> str:
    return " ".join(f"{k}={recipe[k]}" for k in keys if k in recipe)


def hand_tuned_figures(folder: Path) -> dict:
    """The hand-tuned run: its recipe, tokens/s, MFU, compile seconds and the profiled steps' breakdown."""
    try:
        result = RunResult.load(folder / "run" / "result.json")
    except (OSError, ValueError):
        return {}
    s = result.summary()
    out = {"recipe": recipe_text(result.recipe), "status": result.status,
           "tokens_per_s": round(s.tokens_per_s_per_device), "mfu": s.mfu, "compile_s": s.compile_s}
    with contextlib.suppress(OSError, ValueError):
        out["profile"] = json.loads((folder / "run" / "profile.json").read_text())
    with contextlib.suppress(OSError, ValueError):
        out["mfu_convention"] = json.loads((folder / "run" / "run.json").read_text()).get("mfu_convention")
    return out


def winner_result(folder: Path, recipe_id: str | None) -> RunResult | None:
    """The approved recipe's own screening trial in the campaign's folder (its steady tokens/s and MFU)."""
    for path in sorted((folder / "tune").rglob("result.json")):
        try:
            result = RunResult.load(path)
        except (OSError, ValueError):
            continue
        if result.recipe_id == recipe_id and result.ok:
            return result
    return None


def tune_figures(folder: Path) -> dict:
    try:
        v = json.loads((folder / "tune" / "verdict.json").read_text())
    except (OSError, ValueError):
        return {"device_s": seconds(folder, "tune")} if seconds(folder, "tune") is not None else {}
    verdict = v.get("verdict") or {}
    winner = winner_result(folder, v.get("recipe_id"))
    s = winner.summary() if winner else None
    return {"decision": v.get("decision"), "change": v.get("change"), "runs": v.get("runs"),
            "trials": v.get("trials"), "speedup": verdict.get("speedup"), "reasons": v.get("reasons", [])[:4],
            "recipe": recipe_text(v.get("recipe") or {}),
            "tokens_per_s": round(s.tokens_per_s_per_device) if s else None, "mfu": s.mfu if s else None,
            "device_s": seconds(folder, "tune")}


def moe_figures(folder: Path) -> dict:
    """benchmarks/moe_kernels.py's figures (the experts' loop, padded and segmented forms), as it wrote them."""
    path = folder / "moe-kernels.json"
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except json.JSONDecodeError:
        return {}


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


def profile_lines(profile: dict) -> list[str]:
    if not profile:
        return []
    return [f"  - profiled {profile.get('profiled_steps', 0):.0f} steps: GPU busy {profile.get('gpu_busy', 0):.0%}, "
            f"launch gaps {profile.get('launch_gap_share', 0):.0%}; kernel time: matmul "
            f"{profile.get('matmul_share', 0):.0%}, attention {profile.get('attention_share', 0):.0%}, optimizer "
            f"{profile.get('optimizer_share', 0):.0%}, other {profile.get('other_share', 0):.0%} of the step"]


def of_hand(tune: dict, run: dict) -> str:
    if tune.get("tokens_per_s") and run.get("tokens_per_s_per_device"):
        return f" ({tune['tokens_per_s'] / run['tokens_per_s_per_device']:.2f}x the hand-tuned)"
    return ""


def main(folder: Path) -> int:
    gpus = (folder / "gpus.txt").read_text().strip().splitlines() if (folder / "gpus.txt").exists() else []
    codes = {p: rc(folder, p) for p in ("pytest", "run", "tune", "layouts", "moe")}
    figures = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "gpus": gpus, "folder": str(folder),
        "exit_codes": codes, "pytest": pytest_counts(folder), "run": run_figures(folder), "tune": tune_figures(folder),
        "layouts": layout_figures(folder), "hand_tuned": hand_tuned_figures(folder), "moe_kernels": moe_figures(folder),
        "seconds": {p: seconds(folder, p) for p in codes},
    }
    # one name from the first phase on (nvidia-smi -L: "GPU 0: NVIDIA H200 (UUID: ...)"), so each phase's
    # figures overwrite the same files
    listed = re.match(r"GPU \d+: (.*?) \(UUID", gpus[0]) if gpus else None
    name = listed.group(1) if listed else figures["run"].get("device_name") or (gpus[0] if gpus else "gpu")
    gpu = re.sub(r"[^A-Za-z0-9]+", "-", name)
    stem = f"gpu_check-{figures['date']}-{gpu.strip('-')[:40]}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{stem}.json").write_text(json.dumps(figures, indent=2) + "\n")
    r, t, p, h = figures["run"], figures["tune"], figures["pytest"], figures["hand_tuned"]
    mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a (GPU not in measure.GPU_PEAKS)"
    lines = [
        f"GPU check of {figures['date']} on {', '.join(gpus) or 'unknown GPU'} (`bash benchmarks/gpu_check.sh`)",
        "",
        f"- pytest -m gpu: {p.get('passed', '?')} passed, {p.get('failures', '?')} failed, "
        f"{p.get('skipped', '?')} skipped (exit {codes['pytest']})",
        f"- hand-tuned run gpt2-124m ({h.get('recipe', '?')}; {r.get('params', '?')} params): "
        f"{r.get('tokens_per_s', '?')} tokens/s, MFU {mfu} (goal 40%), "
        f"step {1000 * r.get('mean_step_time_s', 0):.0f} ms, "
        f"compile {h.get('compile_s', 0) or 0:.0f} s, peak memory {r.get('peak_mem_gib', 0):.1f} GiB, "
        f"loss {r.get('loss_first')} -> {r.get('loss_last')} (exit {codes['run']})",
        *profile_lines(h.get("profile") or {}),
        f"- recipetune tune from the plain recipe: {t.get('decision', '?')} {t.get('change', '')}, speed-up "
        f"{t.get('speedup')}, {t.get('tokens_per_s')} tokens/s{of_hand(t, r)}, after {t.get('trials', '?')} trials and "
        f"{t.get('runs', '?')} runs in {t.get('device_s')} s of GPU time (goal: >= 0.9x hand-tuned within 480 s) "
        f"(exit {codes['tune']})",
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
    lines += [f"- moe kernels {k['dtype']}, imbalance {k['imbalance']:g}, {k['impl']}: {k['ms']:.2f} ms, error vs loop "
              f"{k['max_rel_error_vs_loop']:.1e}" for k in figures["moe_kernels"].get("kernels", [])]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"written: {RESULTS / stem}.json, .md")
    return 0 if all(c == 0 for c in codes.values()) else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_dir():
        sys.exit("usage: python benchmarks/gpu_check_report.py RUNS/GPU_CHECK_FOLDER")
    sys.exit(main(Path(sys.argv[1])))
