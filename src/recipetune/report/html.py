"""One self-contained HTML page (figures inlined, no network) and report.json beside it.

The template autoescapes everything: rationales come from proposers, LLMs among them, and must
never become markup. The page's only script is ours, and its Content-Security-Policy allows that
script alone (by hash), so even a template bug could not run injected code.
"""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from recipetune.core.fmt import fmt_bytes, fmt_num, fmt_pct, fmt_value
from recipetune.report.model import Report, report_json
from recipetune.report.plots import all_plots, data_uri


def _environment() -> Environment:
    # autoescape=True, not select_autoescape: the template's name ends in .j2, which that would not escape.
    env = Environment(loader=PackageLoader("recipetune.report", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(num=fmt_num, pct=fmt_pct, bytes=fmt_bytes, value=fmt_value)
    return env


def render(report: Report, images: dict[str, bytes] | None = None) -> str:
    """The page as a string; ``images`` (name -> PNG) default to all of the report's figures."""
    images = all_plots(report) if images is None else images
    env = _environment()
    script = env.get_template("page.js.j2").render()  # static: a template only so packaging ships it (*.j2)
    digest = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    csp = f"default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'sha256-{digest}'"
    return env.get_template("report.html.j2").render(
        r=report, images={k: data_uri(v) for k, v in images.items()}, script=Markup(script), csp=csp,
    )


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)


def write_report(report: Report, out: Path) -> tuple[Path, Path]:
    """Write the page to ``out`` and the same data to ``out`` with a .json suffix, each atomically."""
    page = render(report)
    data = report_json(report)  # both built before either is written: nothing half-written on failure
    out.parent.mkdir(parents=True, exist_ok=True)
    json_path = out.with_suffix(".json")
    _write(out, page)
    _write(json_path, data)
    return out, json_path
