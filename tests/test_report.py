"""`recipetune report` and `recipetune show` on synthetic campaigns written through the real store."""

from __future__ import annotations

import base64
import html
import json
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from PIL import Image
from rich.console import Console
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import CampaignConfig
from recipetune.core.files import parse_override
from recipetune.core.measure import RunResult, StepRecord
from recipetune.report.browser import chromium, console_messages, find_chromium
from recipetune.report.build import load_report
from recipetune.report.html import render
from recipetune.report.model import NO_VERDICT, Evidence
from recipetune.report.plots import loss_plot, speed_plot
from recipetune.report.speed import headline, override, tokens_per_s_interval
from recipetune.report.terminal import render as render_terminal

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))
from make_campaign import HOSTILE, make_campaign  # noqa: E402

runner = CliRunner()
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("campaigns")
    return {kind: make_campaign(root / kind, kind) for kind in ("approved", "keep", "crashed")}


def written(folder: Path) -> Path:
    """Where the report of ``folder`` was written: by default inside it; the KEEP one with --out."""
    return folder.parent / "out" / "keep.html" if folder.name == "keep" else folder / "report.html"


@pytest.fixture(scope="module")
def pages(campaigns) -> dict[str, str]:
    """Each campaign's report, written by the CLI."""
    out = {}
    for kind, folder in campaigns.items():
        extra = ["--out", str(written(folder))] if kind == "keep" else []
        res = runner.invoke(app, ["report", str(folder), *extra])
        assert res.exit_code == 0, res.output
        out[kind] = written(folder).read_text()
    return out


def report_data(folder: Path) -> dict:
    return json.loads(written(folder).with_suffix(".json").read_text())


def images(page: str) -> list[bytes]:
    return [base64.b64decode(m) for m in re.findall(r'<img [^>]*src="data:image/png;base64,([^"]+)"', page)]


def csp(page: str) -> str:
    return html.unescape(re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1))


