"""Step metrics of outside trainers: a JSONL stream, or the log lines they already print.

A log preset is a pair of regular expressions with named groups: one for training-step lines and
optionally one for validation lines. Step-line groups (``step`` and ``loss`` required):

    step_time_s, step_time_ms        the time of that step
    tokens                           tokens in that (global) step
    tokens_per_s                     throughput of the whole run
    tokens_per_s_per_device          throughput of one device (torchtitan's ``tps``)
    lr, grad_norm, mem_gib, mem_bytes

    iter                             the trainer's iteration (micro-batch) count at that step

Validation-line groups: ``val_loss``, and the step it was measured at: ``step``, or ``iter`` (an
iteration count, turned into the step of the step line that printed the same ``iter``), or neither
(the last step printed before it: a trainer's final evaluation). A step time the line does not print
is derived from its throughput and the tokens per step. Colour codes are stripped before matching,
numbers may carry thousands separators, and a step printed by several ranks counts once.

Each preset below names the trainer source whose format string it was checked against;
tests/fixtures/trainer_formats.py formats those strings and tests/test_trainer_formats.py reads them.
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
STEP_FIELDS = {"step", "loss", "tokens", "lr", "grad_norm", "mem_gib", "mem_bytes", "iter", *TIME_FIELDS}
VAL_FIELDS = {"step", "iter", "val_loss"}
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
        if hit is None:
            return None
        return hit[0], int(hit[1]["step"]) if "step" in hit[1] else -1  # a validation line may number no step


def make_preset(name: str, step_regex: str, val_regex: str | None = None, help: str = "") -> LogPreset:
    """Compile and vet a preset: required groups present, no group name recipetune would ignore."""
    patterns = []
    for regex, fields, required in ((step_regex, STEP_FIELDS, {"step", "loss"}), (val_regex, VAL_FIELDS, {"val_loss"})):
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
        if {"step", "iter"} <= groups and fields is VAL_FIELDS:
            raise ValueError(f"{regex!r}: give the validation's step or its iteration (iter), not both")
        patterns.append(pattern)
    if patterns[1] is not None and "iter" in patterns[1].groupindex and "iter" not in patterns[0].groupindex:
        raise ValueError(
            f"{val_regex!r} numbers validations by iteration (iter): the step regex needs an iter group "
            "too, to turn an iteration into a step"
        )
    if not set(TIME_FIELDS) & set(patterns[0].groupindex):
        raise ValueError(f"{step_regex!r} reports no step time: add a group named one of {list(TIME_FIELDS)}")
    return LogPreset(name, patterns[0], patterns[1], help)


PRESETS: dict[str, LogPreset] = {
    p.name: p
    for p in (
        # Karpathy's nanoGPT train.py (commit 3adf61e, 2025-11-12): every log_interval iterations
        # f"iter {iter_num}: loss {lossf:.4f}, time {dt*1000:.2f}ms, mfu {running_mfu*100:.2f}%", and at each
        # eval f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}". The loss is
        # the last micro-batch's (times the accumulation), the time the whole iteration's.
        make_preset(
            "nanogpt",
            rf"\biter (?P<step>\d+): loss (?P<loss>{NUM}), time (?P<step_time_ms>{NUM})ms",
            rf"\bstep (?P<step>\d+): train loss {NUM}, val loss (?P<val_loss>{NUM})",
            help="nanoGPT train.py (set --log_interval=1 to measure every step)",
        ),
        # torchtitan's MetricsProcessor.log (components/metrics.py, commit b5bcd76, 2026-08-21), colour codes
        # between the fields: f"step: {step:2}  loss: {global_avg_loss:8.5f}  grad_norm: {grad_norm:7.4f}  memory:
        # {max_reserved_gib:5.2f}GiB({max_reserved_pct:.2f}%)  tps: {round(tps):,}  tflops: {tflops:,.2f}  mfu:
        # {mfu_str}" (older releases print wps, some no grad_norm). tps is per device over the log interval; the
        # loss is the global average. Validation: f"validate step: {step:2}  loss: {loss:7.4f}  memory: ...".
        make_preset(
            "torchtitan",
            rf"(?<!validate )\bstep:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>{NUM})"
            rf"(?:\s+grad_norm:\s*(?P<grad_norm>{NUM}))?"
            rf"\s+memory:\s*(?P<mem_gib>{NUM})\s*GiB.*?\b[tw]ps:\s*(?P<tokens_per_s_per_device>{NUM})",
            rf"\bvalidate step:\s*(?P<step>\d+)\s+loss:\s*(?P<val_loss>{NUM})",
            help="torchtitan train.py (set --metrics.log_freq=1 to measure every step)",
        ),
        # Megatron-LM's training_log (megatron/training/training.py, commit d98e8a6, 2026-08-22; set
        # --log-interval 1: the time is averaged over the interval): " [date] iteration {:8d}/{:8d} | consumed
        # samples: {:12d} | elapsed time per iteration (ms): {:.1f} | [throughput ... |] learning rate: {:.6E} |
        # global batch size: {:5d} | lm loss: {:.6E} | loss scale: {:.1f} | grad norm: {:.3f} | ...", and
        # evaluate_and_print_results: " validation loss at iteration N | lm loss value: {:.6E} | ..." during
        # training, "... at iteration N on validation set | ..." after it. Its "... on test set" line is not a
        # validation. The line prints sequences, not tokens: the campaign gives tokens_per_step.
        make_preset(
            "megatron",
            rf"\biteration\s+(?P<step>\d+)\s*/\s*\d+\s*\|.*?elapsed time per iteration \(ms\):\s*"
            rf"(?P<step_time_ms>{NUM}).*?\|\s*lm loss:\s*(?P<loss>{NUM})(?:.*?\bgrad norm:\s*(?P<grad_norm>{NUM}))?",
            rf"\bvalidation loss at iteration\s+(?P<step>\d+)(?: on validation set)?\s*\|\s*lm loss value:\s*"
            rf"(?P<val_loss>{NUM})",
            help="Megatron-LM pretrain_gpt.py (set --log-interval 1 to measure every step)",
        ),
        # litgpt's pretrain.py (v0.5.13, commit 2685705, 2026-06-29), every train.log_interval optimizer steps:
        # f"Epoch {epoch + 1} | iter {iter} step {step} | loss train: {loss:.3f}, val: {val_loss} | iter time:
        # {iter_time * 1000:.2f} ms (step) remaining time: {timedelta}". The loss is the mean of the step's
        # micro-batch losses on rank 0, to 3 decimals; "val:" repeats the last validation (not read); the iter
        # time covers the last micro-batch and the optimizer step only, not the whole step. Validation:
        # f"iter {iter_num}: val loss {val_loss:.4f}, val time: ..." (numbered by iteration) and, after
        # training, f"Final evaluation | val loss: {val_loss:.3f} | val ppl: ..." (the last step).
        make_preset(
            "litgpt",
            rf"\biter (?P<iter>\d+) step (?P<step>\d+) \| loss train: (?P<loss>{NUM}), val: \S+ \| "
            rf"iter time: (?P<step_time_ms>{NUM}) ms",
            rf"(?:\biter (?P<iter>\d+): val loss |\bFinal evaluation \| val loss: )(?P<val_loss>{NUM})",
            help="litgpt pretrain (its iter time is the last micro-batch's: see docs/own-trainer.md, litgpt)",
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


def ordered(steps: list[StepRecord], evals: list[EvalRecord]) -> Records:
    """The first record of each step, in step order (several ranks may print the same step)."""
    first_steps = {s.step: s for s in reversed(steps)}
    first_evals = {e.step: e for e in reversed(evals)}
    return [first_steps[k] for k in sorted(first_steps)], [first_evals[k] for k in sorted(first_evals)]


def parse_lines(lines: Iterable[str], preset: LogPreset, tokens_per_step: int | None, n_devices: int) -> Records:
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    step_of_iter: dict[int, int] = {}
    for line in lines:
        hit = preset.match(line)
        if hit is None:
            continue
        kind, fields = hit
        if kind == "step":
            steps.append(to_step_record(fields, tokens_per_step, n_devices))
            if "iter" in fields:
                step_of_iter[int(number(fields["iter"]))] = steps[-1].step
        elif (step := _val_step(fields, step_of_iter, steps)) is not None:
            evals.append(EvalRecord(step=step, val_loss=number(fields["val_loss"])))
    return ordered(steps, evals)


def _val_step(fields: Mapping[str, str], step_of_iter: Mapping[int, int], steps: list[StepRecord]) -> int | None:
    """The step a validation line was measured at: its own, the step printed with its iteration, or the
    last step printed (None before any)."""
    if "step" in fields:
        return int(fields["step"])
    if "iter" in fields:
        it = int(number(fields["iter"]))
        if it not in step_of_iter:
            raise MetricsError(
                f"a validation at iteration {it}, where no step line was printed: log every step to tell its step"
            )
        return step_of_iter[it]
    return steps[-1].step if steps else None


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
    return ordered(steps, evals)
