"""Planning a campaign, for any job: every check before anything is written.

A job's ``plan()`` (speed/plan.py, finetune/plan.py) checks its own file and space, then
uses these for what all jobs share: the Researcher the search section names, and the campaign folder
(a new campaign needs an empty one, a resumed one the same settings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe, SearchSpace
from recipetune.core.relations import Relations
from recipetune.engine.config import LLMSettings, TreeSearchConfig
from recipetune.engine.llm import LLMProposer
from recipetune.engine.playbook import PlaybookError, load_playbook
from recipetune.engine.proposers import AnalystProposer, RandomProposer, WithFallback
from recipetune.engine.researcher import Explore, Proposer
from recipetune.engine.samplers import make_pruner, make_sampler
from recipetune.engine.store import CampaignStore
from recipetune.execute.config import ExecuteConfig


@dataclass
class Plan:
    """A checked campaign and its folder: everything needed to run it, nothing written yet."""

    campaign: Any  # the job's checked campaign file (config.Campaign, finetune.job.FinetuneCampaign)
    folder: Path
    resume: bool
    space: SearchSpace
    proposer: Proposer | None
    meta: dict[str, Any]  # the study's settings, compared on --resume
    store: CampaignStore
    snapshot: dict[str, Any]  # the campaign's settings, saved as campaign.json (secrets redacted)


def default_folder(campaign_file: Path) -> Path:
    """Where a campaign lives unless --out says: campaigns/<the file's name>."""
    return Path("campaigns") / campaign_file.stem


def redacted(settings: dict[str, Any]) -> dict[str, Any]:
    """A campaign's settings as campaign.json keeps them: the folder is shared, an API key is not."""
    if settings.get("search", {}).get("llm", {}).get("api_key"):
        settings["search"]["llm"]["api_key"] = "(redacted)"
    return settings


def make_proposer(name: str, seed: int = 0, playbook: str | Path | None = None,
                  llm: LLMSettings | None = None, builtin: str | None = None, explore: Explore = "random") -> Proposer:
    """The proposer a campaign asked for; ``builtin``: the job's own playbook (``package:file``).
    ``llm`` comes with the fallback its settings name (the analyst on the same playbooks, by
    default); ``explore``: what the analyst's undirected rule does (``search.explore``). Raises
    PlaybookError or ValueError on bad settings."""
    if name == "analyst":
        rules = (load_playbook(playbook) if playbook else []) + (load_playbook(builtin=builtin) if builtin else [])
        return AnalystProposer(rules, seed, explore)
    if name == "random":
        return RandomProposer(seed)
    if name == "llm":
        settings = llm or LLMSettings()
        researcher = LLMProposer(settings)
        if settings.fallback == "none":
            return researcher
        return WithFallback(researcher, make_proposer(settings.fallback, seed, playbook, builtin=builtin,
                                                      explore=explore))
    raise ValueError(f"unknown proposer {name!r}; expected analyst, random or llm")


def build_proposer(cfg: TreeSearchConfig, file: Path, builtin: str | None = None) -> Proposer | None:
    """The Researcher the search section asks for (MCTS only); bad settings are a ConfigError."""
    if cfg.strategy != "mcts":
        return None
    playbook = cfg.playbook
    if playbook and not Path(playbook).is_absolute():
        playbook = str(file.resolve().parent / playbook)
    try:
        return make_proposer(cfg.proposer, cfg.seed, playbook, cfg.llm, builtin=builtin, explore=cfg.explore)
    except PlaybookError as e:
        raise ConfigError(e.file, e.field, e.message) from None
    except ValueError as e:
        raise ConfigError(file, f"search.{'llm' if cfg.proposer == 'llm' else 'proposer'}", str(e)) from None


# Settings recorded since campaigns were first stored: a campaign without one ran with this value.
ADDED_KEYS: dict[str, Any] = {"backup": "mean"}


def check_folder(folder: Path, cfg: TreeSearchConfig, meta: dict[str, Any], resume: bool, keys: tuple[str, ...],
                 file: Path) -> int:
    """A new campaign needs an empty folder, a resumed one the same settings (``keys`` of ``meta``).
    Returns the number of trials already in the study."""
    found = CampaignStore(folder, cfg.storage).exists()
    if resume and not found:
        raise ConfigError(folder, "--resume", "no campaign to resume in this folder")
    if not resume and found:
        raise ConfigError(folder, "--out", "this folder already holds a campaign; add --resume to continue it, "
                                           "or choose another --out")
    if not resume:
        return 0
    old_meta, n_done = CampaignStore(folder, cfg.storage).peek()
    for key in keys:
        if old_meta.get(key, ADDED_KEYS.get(key)) != meta[key]:
            raise ConfigError(file, key.replace("_id", ""),
                              f"differs from the campaign being resumed in {folder} "
                              f"(was {json.dumps(old_meta.get(key))}); resume with the same file and overrides")
    return n_done


def open_campaign(cfg: TreeSearchConfig, execute: ExecuteConfig, file: Path, folder: Path, resume: bool,
                  meta: dict[str, Any], keys: tuple[str, ...], space: SearchSpace, baseline: Recipe,
                  relations: Relations, playbook: str) -> tuple[Proposer | None, CampaignStore]:
    """What every job's plan does once its own file and space are checked: the Researcher (the job's
    built-in ``playbook``), the folder (``keys`` of ``meta`` kept on --resume), the study's sampler
    and pruner, the store. Raises ConfigError (exit 2) before anything is written."""
    proposer = build_proposer(cfg, file, builtin=playbook)
    n_done = check_folder(folder, cfg, meta, resume, keys, file)
    # A resumed campaign draws afresh: a sampler re-seeded identically would replay its first picks.
    sampler = make_sampler(cfg.strategy, space, baseline, cfg.seed + n_done, relations, execute.parallel,
                           order_seed=cfg.seed)
    store = CampaignStore(folder, cfg.storage, sampler, execute.heartbeat_s, db_retry_s=execute.db_retry_s,
                          pruner=make_pruner(cfg.pruning))
    return proposer, store
