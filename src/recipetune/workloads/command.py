"""Any training command as a workload: knob values into its arguments or environment, metrics
read back from a JSONL stream, from log lines through a named regex preset, or from the CSV file a
trainer's logger writes (workloads/csv_metrics.py).

Placeholders in ``argv``, ``env`` values and ``metrics.jsonl``/``metrics.csv`` are plain ``{name}`` fields: a knob,
or ``{steps}``, ``{out_dir}`` (absolute), ``{recipe_json}`` (the recipe written as JSON) and
``{python}`` (the interpreter running recipetune). ``{{`` and ``}}`` are literal braces. Values are
rendered as text (bools as ``true``/``false``) and each argv element stays one argument: the
command never goes through a shell, so a value can never become code.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import shlex
import string
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recipetune.core import clock, expr, meanings
from recipetune.core.filenames import RESULT
from recipetune.core.measure import RunResult
from recipetune.core.process import STOP_FILE, run_process
from recipetune.core.recipe import Knob, KnobError, KnobSet, Recipe
from recipetune.workloads import csv_metrics, fingerprint, log_formats
from recipetune.workloads.base import Invariant, ProgressFn, Workload, build_result, count_lines

Scalar = bool | int | float | str


class KnobSpec(BaseModel):
    """A knob of an outside trainer, declared in the campaign file.

    With neither ``choices`` nor bounds, the domain follows the default: any number for a number,
    true/false for a bool, any string for a string. An integer default makes an integer knob
    (write ``1.0`` for a real-valued knob). ``means`` says what the knob is (recipetune.core.meanings),
    so the analyst's rules apply to it; ``derive`` computes it from other knobs (recipetune.core.relations):
    never searched, its default the derived value.
    """

    model_config = ConfigDict(extra="forbid")

    default: Scalar | None = None
    role: Literal["speed", "semantic", "invariant"] = "speed"
    choices: list[Scalar] | None = None
    low: float | None = None
    high: float | None = None
    integer: bool = False
    help: str = ""
    means: str | None = Field(None, description="what the knob is: micro_batch, grad_accum, nproc, dtype, ...")
    derive: str | None = Field(None, description="an expression over other knobs, e.g. '32 // batch_size'")

    @field_validator("means")
    @classmethod
    def _known_meaning(cls, word: str | None) -> str | None:
        if word is not None:
            meanings.check_word(word)  # a ValueError: pydantic names the field
        return word

    @model_validator(mode="after")
    def _has_default(self) -> KnobSpec:
        if self.default is None and self.derive is None:
            raise ValueError("a knob needs a default (or derive: EXPR)")
        return self


class MetricsSpec(BaseModel):
    """Where the step metrics come from: exactly one of ``jsonl``, ``regex_preset``, ``step_regex``, ``csv``."""

    model_config = ConfigDict(extra="forbid")

    jsonl: str | None = Field(None, description="path template of a JSONL metrics stream, e.g. {out_dir}/m.jsonl")
    regex_preset: str | None = Field(None, description="name of a log-line preset")
    step_regex: str | None = Field(
        None, description="a custom step-line regex with named groups (see workloads/log_formats.py)"
    )
    val_regex: str | None = Field(None, description="with step_regex: a validation-line regex (step, val_loss)")
    csv: str | None = Field(None, description="path template of a CSV file the trainer's logger writes; * matches "
                            "a folder name, e.g. {out_dir}/logs/csv/version_*/metrics.csv")
    columns: str | dict[str, str] | None = Field(
        None, description="with csv: a column preset (litgpt) or {field: column} (see workloads/csv_metrics.py)")


class CommandSpec(fingerprint.FingerprintFields):
    model_config = ConfigDict(extra="forbid")

    kind: Literal["command"] = "command"
    argv: list[str] = Field(min_length=1, description="argv with {knob}, {steps}, {out_dir} placeholders")
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    knobs: dict[str, KnobSpec] = Field(default_factory=dict)
    metrics: MetricsSpec = MetricsSpec(jsonl="{out_dir}/metrics.jsonl")
    tokens_per_step: str | None = Field(None, description="expression over knobs, when the log lacks tokens")
    devices: str = Field("1", description="expression over knobs: devices one run uses")
    flops_per_token: float | None = None
    peak_flops_per_device: float | None = Field(
        None, description="FLOP/s of one device at the run's precision (e.g. 989e12 for H100 bf16), for MFU"
    )
    invariants: list[str] = Field(
        default_factory=list,
        description="relations that must hold ('a * b == 32') or expressions that must not change ('model')",
    )


RESERVED = ("steps", "out_dir", "recipe_json", "python")


class SpecError(ValueError):
    """A bad command-workload spec; ``field`` is its path under ``workload``."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def placeholders(template: str) -> list[str]:
    """The ``{name}`` fields of a template. Format specs, conversions, indexing and attribute
    access are refused: a template only ever receives a value, never reaches into one."""
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise ValueError(f"{template!r}: {e} (write {{{{ and }}}} for literal braces)") from None
    names = []
    for _, field, spec, conversion in parts:
        if field is None:
            continue
        if not field.isidentifier() or spec or conversion:
            text = "{" + field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise ValueError(f"{template!r}: placeholders must be plain {{name}} fields, not {text}")
        names.append(field)
    return names


