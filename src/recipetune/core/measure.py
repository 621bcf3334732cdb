"""What a run produced, and the numbers derived from it.

Every run ends as a ``RunResult``: its status and cause, the per-step records of the metrics
stream, and a fingerprint of the environment, so every figure can be traced to what produced it.
Throughput excludes warm-up steps (allocator warm-up, compilation), which are reported apart, and
is robust to a stall: the median over contiguous windows of the measured steps (``robust_rate``).
"""

from __future__ import annotations

import json
import math
import os
import platform
import re
import socket
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from recipetune.core.files import write_atomic
from recipetune.core.robust import mad_sigma

Status = Literal["ok", "oom", "crash", "nan", "timeout", "invalid", "pruned"]

# Exit codes of the reference trainer (and of any trainer that wants its failures classified).
EXIT_CODES: dict[int, Status] = {0: "ok", 2: "invalid", 3: "oom", 4: "nan"}


class Record(BaseModel):
    # A diverged run's NaN losses must survive a JSON round trip (pydantic writes null by default).
    model_config = ConfigDict(ser_json_inf_nan="constants")


class StepRecord(Record):
    """One training step of the metrics stream."""

    step: int
    loss: float
    tokens: int
    step_time_s: float
    peak_mem_bytes: int | None = None
    grad_norm: float | None = None
    lr: float | None = None
    data_s: float | None = None  # waiting for the batch
    compute_s: float | None = None  # forward + backward
    optim_s: float | None = None  # optimizer step, incl. gradient sync where it is not overlapped
    compile_s: float | None = None  # torch.compile's own seconds within this step (its timers), when it compiled
    profiled: bool = False  # recorded under torch.profiler (trainer/profile.py), whose cost leaves it out of throughput
    noise_scale: float | None = None  # B_simple, when the trainer estimates it
    # The guard's evidence about the data (docs/guard.md, "Which batches"): a fingerprint of the step's
    # global batch (equal for any micro-batch split, different for another sample order) and the tokens
    # per sequence the loss was computed over.
    batch_fp: str | None = None
    seq_len: int | None = None
    # The guard's own time per step over the gap this step's line closed (core/clock.py), where it
    # could time it: what the trainer's step_time_s is checked against.
    clock_s: float | None = None


class EvalRecord(Record):
    step: int
    val_loss: float


THROUGHPUT_WINDOWS = 5  # the run's figure is the median over this many windows of its measured steps
STALL_FACTOR = 3.0  # a step taking this many times the median time per token is counted as a stall
MEDIAN_ERROR = math.sqrt(math.pi / 2)  # a median's standard error over a mean's, for normal noise


class Rate(Record):
    tokens_per_s: float  # median over the windows
    mean_tokens_per_s: float  # all measured tokens / all measured time
    windows: int
    error: float  # the figure's own relative standard error, from its windows' robust spread
    stalls: int
    stall_time_s: float  # time the stalled steps took beyond a median step


