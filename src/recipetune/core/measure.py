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
import socket
import statistics
import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from recipetune.core.files import write_atomic

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
    noise_scale: float | None = None  # B_simple, when the trainer estimates it
    # The guard's evidence about the data (docs/guard.md, "Which batches"): a fingerprint of the step's
    # global batch (equal for any micro-batch split, different for another sample order) and the tokens
    # per sequence the loss was computed over.
    batch_fp: str | None = None
    seq_len: int | None = None


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


def robust_rate(steps: list[StepRecord]) -> Rate:
    """Tokens/s of a run that one stall cannot wreck: the measured steps are cut into up to
    ``THROUGHPUT_WINDOWS`` contiguous windows (at least 2 steps each) and the figure is the median of
    the windows' tokens/s. A stall (a neighbour process, a page-cache miss) spoils one window and
    moves the median little; a cost that recurs in most windows (a periodic evaluation, allocator
    churn of the recipe itself) is in every window and counts. Stalls are counted and shown."""
    time_s, tokens = sum(s.step_time_s for s in steps), sum(s.tokens for s in steps)
    mean = tokens / time_s if time_s > 0 else 0.0
    k = min(THROUGHPUT_WINDOWS, max(1, len(steps) // 2))
    cuts = [round(i * len(steps) / k) for i in range(k + 1)]
    rates = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        t = sum(s.step_time_s for s in steps[a:b])
        rates.append(sum(s.tokens for s in steps[a:b]) / t if t > 0 else 0.0)
    per_token = [s.step_time_s / s.tokens for s in steps if s.tokens > 0]
    typical = statistics.median(per_token) if per_token else 0.0
    stalled = [s for s in steps if s.tokens > 0 and s.step_time_s > STALL_FACTOR * typical * s.tokens]
    rate = statistics.median(rates) if steps else 0.0
    # The figure's error, robust like the figure: a stall's window is an outlier, not spread (1.4826 MAD
    # is sigma for normal noise), and a median's error is MEDIAN_ERROR sigma / sqrt(windows).
    spread = 1.4826 * statistics.median(abs(r - rate) for r in rates) / rate if rate > 0 else 0.0
    return Rate(tokens_per_s=rate, mean_tokens_per_s=mean, windows=k, error=MEDIAN_ERROR * spread / math.sqrt(k),
                stalls=len(stalled), stall_time_s=sum(s.step_time_s - typical * s.tokens for s in stalled))


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

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def losses(self) -> list[float]:
        return [s.loss for s in self.steps]

    def measured(self) -> list[StepRecord]:
        return self.steps[self.warmup_steps :]

    def summary(self) -> RunSummary:
        measured, warm = self.measured(), self.steps[: self.warmup_steps]
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

GPU_PEAK_FLOPS: dict[str, dict[str, float]] = {
    "B200": {"bf16": 2.25e15, "fp16": 2.25e15, "fp32": 80e12},
    "H200": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
}


def gpu_peak_flops(device_name: str, dtype: str) -> float | None:
    for key, table in GPU_PEAK_FLOPS.items():
        if key in device_name.upper():
            return table.get(dtype)
    return None


def cache_dir() -> Path:
    path = Path(os.environ.get("RECIPETUNE_CACHE", Path.home() / ".cache" / "recipetune"))
    path.mkdir(parents=True, exist_ok=True)
    return path


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
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=2))
        tmp.replace(path)
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