def substitute(template: str, values: dict[str, str]) -> str:
    """Fill the ``{name}`` fields; the values themselves are never formatted again."""
    out = []
    for literal, field, _, _ in string.Formatter().parse(template):
        out.append(literal)
        if field is not None:
            out.append(values[field])
    return "".join(out)


def render(value: Scalar) -> str:
    """A knob value as command-line text: bools as true/false, floats as their shortest repr."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def to_knob(name: str, spec: KnobSpec, derived: Scalar | None = None) -> Knob:
    """The knob ``spec`` declares; ``derived``: its value on the other knobs' defaults, if derived."""
    if spec.derive is not None:
        if spec.default is not None and derived is not None and spec.default != derived:
            raise SpecError(f"knobs.{name}.default", f"is {spec.default!r} but '{spec.derive}' gives {derived!r} "
                                                     "on the other knobs' defaults; leave the default out")
        spec = spec.model_copy(update={"default": derived})
    if not name.isidentifier() or name in RESERVED:
        raise SpecError(f"knobs.{name}", f"a knob name must be an identifier and not one of {', '.join(RESERVED)}")
    if spec.choices is not None and (spec.low is not None or spec.high is not None):
        raise SpecError(f"knobs.{name}", "give either choices or low/high bounds, not both")
    choices = tuple(spec.choices) if spec.choices is not None else None
    low, high = spec.low, spec.high
    numeric = isinstance(spec.default, int | float) and not isinstance(spec.default, bool)
    if choices is None and low is None and high is None:
        if isinstance(spec.default, bool):
            choices = (False, True)
        elif numeric:
            low, high = -math.inf, math.inf
    # An integer default makes an integer knob, so "8" never reaches a command line as "8.0".
    integer = spec.integer or (numeric and isinstance(spec.default, int))
    assert spec.default is not None
    knob = Knob(name, spec.default, spec.role, choices, low, high, integer, spec.help, spec.means, spec.derive)
    try:
        knob = dataclasses.replace(knob, default=knob.validate(spec.default))
    except KnobError as e:
        raise SpecError(f"knobs.{name}.default", f"the default is outside the knob's own domain: {e}") from None
    return knob


