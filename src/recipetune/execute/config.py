"""Where a campaign's trials run (the ``execute:`` section of a campaign file).

The local executor is the default: one trial at a time on this machine. ``ray`` spreads trials over
a Ray cluster, each holding the resources below as a placement group for its whole run.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class TrialResources(BaseModel):
    """What one trial holds, per node, for its whole run (a Ray placement group of ``nodes`` bundles)."""

    model_config = ConfigDict(extra="forbid")

    cpus: float = Field(1.0, gt=0, description="logical CPUs per node; the trial's OMP_NUM_THREADS follows it")
    gpus: float = Field(0.0, ge=0, description="GPUs per node; Ray sets CUDA_VISIBLE_DEVICES to exactly these")
    custom: dict[str, float] = Field(default_factory=dict, description="custom Ray resources per node, e.g. {ib: 1}")
    nproc_per_node: int | None = Field(
        None, ge=1, description="processes torchrun starts inside each bundle (default: gpus, or 1 without GPUs)"
    )
    nodes: int = Field(1, ge=1, description="nodes of one multi-node trial (bundles placed on distinct nodes)")

    @model_validator(mode="after")
    def _whole_gpus(self) -> TrialResources:
        if self.gpus and self.gpus != int(self.gpus):
            raise ValueError("gpus must be a whole number: a measured run never shares a device")
        return self

    def bundle(self) -> dict[str, float]:
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {}), **self.custom}

    def procs(self) -> int:
        return self.nproc_per_node or max(1, int(self.gpus))


class ExecuteConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    executor: Literal["local", "ray"] = "local"
    ray_address: str | None = Field(None, description="'auto' (a running cluster), ray://host:10001, or none: start "
                                                      "a local Ray instance")
    parallel: int = Field(1, ge=1, description="trials in flight at once (ray); the local executor runs one")
    loss_runs: int | None = Field(
        None, ge=1, description="the local executor: loss-only runs (the guard's parity evidence) side by side at "
        "most; default: as many as the machine's devices hold (GPUs over the devices a run uses; on a CPU, its "
        "cores over the threads a run uses)")
    retries: int = Field(1, ge=0, le=3, description="reruns of a trial whose worker process or node died")
    heartbeat_s: int = Field(30, ge=1, description="a driver's running trials send a heartbeat this often; a trial "
                                                   "silent for 2x this is failed as interrupted")
    db_retry_s: float = Field(60.0, ge=0, description="how long a driver waits for the study's database server "
                                                    "(search.storage) to answer again after losing it, retrying "
                                                    "with backoff, before it stops (resumable); 0: not at all")
    resources: TrialResources = TrialResources()