def terminal_text(folder: Path) -> str:
    console = Console(record=True, width=220, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(render_terminal(load_report(folder), console.width))
    return console.export_text()


def test_approved_report_leads_with_the_verdict_and_its_evidence(campaigns, pages):
    page, folder = pages["approved"], campaigns["approved"]
    verdict = json.loads((folder / "verdict.json").read_text())
    v = verdict["verdict"]
    head = page[: page.index("The evidence")]  # what a reader sees first
    assert "APPROVED" in head
    assert f"{v['speedup']:.3f}x" in head
    assert f"{v['ci_low']:.3f}" in head and f"{v['ci_high']:.3f}" in head
    assert "±3.0%" in head and "CI clears it" in head
    assert f"{v['parity']['mean_diff']:+.4f}" in head and f"{v['parity']['tolerance']:.4f}" in head
    assert "(same batches)" in head and f"detectable {v['parity']['detectable']:.4f}" in head
    # The approved recipe's changes against the baseline, knob by knob.
    diff = head[head.index("The approved recipe"):]
    assert "micro_batch_size" in diff and "optimizer_impl" in diff and "foreach" in diff
    # Plots: finalists vs noise, loss curves, throughput per trial, the tree, the step-time breakdown.
    pngs = images(page)
    assert len(pngs) == 5
    assert all(p.startswith(PNG) and len(p) > 10_000 for p in pngs)
    # Self-contained: nothing is fetched when the page opens.
    assert not re.findall(r'(?:src|href)="(?!data:)', page)
    assert csp(page).startswith("default-src 'none'; img-src data:;")
    # Reproduce: the baseline and the approved recipe from the same campaign file, for a trial's steps.
    base_cmd = f"recipetune run {folder.parent / 'approved.yaml'}"
    assert f"{base_cmd} --steps 30" in page
    assert f"{base_cmd} micro_batch_size=16 optimizer_impl=foreach --steps 30" in page
    assert f"recipetune run {folder / 'approved.yaml'}" in page
    assert "torch" in page and "2.13.0+cpu" in page and "AMD EPYC 7B13" in page


def test_report_json_holds_the_same_story(campaigns, pages):
    folder = campaigns["approved"]
    data = report_data(folder)
    verdict = json.loads((folder / "verdict.json").read_text())
    assert data["decision"] == "APPROVED"
    assert data["winner"]["number"] == verdict["trial"]
    assert data["evidence"]["speedup"] == verdict["verdict"]["speedup"]
    assert len(data["trials"]) == 10 and data["counts"]["failed"] == 1 and data["counts"]["passed"] == 7
    # The path to the winner: the winner and each ancestor up to the baseline, and nothing else.
    on_path = sorted(t["number"] for t in data["trials"] if t["on_path"])
    assert on_path == [0, 3, 5]
    finals = {t["number"]: t["final"] for t in data["trials"] if t["final"]}
    assert finals == {5: "APPROVED", 7: "APPROVED", 3: "APPROVED"}
    roles = [c["role"] for c in data["curves"]]
    assert roles.count("baseline") == 3 and roles.count("approved") == 1 and roles.count("finalist") == 2
    for t in data["trials"]:
        if t["tokens_per_s_ci"]:
            lo, hi = t["tokens_per_s_ci"]
            assert lo < t["tokens_per_s"] < hi
    assert data["commands"]["approved"][0].endswith("micro_batch_size=16 optimizer_impl=foreach --steps 30")


def test_keep_baseline_report_says_why(pages, campaigns):
    page = pages["keep"]
    head = page[: page.index("The evidence")]
    assert "KEEP BASELINE" in head
    assert "The baseline stays" in head and "not clear of the 3.0% noise margin" in head
    assert "CI reaches into it" in head
    assert "The approved recipe" not in page
    assert "<h3>The approved recipe</h3>" not in page and "<h3>The baseline</h3>" in page
    assert len(images(page)) == 5
    data = report_data(campaigns["keep"])
    assert not (campaigns["keep"] / "report.html").exists()  # --out put it elsewhere
    assert data["winner"] is None and "approved" not in data["commands"]
    assert {t["final"] for t in data["trials"] if t["final"]} == {"KEEP BASELINE"}


def test_crashed_trials_read_with_their_causes(pages, campaigns):
    page = pages["crashed"]
    data = report_data(campaigns["crashed"])
    by_run = {t["run_status"]: t for t in data["trials"] if t["status"] == "failed"}
    assert set(by_run) == {"oom", "nan", "crash", "timeout"}
    assert data["counts"]["failed"] == 4 and data["counts"]["interrupted"] == 1
    for cause in ("CUDA out of memory", "non-finite loss at step 19", "exceeding the timeout",
                  "is invalid for input of size", "the campaign stopped while this trial ran"):
        assert cause in page
    assert "4 failed" in page and "1 interrupted" in page
    assert "2 proposals rejected before becoming a recipe" in page
    assert len(images(page)) == 5


def test_proposer_text_never_becomes_markup(pages, campaigns):
    page = pages["crashed"]
    assert HOSTILE not in page
    assert "<img src=x" not in page and 'onerror="alert' not in page
    assert '&lt;script&gt;alert(' in page and HOSTILE in html.unescape(page)  # shown, as text
    assert page.count("<script") == 1  # ours, and the CSP allows that one script by its hash
    assert re.search(r"script-src 'sha256-[A-Za-z0-9+/=]+'$", csp(page))
    # In the terminal, Rich markup in a rationale is printed as written, not interpreted.
    assert "[link=file:///etc/passwd]x[/link]" in terminal_text(campaigns["crashed"])


def test_show_prints_verdict_trials_and_tree(campaigns):
    res = runner.invoke(app, ["show", str(campaigns["approved"])])
    assert res.exit_code == 0, res.output
    assert "APPROVED" in res.output
    text = terminal_text(campaigns["approved"])
    ev = load_report(campaigns["approved"]).evidence
    assert f"speed-up {ev.speedup:.3f}x  95% CI [{ev.ci_low:.3f}, {ev.ci_high:.3f}]" in text
    assert (f"loss parity (same batches): final loss {ev.loss_gap:+.4f} nats, tolerance T ±{ev.loss_tolerance:.4f}"
            in text)
    assert "10 trials (9 ran)" in text
    assert "★ approved" in text and "baseline " in text
    assert re.search(r"#5 optimizer_impl=foreach 1\.\d\dx passed ★ approved", text)  # its edit to its parent
    keep = terminal_text(campaigns["keep"])
    assert "KEEP BASELINE" in keep and "★" not in keep


def test_unfinished_campaign_still_reports(campaigns, tmp_path):
    folder = tmp_path / "running"
    shutil.copytree(campaigns["approved"], folder)
    for name in ("verdict.json", "verdicts.json", "report.html", "report.json"):
        (folder / name).unlink(missing_ok=True)
    report = load_report(folder)
    assert report.decision == NO_VERDICT and report.evidence is None and not report.finalists
    assert "has not reached its verdict yet (10 trials so far)" in report.headline
    page = render(report, images={})  # the figures are drawn (and checked) by the other tests
    assert NO_VERDICT in page and "The approved recipe" not in page and "<img" not in page
    assert [c.role for c in report.curves].count("candidate") == 3  # the best screened, for lack of finalists
    assert loss_plot(report).startswith(PNG) and speed_plot(report) is None


@pytest.mark.parametrize("make", ["missing", "empty", "not-a-db"])
def test_a_folder_that_is_not_a_campaign_exits_2_and_writes_nothing(tmp_path, make):
    folder = tmp_path / "dir"
    if make != "missing":
        folder.mkdir()
    if make == "not-a-db":
        (folder / "study.db").write_text("this is not SQLite")
    before = sorted(p.name for p in folder.iterdir()) if folder.exists() else None
    for cmd in ("report", "show"):
        res = runner.invoke(app, [cmd, str(folder)])
        assert res.exit_code == 2, res.output
        assert "error:" in res.output and str(folder) in res.output
    assert (sorted(p.name for p in folder.iterdir()) if folder.exists() else None) == before


def test_out_must_be_an_html_file(campaigns, tmp_path):
    res = runner.invoke(app, ["report", str(campaigns["keep"]), "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 2 and "expected a .html file" in res.output
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", [16, 0.003, 1e-05, True, False, "fp32", "yes", "none", "null", "a b", "1e3", "x=y"])
def test_reproduce_overrides_read_back_as_the_same_value(value):
    (arg,) = shlex.split(override("knob", value))
    path, parsed = parse_override(arg, CampaignConfig.model_fields, "baseline")
    assert path == ["baseline", "knob"]
    assert parsed == value and type(parsed) is type(value)


def test_tokens_per_s_interval_narrows_with_steadier_steps():
    def run(jitter: float) -> RunResult:
        times = [0.1 * (1 + jitter * ((i * 7) % 5 - 2)) for i in range(40)]
        steps = [StepRecord(step=i, loss=1.0, tokens=1000, step_time_s=t) for i, t in enumerate(times)]
        return RunResult(recipe={}, recipe_id="x", status="ok", steps=steps, warmup_steps=4, n_devices=2)

    noisy, steady = run(0.1), run(0.01)
    for r in (noisy, steady):
        lo, hi = tokens_per_s_interval(r)
        assert lo < r.summary().tokens_per_s_per_device < hi
    assert (tokens_per_s_interval(steady)[1] - tokens_per_s_interval(steady)[0]) < (
        tokens_per_s_interval(noisy)[1] - tokens_per_s_interval(noisy)[0]) / 5
    assert tokens_per_s_interval(run(0.1).model_copy(update={"steps": noisy.steps[:5]})) is None


@pytest.mark.skipif(find_chromium() is None, reason="needs chromium (Debian's chromium package; .ci/run installs it)")
def test_report_renders_in_headless_chromium(pages, campaigns, tmp_path):
    # The crashed campaign: failures everywhere, and hostile text that must stay text.
    page = written(campaigns["crashed"])
    shot = tmp_path / "report.png"
    res = runner.invoke(app, ["report", str(campaigns["crashed"]), "--screenshot", str(shot)])
    assert res.exit_code == 0, res.output
    assert "console: clean" in res.output  # no errors, no refused scripts, no uncaught exceptions
    image = Image.open(shot).convert("RGB")
    assert image.size == (1400, 2200)
    assert len(image.getcolors(maxcolors=1 << 20)) > 500  # text, plots and badges, not a blank page
    top = image.crop((0, 0, 1400, 300)).getcolors(maxcolors=1 << 20)
    amber = (0xB4, 0x53, 0x09)  # the KEEP BASELINE banner's colour
    assert any(max(abs(c - a) for c, a in zip(rgb, amber, strict=True)) < 20 for _, rgb in top)
    dom = chromium(page, "--dump-dom").stdout  # the DOM once the page's script has run
    assert 'data-figures="5/5"' in dom  # every figure decoded
    assert 'data-sortable="ready"' in dom  # the page's script ran, under its own CSP


def test_console_messages_are_caught(tmp_path):
    assert console_messages('[1:1:INFO:CONSOLE:1] "Uncaught ReferenceError: x", source: f (1)\nother line') != []
    assert console_messages("[1:1:ERROR:dbus/bus.cc:405] Failed to connect to the bus") == []


def test_headline_speaks_to_each_kind_of_verdict():
    ev = Evidence(recipe_id="x", change="micro_batch_size=8", decision="APPROVED", speedup=1.25, ci_low=1.2,
                  ci_high=1.3, noise_margin=0.02, confidence=0.9, loss_gap=0.001, loss_tolerance=0.005)
    assert headline("APPROVED", ev, 5, []) == (
        "Approved micro_batch_size=8: 1.250x tokens/s per device (90% CI 1.200-1.300x), clear of the 2.0% noise "
        "margin; final loss +0.0010 nats, within the tolerance +-0.0050.")
    # A loss markedly lower than the baseline's is outside the tolerance too.
    lower = ev.model_copy(update={"loss_gap": -0.009})
    assert "final loss -0.0090 nats, outside the tolerance" in headline("APPROVED", lower, 5, [])
    within = ev.model_copy(update={"decision": "KEEP BASELINE", "speedup": 1.01, "ci_low": 0.99, "ci_high": 1.03})
    assert "not clear of the 2.0% noise margin" in headline("KEEP BASELINE", within, 5, [])
    lost = ev.model_copy(update={"decision": "REJECTED", "speedup": None})  # failed parity: never timed
    assert headline("KEEP BASELINE", lost, 5, ["x: REJECTED: the loss curve departs"]) == (
        "The baseline stays: x: REJECTED: the loss curve departs.")
    assert headline("KEEP BASELINE", None, 5, []) == "The baseline stays: no candidate beat it."


def test_a_trial_whose_figure_lies_outside_its_interval_still_plots(campaigns):
    # The figure is the median over windows, the interval the ratio estimator's: skewed step times put one
    # outside the other, and the report of a killed-and-resumed campaign failed to build on it.
    from recipetune.report.plots import throughput_plot

    report = load_report(campaigns["approved"])
    ran = [t for t in report.trials if t.ran and t.tokens_per_s]
    assert ran
    for t in ran:
        t.tokens_per_s_ci = [t.tokens_per_s * 0.5, t.tokens_per_s * 0.9]  # the figure above its interval
    png = throughput_plot(report)
    assert png is not None and png.startswith(PNG)