class CommandWorkload(Workload):
    kind = "command"

    def __init__(self, spec: CommandSpec, base_dir: Path):
        self.spec, self.base_dir = spec, base_dir
        self.cwd = (base_dir / spec.cwd).resolve() if spec.cwd else base_dir
        if not self.cwd.is_dir():
            raise SpecError("cwd", f"{self.cwd} is not a directory")
        self._knobs = self._build_knobs(spec.knobs)
        allowed = set(self._knobs) | set(RESERVED)
        templates = {f"argv.{i}": a for i, a in enumerate(spec.argv)}
        templates |= {f"env.{k}": v for k, v in spec.env.items()}
        for route in ("jsonl", "csv"):
            if getattr(spec.metrics, route):
                templates[f"metrics.{route}"] = getattr(spec.metrics, route)
        for field, template in templates.items():
            try:
                unknown = [n for n in placeholders(template) if n not in allowed]
            except ValueError as e:
                raise SpecError(field, str(e)) from None
            if unknown:
                raise SpecError(field, f"placeholder {{{unknown[0]}}} names no knob; knobs are: "
                                f"{', '.join(sorted(self._knobs)) or '(none)'}; also {', '.join(RESERVED)}")
        self.csv_columns: dict[str, str] | None = None  # the csv route's column map (None: the file's own names)
        self.preset = self._metrics_source()
        for field in ("tokens_per_step", "devices"):
            text = getattr(spec, field)
            if text is not None:
                self._check_expr(field, text)
                self._try_on_defaults(field, text)
        if self.preset and not self.preset.reports_tokens and spec.tokens_per_step is None:
            raise SpecError("tokens_per_step", f"the log preset '{self.preset.name}' does not report tokens; "
                            "set workload.tokens_per_step (an expression over knobs, e.g. 'batch * seq_len')")
        if "tokens_seen" in (self.csv_columns or {}) and spec.tokens_per_step is None:
            raise SpecError("tokens_per_step", "metrics.columns counts steps in tokens (tokens_seen): set "
                            "workload.tokens_per_step, the global batch in tokens (e.g. 'global_batch * seq_len')")
        self._invariants = [self._invariant(i, text) for i, text in enumerate(spec.invariants)]
        for i, pattern in enumerate(spec.code or []):
            if not pattern.startswith("!") and not fingerprint.globbed(self.cwd, [pattern]):
                raise SpecError(f"code.{i}", f"{pattern!r} matches no file under {self.cwd}")

    @staticmethod
    def _build_knobs(specs: dict[str, KnobSpec]) -> KnobSet:
        """Plain knobs first; a derived knob's default is its expression on their defaults."""
        plain = [to_knob(name, k) for name, k in specs.items() if k.derive is None]
        defaults = {k.name: k.default for k in plain}
        derived = []
        for name, k in specs.items():
            if k.derive is None:
                continue
            field = f"knobs.{name}.derive"
            try:
                unknown = expr.names(k.derive) - set(defaults)
                if unknown:
                    raise SpecError(field, f"{k.derive!r} names {', '.join(sorted(unknown))}, not a plain knob; "
                                           f"a derived knob depends on these: {', '.join(defaults) or '(none)'}")
                value = expr.evaluate(k.derive, defaults)
            except (expr.ExprError, TypeError, ValueError) as e:
                if isinstance(e, SpecError):
                    raise
                raise SpecError(field, f"{k.derive!r} cannot be evaluated on the defaults: {e}") from None
            if isinstance(value, float) and value.is_integer() and isinstance(k.default, int | None):
                value = int(value)
            derived.append(to_knob(name, k, value))
        order = list(specs)
        return KnobSet(sorted(plain + derived, key=lambda knob: order.index(knob.name)))

    def _metrics_source(self) -> log_formats.LogPreset | None:
        m = self.spec.metrics
        given = [k for k in ("jsonl", "regex_preset", "step_regex", "csv") if getattr(m, k)]
        if len(given) != 1:
            raise SpecError("metrics", "give exactly one of jsonl, regex_preset, step_regex, csv"
                            + (f"; got {', '.join(given)}" if given else ""))
        if m.val_regex and not m.step_regex:
            raise SpecError("metrics.val_regex", "only used together with step_regex")
        if m.columns is not None and not m.csv:
            raise SpecError("metrics.columns", "only used together with csv")
        if m.columns is not None:
            try:
                self.csv_columns = csv_metrics.columns_of(m.columns)
            except ValueError as e:
                raise SpecError("metrics.columns", str(e)) from None
        try:
            if m.regex_preset:
                return log_formats.get_preset(m.regex_preset)
            if m.step_regex:
                return log_formats.make_preset("custom", m.step_regex, m.val_regex)
        except ValueError as e:
            raise SpecError("metrics", str(e)) from None
        return None

    def _check_expr(self, field: str, text: str) -> None:
        try:
            unknown = expr.names(text) - set(self._knobs)
        except expr.ExprError as e:
            raise SpecError(field, str(e)) from None
        if unknown:
            raise SpecError(field, f"{text!r} names unknown knob(s) {', '.join(sorted(unknown))}; "
                            f"knobs are: {', '.join(sorted(self._knobs)) or '(none)'}")

    def _try_on_defaults(self, field: str, text: str) -> None:
        try:
            value = expr.evaluate(text, self._knobs.defaults())
        except (expr.ExprError, TypeError) as e:
            raise SpecError(field, f"{text!r} cannot be evaluated: {e}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(field, f"{text!r} must give a number, got {value!r}")

    def _invariant(self, i: int, text: str) -> Invariant:
        self._check_expr(f"invariants.{i}", text)
        body = expr.parse(text).body
        holds = isinstance(body, ast.Compare | ast.BoolOp) or (
            isinstance(body, ast.UnaryOp) and isinstance(body.op, ast.Not)
        )
        return Invariant(name=text, expr=text, kind="holds" if holds else "unchanged")

    def knobs(self) -> KnobSet:
        return self._knobs

    def invariants(self) -> list[Invariant]:
        return list(self._invariants)

    def check(self, recipe: Recipe) -> list[str]:
        # Relations and derived knobs: recipetune.core.relations, the one place that evaluates them.
        problems = [f"invariant {p.message}" if p.rule == "relation" else f"{p.knob} {p.message}"
                    for p in self.relations().problems(recipe)]
        try:
            if self.n_devices(recipe) < 1:
                problems.append(f"devices '{self.spec.devices}' must be at least 1")
        except (expr.ExprError, TypeError, ValueError) as e:
            problems.append(f"devices '{self.spec.devices}' cannot be evaluated: {e}")
        return problems

    def n_devices(self, recipe: Recipe) -> int:
        return int(expr.evaluate(self.spec.devices, recipe))

    def cpu_threads(self, recipe: Recipe) -> int | None:
        threads = self.environment(recipe, 1, self.cwd).get("OMP_NUM_THREADS", "")
        return int(threads) * self.n_devices(recipe) if threads.isdigit() and int(threads) > 0 else None

    def code_manifest(self) -> dict[str, str]:
        # Every Python file in cwd (or the workload.code globs), the files the argv names, the data
        # files by size and time, the trainer interpreter's packages: workloads/fingerprint.py.
        env = {k: v for k, v in self.spec.env.items() if not placeholders(v)}
        return fingerprint.command_manifest(self.cwd, self.spec.argv, env, self.spec.model_dump_json(),
                                            self.spec.code, self.spec.data_fingerprint, self.spec.fingerprint_env)

    def code_fingerprint(self) -> str:
        return fingerprint.digest(self.code_manifest())

    def code_identity(self) -> tuple[str, dict[str, str]]:
        manifest = self.code_manifest()  # every file hashed once, not once for each
        return fingerprint.digest(manifest), manifest

    def identity(self) -> dict[str, str]:
        return {"kind": self.kind, "trainer": str(self.cwd)}

    def tokens_per_step(self, recipe: Recipe) -> int | None:
        text = self.spec.tokens_per_step
        return None if text is None else int(expr.evaluate(text, recipe))

    def flops_per_token(self, recipe: Recipe) -> float | None:
        return self.spec.flops_per_token

    def _values(self, recipe: Recipe, steps: int, out_dir: Path) -> dict[str, str]:
        out_dir = out_dir.resolve()  # the command runs in its own cwd
        reserved = {"steps": str(steps), "out_dir": str(out_dir),
                    "recipe_json": str(out_dir / "recipe.json"), "python": sys.executable}
        return {**{k: render(v) for k, v in recipe.items()}, **reserved}

    def command(self, recipe: Recipe, steps: int, out_dir: Path) -> list[str]:
        values = self._values(recipe, steps, out_dir)
        return [substitute(a, values) for a in self.spec.argv]

    def environment(self, recipe: Recipe, steps: int, out_dir: Path) -> dict[str, str]:
        values = self._values(recipe, steps, out_dir)
        return {k: substitute(v, values) for k, v in self.spec.env.items()}

    def shell_command(self, recipe: Recipe, steps: int, out_dir: Path) -> str:
        """The same launch as one shell line, every element quoted: for a human to copy."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.environment(recipe, steps, out_dir).items()]
        argv = [shlex.quote(a) for a in self.command(recipe, steps, out_dir)]
        return " ".join(["cd", shlex.quote(str(self.cwd)), "&&", *env, *argv])

    def metrics_path(self, recipe: Recipe, steps: int, out_dir: Path, route: str = "jsonl") -> Path | None:
        """Where the run writes its JSONL stream (or, ``route="csv"``, its CSV file: a path that may hold ``*``)."""
        template = getattr(self.spec.metrics, route)
        return None if not template else self.cwd / substitute(template, self._values(recipe, steps, out_dir))

    def read_metrics(self, recipe: Recipe, steps: int, out_dir: Path) -> log_formats.Records:
        """The run's step and validation records, read the way the campaign says the trainer writes them."""
        tps, n_devices = self.tokens_per_step(recipe), self.n_devices(recipe)
        if (metrics := self.metrics_path(recipe, steps, out_dir)) is not None:
            return log_formats.read_jsonl(metrics, tps, n_devices)
        if (table := self.metrics_path(recipe, steps, out_dir, "csv")) is not None:
            return csv_metrics.read_csv(table, self.csv_columns, tps, n_devices)
        assert self.preset is not None
        return log_formats.read_logs([out_dir / "stdout.log", out_dir / "stderr.log"], self.preset, tps, n_devices)

    def run(
        self,
        recipe: Recipe,
        steps: int,
        out_dir: Path,
        timeout_s: float | None = None,
        progress: ProgressFn | None = None,
    ) -> RunResult:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "recipe.json").write_text(json.dumps(dict(recipe), indent=2, sort_keys=True))
        metrics = self.metrics_path(recipe, steps, out_dir)
        table = self.metrics_path(recipe, steps, out_dir, "csv")
        stale_tables = csv_metrics.matches(table) if table is not None else []
        for stale in (metrics, *stale_tables, out_dir / "status.json", out_dir / STOP_FILE):
            if stale is not None:
                stale.unlink(missing_ok=True)
        logs = [out_dir / "stdout.log", out_dir / "stderr.log"]
        on_poll = None
        if progress and metrics is not None:
            on_poll = lambda: progress(count_lines(metrics))  # noqa: E731
        elif progress and table is not None:
            on_poll = lambda: progress(len(self.steps_so_far(recipe, steps, out_dir)))  # noqa: E731
        elif progress and self.preset is not None:
            follower = LogFollower(logs, self.preset)
            on_poll = lambda: progress(follower.poll())  # noqa: E731
        outcome = run_process(
            self.command(recipe, steps, out_dir),
            log_dir=out_dir,
            timeout_s=timeout_s,
            env={"PYTHONUNBUFFERED": "1", **self.environment(recipe, steps, out_dir)},
            cwd=self.cwd,
            on_poll=on_poll,
            stop_file=out_dir / STOP_FILE,
            timed=[metrics] if metrics is not None else logs,  # the guard's own clock (core/clock.py)
        )
        n_devices = self.n_devices(recipe)
        run_info = {"n_devices": n_devices, "flops_per_token": self.spec.flops_per_token,
                    "peak_flops_per_device": self.spec.peak_flops_per_device}
        problem = ""
        try:
            parsed = self.read_metrics(recipe, steps, out_dir)
        except log_formats.MetricsError as e:
            parsed, problem = ([], []), f"metrics: {e}"
        steps_done = max(len(parsed[0]), parsed[0][-1].step if parsed[0] else 0)
        kind = self.preset.kind if self.preset is not None else clock.jsonl_kind
        result = build_result(recipe, outcome, out_dir, steps, metrics, run_info, parsed, steps_done, kind)
        if not problem and not parsed[0] and result.status == "crash" and outcome.returncode == 0:
            source = metrics or table or f"stdout/stderr (log preset '{self.preset.name}')"
            problem = f"{result.cause}: no step records found in {source}"
        if problem and result.status in ("ok", "crash"):
            # The run may have trained fine, but recipetune cannot measure it: say why.
            update = {"status": "crash", "cause": problem, "stderr_tail": outcome.stderr_tail}
            result = result.model_copy(update=update)
            result.save(out_dir / RESULT)
        return result

    def records_so_far(self, recipe: Recipe, steps: int, out_dir: Path) -> log_formats.Records:
        """A running run's step and validation records, as far as they are written."""
        try:
            return self.read_metrics(recipe, steps, out_dir)
        except (log_formats.MetricsError, OSError, ValueError):
            return [], []  # a stream still being written that cannot be read yet: nothing to judge


class LogFollower:
    """Reads what a running process appends to its logs; ``poll`` gives the last step printed."""

    def __init__(self, paths: list[Path], preset: log_formats.LogPreset):
        self.offsets = dict.fromkeys(paths, 0)
        self.preset = preset
        self.last_step = 0

    def poll(self) -> int:
        for path, offset in self.offsets.items():
            try:
                with path.open("rb") as f:
                    f.seek(offset)
                    chunk = f.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self.offsets[path] = offset + end
            for line in chunk[:end].decode(errors="replace").splitlines():
                hit = self.preset.match(line)
                if hit and hit[0] == "step":
                    self.last_step = max(self.last_step, int(hit[1]["step"]))
        return self.last_step
