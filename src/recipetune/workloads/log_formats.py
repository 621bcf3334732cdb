"""Step metrics of outside trainers: a JSONL stream, or the log lines they already print.

A log preset is a pair of regular expressions with named groups: one for training-step lines and
optionally one for validation lines. Step-line groups (``step`` and ``loss`` required):

    step_time_s, step_time_ms        the time of that step
    tokens                           tokens in that (global) step
    tokens_per_s                     throughput of the whole run
    tokens_per_s_per_device          throughput of one device (torchtitan's ``tps``)
    lr, grad_norm, mem_gib, mem_bytes

Validation-line groups: ``step`` and ``val_loss``. A step time the line does not print is derived
from its throughput and the tokens per step. Colour codes are stripped before matching, numbers may
carry thousands separators, and a step printed by several ranks counts once.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.core.measure import EvalRecord, StepRecord

NUM = r"[-+]?(?:\d[\d,]*(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+|nan|inf)"
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TIME_FIELDS = ("step_time_s", "step_time_ms", "tokens_per_s", "tokens_per_s_per_device")
STEP_FIELDS = {"step", "loss", "tokens", "lr", "grad_norm", "mem_gib", "mem_bytes", *TIME_FIELDS}
VAL_FIELDS = {"step", "val_loss"}
# Per-step fields a JSONL line may carry beyond the ones above, copied as they are.
PASSTHROUGH = ("peak_mem_bytes", "data_s", "compute_s", "optim_s", "noise_scale", "batch_fp", "seq_len")

Records = tuple[list[StepRecord], list[EvalRecord]]


class MetricsError(ValueError):
    """Step lines were found but cannot be turned into measurements (no tokens, no time)."""


@dataclass(frozen=True)
class LogPreset:
    name: str
    step_line: re.Pattern[str]
    val_line: re.Pattern[str] | None = None
    help: str = ""

    @property
    def reports_tokens(self) -> bool:
        return "tokens" in self.step_line.groupindex

    def match(self, line: str) -> tuple[str, dict[str, str]] | None:
        """``("val", groups)``, ``("step", groups)`` or None. Validation lines are tried first,
        because a trainer's validation line often looks like its step line."""
        line = ANSI.sub("", line)
        if self.val_line and (m := self.val_line.search(line)):
            return "val", {k: v for k, v in m.groupdict().items() if v is not None}
        if m := self.step_line.search(line):
            return "step", {k: v for k, v in m.groupdict().items() if v is not None}
        return None

    def kind(self, line: str) -> tuple[str, int] | None:
        """``("step" | "val", step number)`` for a step or validation line (what the guard's clock times)."""
        hit = self.match(line)
        return None if hit is None else (hit[0], int(hit[1]["step"]))


def make_preset(name: str, step_regex: str, val_regex: str | None = None, help: str = "") -> LogPreset:
    """Compile and vet a preset: required groups present, no group name recipetune would ignore."""
    patterns = []
    for regex, fields, required in ((step_regex, STEP_FIELDS, {"step", "loss"}), (val_regex, VAL_FIELDS, VAL_FIELDS)):
        if regex is None:
            patterns.append(None)
            continue
        try:
            pattern = re.compile(regex, re.IGNORECASE)
        except re.error as e:
            raise ValueError(f"{regex!r} is not a valid regular expression: {e}") from None
        groups = set(pattern.groupindex)
        if missing := required - groups:
            raise ValueError(f"{regex!r} lacks the named group(s) {sorted(missing)}, e.g. (?P<step>\\d+)")
        if unknown := groups - fields:
            raise ValueError(f"{regex!r}: unknown group(s) {sorted(unknown)}; allowed: {sorted(fields)}")
        patterns.append(pattern)
    if not set(TIME_FIELDS) & set(patterns[0].groupindex):
        raise ValueError(f"{step_regex!r} reports no step time: add a group named one of {list(TIME_FIELDS)}")
    return LogPreset(name, patterns[0], patterns[1], help)


PRESETS: dict[str, LogPreset] = {
    p.name: p
    for p in (
        # Karpathy's nanoGPT train.py: "iter 10: loss 3.2345, time 123.45ms, mfu 12.34%" every
        # log_interval iterations, "step 100: train loss 3.1000, val loss 3.2000" at each eval.
        make_preset(
            "nanogpt",
            rf"\biter (?P<step>\d+): loss (?P<loss>{NUM}), time (?P<step_time_ms>{NUM})ms",
            rf"\bstep (?P<step>\d+): train loss {NUM}, val loss (?P<val_loss>{NUM})",
            help="nanoGPT train.py (set --log_interval=1 to measure every step)",
        ),
        # torchtitan's MetricsProcessor.log: "step: 10  loss:  7.1234  [grad_norm:  1.2345  ]memory:
        # 12.34GiB(13.05%)  tps: 1,234  tflops: 56.78  mfu: 12.34%" (older releases print wps).
        # tps is per device; the loss is the global average. Validation: "validate step: 10  loss: ..".
        make_preset(
            "torchtitan",
            rf"(?<!validate )\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{NUM})"
            rf"(?:\s+grad_norm:\s*(?P<grad_norm>{NUM}))?"
            rf"\s+memory:\s*(?P<mem_gib>{NUM})\s*GiB.*?\b[tw]ps:\s*(?P<tokens_per_s_per_device>{NUM})",
            rf"\bvalidate step:\s*(?P<step>\d+)\s+loss:\s*(?P<val_loss>{NUM})",
            help="torchtitan train.py (set --metrics.log_freq=1 to measure every step)",
        ),
        # Megatron-LM's training_log (set --log-interval 1: the time is averaged over the interval):
        # " iteration       10/    1000 | consumed samples: 160 | elapsed time per iteration (ms): 1147.6 |
        # learning rate: 1.0E-04 | global batch size: 16 | lm loss: 7.399415E+00 | loss scale: 1.0 |
        # grad norm: 2.918 | ...", and " validation loss at iteration 100 | lm loss value: 7.1E+00 |".
        # The line prints sequences, not tokens: the campaign gives tokens_per_step.
        make_preset(
            "megatron",
            rf"\biteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*"
            rf"(?P<step_time_ms>{NUM}).*?\|\s*lm loss:\s*(?P<loss>{NUM})(?:.*?\bgrad norm:\s*(?P<grad_norm>{NUM}))?",
            rf"\bvalidation loss at iteration\s+(?P<step>\d+)[^|]*\|\s*lm loss value:\s*(?P<val_loss>{NUM})",
            help="Megatron-LM pretrain_gpt.py (set --log-interval 1 to measure every step)",
        ),
    )
}


