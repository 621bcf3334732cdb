"""The names of the files a campaign keeps in its folder: each written by one module, read by others.

Here, in the lowest layer, so that whoever writes a file and whoever reads it (the engine, the guard,
the jobs, the report, the fingerprint that must not hash them) name it once; a rename is one line.
"""

from __future__ import annotations

# A campaign's folder (``recipetune tune`` and ``finetune --out``)
STUDY_DB = "study.db"  # the study: trials and their attributes, the campaign's meta (engine/store.py)
CAMPAIGN = "campaign.json"  # the campaign's settings (CampaignConfig), overrides applied (engine/loop.py)
REJECTED = "rejected_proposals.jsonl"  # proposals that never became a recipe (engine/loop.py)
SET_ASIDE = "set_aside.jsonl"  # recipes set aside as predicted far slower, and on which trials (engine/loop.py)
VERDICT = "verdict.json"  # the decision (engine/job.py; a verify's out folder: guard.verdict.Verdict)
APPROVED = "approved.yaml"  # the file that runs the approved recipe (engine/job.py)
PROFILE = "baseline_profile.json"  # the speed job's guard.baseline.BaselineProfile (speed/job.py)
FINALISTS = "verdicts.json"  # the speed job's [{candidate_id, trial, screened_speedup, verdict}] (speed/decide.py)
RUNS_FOLDER = "guard-runs"  # the parity runs the speed job's verdicts store and reuse (guard/runs.py)
BASELINE = "baseline"  # the baseline's runs or experiment, in their own folder (speed/job.py, finetune/job.py)

# A guard runs folder (RUNS_FOLDER, or verify's --runs)
STORE_FILE = "store.json"  # the folder's workload: a runs folder holds the runs of one trainer

# A run's or an experiment's own folder
RESULT = "result.json"  # a run's measure.RunResult (workloads/base.py, command.py)
EXPERIMENT_REPORT = "report.json"  # an experiment's finetune.results.ExperimentReport (finetune/experiment.py)
BASELINE_REPORT = f"{BASELINE}/{EXPERIMENT_REPORT}"  # the quality job's baseline experiment's, in the campaign folder