def windows(items: list, k: int) -> list[list]:
    """``items`` cut into ``k`` contiguous windows of (nearly) equal counts."""
    cuts = [round(i * len(items) / k) for i in range(k + 1)]
    return [items[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def robust_rate(steps: list[StepRecord]) -> Rate:
    """Tokens/s of a run that one stall cannot wreck: the measured steps are cut into up to
    ``THROUGHPUT_WINDOWS`` contiguous windows (at least 2 steps each) and the figure is the median of
    the windows' tokens/s. A stall (a neighbour process, a page-cache miss) spoils one window and
    moves the median little; a cost that recurs in most windows (a periodic evaluation, allocator
    churn of the recipe itself) is in every window and counts. Stalls are counted and shown."""
    time_s, tokens = sum(s.step_time_s for s in steps), sum(s.tokens for s in steps)
    mean = tokens / time_s if time_s > 0 else 0.0
    k = min(THROUGHPUT_WINDOWS, max(1, len(steps) // 2))
    rates = []
    for window in windows(steps, k):
        t = sum(s.step_time_s for s in window)
        rates.append(sum(s.tokens for s in window) / t if t > 0 else 0.0)
    per_token = [s.step_time_s / s.tokens for s in steps if s.tokens > 0]
    typical = statistics.median(per_token) if per_token else 0.0
    stalled = [s for s in steps if s.tokens > 0 and s.step_time_s > STALL_FACTOR * typical * s.tokens]
    rate = statistics.median(rates) if steps else 0.0
    # The figure's error, robust like the figure: a stall's window is an outlier, not spread (the MAD
    # is sigma for normal noise), and a median's error is MEDIAN_ERROR sigma / sqrt(windows).
    spread = mad_sigma(rates, rate) / rate if rate > 0 else 0.0
    return Rate(tokens_per_s=rate, mean_tokens_per_s=mean, windows=k, error=MEDIAN_ERROR * spread / math.sqrt(k),
                stalls=len(stalled), stall_time_s=sum(s.step_time_s - typical * s.tokens for s in stalled))


CLOCK_Z = 3.0  # a trainer's clock is refused only when it disagrees with the guard's by over 3 standard errors,
RUN_SLACK = 0.05  # and, for one run's own figures, by over 5% (what an honest loop leaves untimed: its logging)


class ClockReading(Record):
    """The guard's clock against the trainer's printed step times over one run (core/clock.py)."""

    source: Literal["lines", "run"]  # each step line's arrival, or the process's wall time (lines buffered)
    steps: int  # steps the guard timed
    claimed_step_s: float  # the trainer's mean step time over them
    clock_step_s: float  # the guard's
    log_ratio: float  # log(guard's time / trainer's): the median over windows ("run": over the run)
    error: float  # its standard error: the windows' scatter and the clock's resolution
    resolution_s: float  # the largest uncertainty of one line's arrival
    poll_cpu_s: float = 0.0  # CPU seconds the clock's thread used

    def agrees(self, slack: float = RUN_SLACK) -> bool:
        """Whether the trainer's clock is within noise (``CLOCK_Z`` standard errors) or ``slack`` of the guard's."""
        return self.source == "lines" and abs(self.log_ratio) <= max(CLOCK_Z * self.error, slack)

    def describe(self) -> str:
        if self.source == "run":
            return (f"the step lines arrived together (buffered output): the guard's clock is the process's wall "
                    f"time, {1000 * self.clock_step_s:.1f} ms per step over the run (start-up included), against "
                    f"the trainer's {1000 * self.claimed_step_s:.1f} ms")
        return (f"the trainer says {1000 * self.claimed_step_s:.2f} ms per step, the guard's clock "
                f"{1000 * self.clock_step_s:.2f} ms ({self.steps} steps timed; guard/trainer "
                f"{math.exp(self.log_ratio):.3f}x +- {100 * self.error:.1f}%)")


class RunSummary(Record):
    measured_steps: int
    warmup_steps: int
    warmup_time_s: float
    tokens_per_s: float  # robust: the median over windows (robust_rate)
    tokens_per_s_per_device: float
    mean_tokens_per_s: float = 0.0  # all measured tokens / all measured time
    stalls: int = 0
    stall_time_s: float = 0.0
    mean_step_time_s: float
    mfu: float | None
    peak_mem_bytes: int | None
    loss_first: float | None
    loss_last: float | None
    val_loss_last: float | None
    breakdown_s: dict[str, float]
    compile_s: float = 0.0  # seconds torch.compile spent in the run, apart from the steady-state figures
    timed_by: str = "trainer"  # whose clock the throughput figures are on: "trainer" or "guard"


class RunResult(Record):
    recipe: dict[str, bool | int | float | str]
    recipe_id: str
    status: Status
    cause: str = ""
    steps: list[StepRecord] = Field(default_factory=list)
    evals: list[EvalRecord] = Field(default_factory=list)
    warmup_steps: int = 0
    n_devices: int = 1
    flops_per_token: float | None = None
    peak_flops_per_device: float | None = None
    wall_s: float = 0.0
    stderr_tail: str = ""
    out_dir: str = ""
    environment: dict[str, str] = Field(default_factory=dict)
    clock: ClockReading | None = None  # the guard's clock against the trainer's (None: not timed)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    def measured(self) -> list[StepRecord]:
        return [s for s in self.steps[self.warmup_steps :] if not s.profiled]

    def guard_clock(self) -> bool:
        """Whether this run's own figures are on the guard's clock: where the trainer's step times
        disagree with it beyond noise and beyond what an honest loop leaves untimed (core/clock.py)."""
        return self.clock is not None and not self.clock.agrees()

    def on_clock(self, guard: bool, whole_run: bool = False) -> list[StepRecord]:
        """The measured steps timed by the trainer, or by the guard's clock: the steps it timed, or (buffered
        lines, ``whole_run``) every step at the run's wall time per step."""
        measured = self.measured()
        if not guard or self.clock is None:
            return measured
        if not whole_run and self.clock.source == "lines" and any(s.clock_s for s in measured):
            return [s.model_copy(update={"step_time_s": s.clock_s}) for s in measured if s.clock_s]
        # buffered lines, a comparison on wall times, or no measured step's line timed: the whole run
        per_step = self.wall_s / max(self.steps[-1].step if self.steps else 1, 1)
        return [s.model_copy(update={"step_time_s": per_step}) for s in measured]

    def summary(self, guard_clock: bool | None = None, whole_run: bool = False) -> RunSummary:
        """The run's figures; ``guard_clock``: on the guard's clock (True), the trainer's (False), or as
        the run's own check says (None, ``guard_clock()``); ``whole_run``: the guard's clock as the run's wall
        time per step (a comparison where some run's lines were buffered)."""
        guard = self.guard_clock() if guard_clock is None else guard_clock and self.clock is not None
        measured, warm = self.on_clock(guard, whole_run), self.steps[: self.warmup_steps]
        time_s = sum(s.step_time_s for s in measured)
        rate = robust_rate(measured)
        tps = rate.tokens_per_s
        per_device = tps / max(self.n_devices, 1)
        mfu = None
        if self.flops_per_token and self.peak_flops_per_device and per_device > 0:
            mfu = per_device * self.flops_per_token / self.peak_flops_per_device
        mems = [s.peak_mem_bytes for s in self.steps if s.peak_mem_bytes is not None]
        breakdown = {}
        for part in ("data_s", "compute_s", "optim_s"):
            vals = [getattr(s, part) for s in measured if getattr(s, part) is not None]
            if vals:
                breakdown[part] = sum(vals) / len(vals)
        return RunSummary(
            measured_steps=len(measured),
            warmup_steps=len(warm),
            warmup_time_s=sum(s.step_time_s for s in warm),
            tokens_per_s=tps,
            tokens_per_s_per_device=per_device,
            mean_tokens_per_s=rate.mean_tokens_per_s,
            stalls=rate.stalls,
            stall_time_s=rate.stall_time_s,
            mean_step_time_s=time_s / len(measured) if measured else 0.0,
            mfu=mfu,
            peak_mem_bytes=max(mems) if mems else None,
            loss_first=self.steps[0].loss if self.steps else None,
            loss_last=self.steps[-1].loss if self.steps else None,
            val_loss_last=self.evals[-1].val_loss if self.evals else None,
            breakdown_s=breakdown,
            compile_s=sum(s.compile_s or 0.0 for s in self.steps),
            timed_by="guard" if guard else "trainer",
        )

    def save(self, path: Path) -> None:
        write_atomic(path, self.model_dump_json(indent=2))  # a reader (the driver, --resume) never sees half

    @classmethod
    def load(cls, path: Path) -> RunResult:
        return cls.model_validate_json(path.read_text())


def default_warmup_steps(n_steps: int) -> int:
    """Steps excluded from throughput: the first 10%, at least 2, always leaving half the run."""
    return min(max(2, n_steps // 10), n_steps // 2)


def read_metrics_stream(path: Path) -> tuple[list[StepRecord], list[EvalRecord]]:
    """Parse a JSONL metrics stream; validation lines carry ``val_loss``. Torn last lines are skipped."""
    steps: list[StepRecord] = []
    evals: list[EvalRecord] = []
    if not path.exists():
        return steps, evals
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves a partial line
        if not isinstance(obj, dict):
            continue
        if "val_loss" in obj:
            evals.append(EvalRecord.model_validate(obj))
        elif {"step", "loss", "tokens", "step_time_s"} <= obj.keys():
            steps.append(StepRecord.model_validate(obj))
    return steps, evals


def first_nonfinite_step(steps: list[StepRecord]) -> int | None:
    for s in steps:
        if not math.isfinite(s.loss):
            return s.step
    return None


# ---------------------------------------------------------------------------------------------
# Peak FLOPs: vendor figures for common accelerators (dense, no sparsity), a measured probe on CPU.
# MFU = tokens/s per device * FLOPs per token / this peak, with FLOPs per token counted as in MFU_CONVENTION.

MFU_CONVENTION = ("every matmul, forward + backward (PaLM appendix B, as nanoGPT's estimate_mfu): 6 FLOPs per "
                  "active non-embedding weight and output-head weight per token, plus 12 * n_layer * d_model * "
                  "seq_len for attention's QK^T and AV (causal mask not discounted); against the device's dense "
                  "peak for the dtype its matmuls run in")


def peak_source(device_type: str, device_name: str) -> str:
    """Where a run's peak FLOP/s came from, for run.json and the report."""
    if device_type == "cuda":
        row = gpu_peak(device_name)
        return row.source if row else f"none: {device_name!r} is not in core/measure.py GPU_PEAKS"
    return "measured: best-of-8 matmul probe on this CPU (peak_flops.json in the recipetune cache)"


@dataclass(frozen=True)
class GpuPeak:
    """One GPU's dense peak FLOP/s per matmul dtype, from the vendor datasheet ``source`` names.

    Dense, never the "with sparsity" figure datasheets print first (it is exactly twice). bf16/fp16 are the
    tensor-core rates with fp32 accumulation (what PyTorch's matmuls use); tf32 is what fp32 matmuls run at
    under ``matmul_precision=high``; fp32 is the plain CUDA-core rate (``matmul_precision=highest``).
    """

    pattern: str  # a regular expression over torch.cuda.get_device_name()
    flops: dict[str, float]
    source: str


# Order matters: the first pattern that matches names the device (H100 PCIe before H100 SXM).
GPU_PEAKS: tuple[GpuPeak, ...] = (
    GpuPeak(r"B200", {"bf16": 2.25e15, "fp16": 2.25e15, "tf32": 1.1e15, "fp32": 80e12},
            "NVIDIA HGX B200 datasheet (2024), per GPU, dense"),
    GpuPeak(r"H100.*PCIe", {"bf16": 756e12, "fp16": 756e12, "tf32": 378e12, "fp32": 51e12},
            "NVIDIA H100 datasheet, PCIe column, dense"),
    GpuPeak(r"H100.*NVL", {"bf16": 835e12, "fp16": 835e12, "tf32": 417e12, "fp32": 60e12},
            "NVIDIA H100 datasheet, NVL column, dense"),
    GpuPeak(r"H100|H800|GH200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
            "NVIDIA H100 datasheet, SXM column, dense"),
    GpuPeak(r"H200", {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
            "NVIDIA H200 datasheet, SXM column, dense (same compute as H100 SXM)"),
    GpuPeak(r"A100|A800", {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
            "NVIDIA A100 datasheet, dense"),
    GpuPeak(r"L40S", {"bf16": 362.05e12, "fp16": 362.05e12, "tf32": 183e12, "fp32": 91.6e12},
            "NVIDIA L40S datasheet, dense"),
    GpuPeak(r"\bL4\b", {"bf16": 121e12, "fp16": 121e12, "tf32": 60e12, "fp32": 30.3e12},
            "NVIDIA L4 datasheet, dense"),
    GpuPeak(r"\bA10\b", {"bf16": 125e12, "fp16": 125e12, "tf32": 62.5e12, "fp32": 31.2e12},
            "NVIDIA A10 datasheet, dense (not the A10G, whose figures NVIDIA does not publish)"),
    GpuPeak(r"RTX 4090", {"bf16": 165.2e12, "fp16": 165.2e12, "tf32": 82.6e12, "fp32": 82.6e12},
            "NVIDIA Ada GPU architecture whitepaper, RTX 4090, fp32 accumulate, dense"),
    GpuPeak(r"RTX 3090", {"bf16": 71e12, "fp16": 71e12, "tf32": 35.6e12, "fp32": 35.6e12},
            "NVIDIA Ampere GA102 whitepaper, RTX 3090, fp32 accumulate, dense"),
)


def gpu_peak(device_name: str) -> GpuPeak | None:
    """The table's row for a device name as torch.cuda.get_device_name() gives it; None for an unknown GPU."""
    return next((row for row in GPU_PEAKS if re.search(row.pattern, device_name, re.IGNORECASE)), None)


def gpu_peak_flops(device_name: str, dtype: str) -> float | None:
    row = gpu_peak(device_name)
    return row.flops.get(dtype) if row else None


def matmul_dtype(dtype: str, matmul_precision: str = "highest") -> str:
    """The dtype a run's matmuls run in: fp32 matmuls use TF32 under "high" and bf16 passes under "medium"."""
    if dtype != "fp32":
        return dtype
    return {"high": "tf32", "medium": "bf16"}.get(matmul_precision, "fp32")


def cache_dir() -> Path:
    path = Path(os.environ.get("RECIPETUNE_CACHE", Path.home() / ".cache" / "recipetune"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def compile_cache_dir() -> Path:
    """Where torch.compile keeps what it compiled (inductor's FX-graph and AOT-autograd caches), shared by every
    trial, guard run and later campaign: TORCHINDUCTOR_CACHE_DIR when the user set it, else <cache>/inductor."""
    return Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or cache_dir() / "inductor")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


PROBE_SIZE = 2048  # large enough that the matmul, not its overhead, is timed


def measure_cpu_peak_flops(dtype: str = "fp32", size: int = PROBE_SIZE) -> float:
    """Best-of-N matmul rate at the current thread count: the most this CPU delivers to PyTorch.

    Best-of, because other load only ever slows a run down; still, a probe taken on a busy machine
    reads low and inflates MFU: delete the cache file (``peak_flops.json``) to measure again.
    """
    import torch

    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    a = torch.randn(size, size, dtype=torch_dtype)
    b = torch.randn(size, size, dtype=torch_dtype)
    for _ in range(2):
        a @ b
    best = math.inf
    for _ in range(8):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * size**3 / best


def peak_flops(device_type: str, device_name: str, dtype: str, threads: int) -> float | None:
    """Peak FLOP/s of one device for ``dtype``: the vendor table on GPUs, a cached probe on CPU."""
    if device_type == "cuda":
        return gpu_peak_flops(device_name, dtype)
    dtype = "fp32" if dtype == "tf32" else dtype  # a CPU has no TF32: its fp32 matmuls are what it runs
    if device_type != "cpu":
        return None
    import torch

    key = f"{cpu_model()}|torch {torch.__version__}|{dtype}|threads {threads}|matmul {PROBE_SIZE}"
    path = cache_dir() / "peak_flops.json"
    try:
        cached = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        cached = {}
    if key not in cached:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            cached[key] = measure_cpu_peak_flops(dtype)
        finally:
            torch.set_num_threads(previous)
        write_atomic(path, json.dumps(cached, indent=2))
    return cached[key]


def environment_fingerprint() -> dict[str, str]:
    """Versions and hardware, stored with every run so its numbers can be traced."""
    import torch

    from recipetune import __version__

    env = {
        "recipetune": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "host": socket.gethostname(),
        "cpu": cpu_model(),
        "cpu_count": str(os.cpu_count()),
    }
    if torch.cuda.is_available():
        env["cuda"] = str(torch.version.cuda)
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpu_count"] = str(torch.cuda.device_count())
    return env