def get_preset(name: str) -> LogPreset:
    if name not in PRESETS:
        raise ValueError(f"unknown log preset {name!r}; valid presets are: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def number(text: Any) -> float:
    return float(text.replace(",", "")) if isinstance(text, str) else float(text)


def to_step_record(fields: Mapping[str, Any], tokens_per_step: int | None, n_devices: int) -> StepRecord:
    """One step's fields (strings from a log line or values from JSON) -> a StepRecord."""
    step = int(number(fields["step"]))
    if "tokens" in fields:
        tokens = int(number(fields["tokens"]))
    elif tokens_per_step is not None:
        tokens = tokens_per_step
    else:
        raise MetricsError(f"step {step} reports no 'tokens' and workload.tokens_per_step is not set")
    if "step_time_s" in fields:
        time_s = number(fields["step_time_s"])
    elif "step_time_ms" in fields:
        time_s = number(fields["step_time_ms"]) / 1000
    elif "tokens_per_s" in fields or "tokens_per_s_per_device" in fields:
        per_device = "tokens_per_s" not in fields
        rate = number(fields["tokens_per_s_per_device" if per_device else "tokens_per_s"])
        rate *= n_devices if per_device else 1
        if not rate > 0:
            raise MetricsError(f"step {step} reports a throughput of {rate:g} tokens/s")
        time_s = tokens / rate
    else:
        raise MetricsError(f"step {step} reports no time: give one of {', '.join(TIME_FIELDS)}")
    mem = fields.get("peak_mem_bytes", fields.get("mem_bytes"))
    if mem is None and "mem_gib" in fields:
        mem = number(fields["mem_gib"]) * 2**30
    extra = {k: fields[k] for k in PASSTHROUGH if fields.get(k) is not None and k != "peak_mem_bytes"}
    if "batch_fp" in extra:
        extra["batch_fp"] = str(extra["batch_fp"])  # a hash may come as a number
    return StepRecord(
        step=step,
        loss=number(fields["loss"]),
        tokens=tokens,
        step_time_s=time_s,
        peak_mem_bytes=None if mem is None else int(number(mem)),
        grad_norm=number(fields["grad_norm"]) if fields.get("grad_norm") is not None else None,
        lr=number(fields["lr"]) if fields.get("lr") is not None else None,
        **extra,
    )


def _ordered(steps: list[StepRecord], evals: list[EvalRecord]) -> Records:
    """The first record of each step, in step order (several ranks may print the same step)."""
    first_steps = {s.step: s for s in reversed(steps)}
    first_evals = {e.step: e for e in reversed(evals)}
    return [first_steps[k] for k in sorted(first_steps)], [first_evals[k] for k in sorted(first_evals)]


def parse_lines(lines: Iterable[str], preset: LogPreset, tokens_per_step: int | None, n_devices: int) -> Records:
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    for line in lines:
        hit = preset.match(line)
        if hit is None:
            continue
        kind, fields = hit
        if kind == "val":
            evals.append(EvalRecord(step=int(fields["step"]), val_loss=number(fields["val_loss"])))
        else:
            steps.append(to_step_record(fields, tokens_per_step, n_devices))
    return _ordered(steps, evals)


def read_logs(paths: Iterable[Path], preset: LogPreset, tokens_per_step: int | None, n_devices: int) -> Records:
    """Step and validation records from log files (stdout and stderr: trainers log to either)."""
    lines: list[str] = []
    for path in paths:
        if path.exists():
            lines += path.read_text(errors="replace").splitlines()
    return parse_lines(lines, preset, tokens_per_step, n_devices)


def read_jsonl(path: Path, tokens_per_step: int | None, n_devices: int) -> Records:
    """A JSONL stream: lines with ``val_loss`` are validations, lines with ``step`` and ``loss``
    are steps. Torn or foreign lines are skipped."""
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    if not path.exists():
        return steps, evals
    for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial line
        if not isinstance(obj, dict) or "step" not in obj:
            continue
        try:
            if "val_loss" in obj:
                evals.append(EvalRecord(step=int(obj["step"]), val_loss=number(obj["val_loss"])))
            elif "loss" in obj:
                steps.append(to_step_record(obj, tokens_per_step, n_devices))
        except MetricsError:
            raise
        except (TypeError, ValueError) as e:
            raise MetricsError(f"{path.name} line {i}: {e}") from None
    return _ordered(steps, evals)

