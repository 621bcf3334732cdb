"""A Ray cluster of several nodes on this machine (``ray.cluster_utils.Cluster``, one for the module:
nodes take seconds to start): trials placed across the nodes, a worker node removed in the middle of
a trial (the trial reruns on another node, nothing lost or run twice), and a node that does not see
the campaign's files refused before anything runs (a node started in a mount namespace of its own,
where a tmpfs hides the test's folder; root only).

The workload is test_distributed_ray.py's command workload around tests/fixtures/fake_trainer.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402
from test_distributed_ray import campaign_file, gone, guard, open_when_dead, ran, running_in  # noqa: E402
from test_search_campaign import PATIENCE_S, Recorder  # noqa: E402

from recipetune.config import load_campaign  # noqa: E402
from recipetune.core.errors import ConfigError  # noqa: E402
from recipetune.execute.ray import RayExecutor  # noqa: E402
from recipetune.speed import job as campaign_mod  # noqa: E402
from recipetune.speed.plan import plan  # noqa: E402

TESTS = Path(__file__).resolve().parent
WORKERS = 3  # worker nodes of one CPU each; the head holds none, so every trial runs on a worker


@pytest.fixture(scope="module")
def cluster():
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), old) if p)  # the workers inherit it
    os.environ.setdefault("RAY_DISABLE_USAGE_STATS", "1")
    # Every node on this machine. (With node_ip_address 127.0.0.1 the head still announced its GCS on the
    # machine's own address and the driver could not connect: Ray 2.60 here.)
    c = Cluster(initialize_head=True, connect=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    try:
        for _ in range(WORKERS):
            c.add_node(num_cpus=1)
        c.wait_for_nodes(timeout=PATIENCE_S)  # Ray's default, 30 s, is not enough on a loaded machine
        yield c
    finally:
        ray.shutdown()
        c.shutdown()
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old


def attempts(run_dir: str | Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "attempts.jsonl").read_text().splitlines()]


def remove_node_when_training(cluster: Cluster, trials: Path, killed: dict, gate: Path) -> threading.Thread:
    """Remove (kill) the worker node running trial 0 once it is training (held at ``gate`` after two
    steps, so it is still running), then open the gate for its rerun."""

    def watch() -> None:
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline and not killed:
            for run_dir in sorted(trials.glob("0000-*")):
                metrics = run_dir / "metrics.jsonl"
                if metrics.exists() and metrics.read_text().count("\n") >= 2:
                    node_id = attempts(run_dir)[0]["node_id"]
                    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
                    trainers = running_in(str(run_dir))
                    cluster.remove_node(node, allow_graceful=False)  # its raylet and workers SIGKILLed
                    killed.update(node_id=node_id, run_dir=str(run_dir))
                    open_when_dead(trainers, gate)
                    return
            time.sleep(0.02)  # polling for the run to start, not standing in for work

    thread = threading.Thread(target=watch)
    thread.start()
    return thread


@pytest.mark.slow  # a campaign end to end on three Ray nodes, one removed mid-trial: 1-2 min
def test_trials_spread_over_nodes_and_a_node_killed_mid_trial_reruns_elsewhere(cluster, tmp_path):
    # parallel 2, one CPU a trial. The trials' runs wait at a gate after two steps until the node is
    # gone: with slow steps instead, a loaded CI machine once let trial 0 finish on the node before the
    # node was gone, and there was no second attempt to check.
    gate = tmp_path / "gate"
    camp = load_campaign(campaign_file(tmp_path, budget=4, gate=gate))
    p = plan(camp, tmp_path / "out")
    executor = RayExecutor(camp.config.execute, 1, camp.path, shared=[p.store.folder, camp.path])
    killed: dict = {}
    killer = remove_node_when_training(cluster, p.store.folder / "trials", killed, gate)
    try:
        outcome = campaign_mod.run(p, guard=guard(), executor=executor, reporter=Recorder())
    finally:
        killer.join()
        cluster.add_node(num_cpus=1)  # the next test gets its 3 workers back
    assert killed, "trial 0 never started"
    runs = ran(p.store)
    ids = [r.attrs["recipe_id"] for r in runs]
    assert outcome.runs == 4 and len(ids) == len(set(ids)) == 4  # nothing lost, no recipe twice
    assert all(r.state in ("COMPLETE", "FAIL") for r in p.store.records())
    victim = p.store.records()[0]
    assert victim.attrs["run_dir"] == killed["run_dir"] and victim.attrs["run_status"] == "ok", victim.attrs
    first, second = attempts(killed["run_dir"])
    assert victim.attrs["attempts"] == 2 and first["node_id"] == killed["node_id"] != second["node_id"]
    assert (Path(killed["run_dir"]) / "metrics.jsonl").read_text().count('"loss"') == 8  # the rerun's whole stream
    nodes = {a["node_id"] for r in runs for a in attempts(r.attrs["run_dir"])}
    assert len(nodes) >= 2, nodes  # the trials ran across the nodes
    assert gone(killed["run_dir"])  # the killed node's trainer did not outlive it
    assert outcome.decision in ("APPROVED", "KEEP BASELINE") and (p.store.folder / "verdict.json").exists()


def test_a_node_that_does_not_see_the_campaign_folder_is_refused_before_anything_runs(cluster, tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare(1) to start a node in a mount namespace of its own")
    ray_bin = Path(os.sys.executable).with_name("ray")
    # The node's view: a tmpfs over this test's folder, so neither the campaign file nor the folder
    # the campaign folder goes into exists there, as on a machine without the shared filesystem.
    script = (f"mount -t tmpfs -o size=1m tmpfs {tmp_path} && exec {ray_bin} start --address={cluster.address} "
              "--num-cpus=0 --block")
    before = sum(n["Alive"] for n in ray.nodes())
    node = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + PATIENCE_S
        while sum(n["Alive"] for n in ray.nodes()) <= before:
            assert node.poll() is None and time.monotonic() < deadline, node.stderr.read().decode()[-2000:]
            time.sleep(0.1)  # polling for the node to join
        f = campaign_file(tmp_path, budget=1)
        camp = load_campaign(f)
        with pytest.raises(ConfigError, match="does not see the campaign's files") as refused:
            RayExecutor(camp.config.execute, 1, camp.path, shared=[tmp_path / "out", camp.path])
        text = str(refused.value)
        assert str(f) in text and " (node " in text, text  # the path and the node, named
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".recipetune-shared-check-*"))
    finally:
        os.killpg(node.pid, signal.SIGTERM)  # `ray start --block` stops its node on SIGTERM
        node.wait(timeout=PATIENCE_S)
        deadline = time.monotonic() + 60
        while sum(n["Alive"] for n in ray.nodes()) > before and time.monotonic() < deadline:
            time.sleep(0.1)  # the cluster notices the node left


@pytest.mark.slow  # a quality campaign end to end on three Ray nodes: 1.5 min quiet, 14 min at load 8-10
def test_a_quality_campaign_runs_its_children_on_the_cluster(cluster, tmp_path, monkeypatch):
    # The quality job on the same cluster: each child experiment is a Ray task on some node, which
    # reads the experiment file, the task's files and the base model, and writes into the campaign
    # folder: the files the cluster must share, checked before the first child (shared_files).
    from ft_fixtures import experiment_file, nano_checkpoint, reverse_task

    from recipetune.engine.store import CampaignStore
    from recipetune.finetune import job as ft_job
    from recipetune.finetune.plan import load_finetune_campaign
    from recipetune.finetune.plan import plan as ft_plan

    monkeypatch.setenv("RECIPETUNE_CACHE", str(tmp_path / "cache"))  # the workers inherit the driver's env
    files = reverse_task(tmp_path)
    model = {"kind": "reference", "path": str(nano_checkpoint(tmp_path / "nano.pt"))}
    file = experiment_file(tmp_path, files, model, search={
        "knobs": {"lr": [0.001, 0.003, 0.01], "max_steps": [3, 6]}, "budget": {"trials": 3}, "seeds": [1, 2]},
        execute={"executor": "ray", "parallel": 2, "ray_address": "auto"})
    c = load_finetune_campaign(file)
    p = ft_plan(c, tmp_path / "camp")
    executor = RayExecutor(c.settings.execute, 1, c.path, shared=c.shared_files(p.store.folder))
    outcome = ft_job.run(p, executor=executor, reporter=Recorder())
    recs = [r for r in CampaignStore(tmp_path / "camp").records() if r.attrs.get("ran")]
    ids = [r.attrs["recipe_id"] for r in recs]
    assert outcome.runs == 3 and len(ids) == len(set(ids)) == 3  # each child once
    assert all(r.status == "passed" and (Path(r.attrs["run_dir"]) / "report.json").exists() for r in recs)
    assert outcome.decision in ("APPROVED", "KEEP BASELINE") and (p.store.folder / "verdict.json").exists()
