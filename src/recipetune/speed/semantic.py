"""The global batch as a knob of the speed job, bounded by a measured critical batch size (CBS).

Below the CBS a batch k times larger trains about as well per token in k times fewer steps, so more
data parallelism pays; above it the same loss costs more tokens. A campaign that lists the global
batch in ``search.allow_semantic`` must therefore say where the CBS is (``search.global_batch``):

- a candidate whose global batch B exceeds the bound is a static violation (``above-critical-batch-size``);
- its learning rate follows the batch: ``lr = lr0 * (B / B0)^p`` (p = 1/2 for ``sqrt``, the rule for Adam),
  set by the campaign before the static check, and only that exact value is let through;
- a trial trains for the tokens of the baseline profile's runs (fewer, larger steps), and the guard
  compares its loss with the baseline's at equal tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipetune.config import Campaign
from recipetune.core.batch import cbs_bound, scale_lr
from recipetune.core.errors import ConfigError
from recipetune.core.recipe import Recipe
from recipetune.guard.static import Violation

RULE = "above-critical-batch-size"


@dataclass(frozen=True)
class BatchRule:
    knob: str  # the global-batch knob
    lr_knob: str
    b0: int  # the baseline's global batch
    lr0: float  # the baseline's learning rate
    bound: int  # the largest global batch allowed
    source: str  # where the bound comes from, for messages
    scaling: str  # sqrt | linear | none

    def lr_for(self, batch: int) -> float:
        return scale_lr(self.lr0, batch / self.b0, self.scaling)

    def couple(self, recipe: Recipe) -> tuple[Recipe, str]:
        """The recipe with its learning rate following its global batch, and a note of the edit ('' if none)."""
        if self.scaling == "none":
            return recipe, ""
        batch, lr = int(recipe[self.knob]), recipe[self.lr_knob]
        want = self.lr_for(batch)
        if lr == want:
            return recipe, ""
        note = (f"{self.lr_knob} {lr:.6g} -> {want:.6g} ({self.scaling} rule: {self.knob} {self.b0} -> {batch}, "
                f"k = {batch / self.b0:.4g})")
        return recipe.with_(**{self.lr_knob: want}), note

    def allow(self, recipe: Recipe, allow_semantic: list[str]) -> list[str]:
        """The campaign's allowed semantic knobs, plus the learning rate when it is exactly the coupled value."""
        lr = recipe[self.lr_knob]
        if self.scaling == "none" or lr == self.lr0 or lr != self.lr_for(int(recipe[self.knob])):
            return list(allow_semantic)
        return sorted({*allow_semantic, self.lr_knob})

    def violations(self, recipe: Recipe) -> list[Violation]:
        """A global batch grown beyond the bound (a baseline already above it may still shrink)."""
        batch = int(recipe[self.knob])
        if batch <= max(self.bound, self.b0):
            return []
        return [Violation(self.knob, RULE, f"{batch} is above the bound {self.bound} ({self.source}): beyond the "
                                           "critical batch size a larger batch needs more tokens for the same loss")]

    def trial_steps(self, recipe: Recipe, steps: int, profile_steps: int) -> int:
        """``steps`` at the baseline's batch; else the tokens of the baseline profile's runs in fewer, larger
        steps, so the screen compares the final (validation) losses at equal tokens. A shorter run would be
        compared on smoothed training losses, whose windows of equal steps span k times the tokens."""
        batch = int(recipe[self.knob])
        return steps if batch == self.b0 else max(2, round(profile_steps * self.b0 / batch))

    def meta(self) -> dict[str, Any]:
        return {"knob": self.knob, "lr_knob": self.lr_knob, "bound": self.bound, "source": self.source,
                "lr_scaling": self.scaling}


def batch_rule(campaign: Campaign) -> BatchRule | None:
    """The campaign's global-batch rule, or None when the global batch stays fixed; ConfigError (exit 2) if unsound."""
    cfg, path, knobs = campaign.config.search, campaign.path, campaign.workload.knobs()
    gb = cfg.global_batch
    knob = gb.knob if gb is not None else "global_batch_size"
    if knob not in cfg.allow_semantic:
        if gb is not None:
            raise ConfigError(path, "search.global_batch",
                              f"has no effect unless '{knob}' is listed in search.allow_semantic")
        return None
    if gb is None or (gb.max is None and gb.cbs_summary is None):
        raise ConfigError(path, "search.allow_semantic",
                          f"'{knob}' may only grow up to the critical batch size (beyond it more data parallelism "
                          "no longer pays: the same loss needs more tokens); set search.global_batch.cbs_summary "
                          "to a summary.json of `recipetune cbs fit|sweep`, or search.global_batch.max")
    for field, name in (("knob", knob), ("lr_knob", gb.lr_knob)):
        if name not in knobs:
            raise ConfigError(path, f"search.global_batch.{field}", f"the {campaign.workload.kind} workload has no "
                                                                    f"knob '{name}'")
    if gb.lr_scaling != "none" and (gb.lr_knob in cfg.knobs or gb.lr_knob in cfg.allow_semantic):
        where = "search.knobs" if gb.lr_knob in cfg.knobs else "search.allow_semantic"
        raise ConfigError(path, f"{where}.{gb.lr_knob}",
                          f"'{gb.lr_knob}' follows the global batch (lr_scaling: {gb.lr_scaling}); set "
                          "search.global_batch.lr_scaling: none to choose it yourself")
    base = Recipe({**knobs.defaults(), **campaign.baseline})
    if isinstance(base[knob], bool) or not isinstance(base[knob], int):
        raise ConfigError(path, "search.global_batch.knob", f"'{knob}' must be an integer knob (a batch size)")
    lr0 = base[gb.lr_knob]
    if gb.lr_scaling != "none" and not (isinstance(lr0, int | float) and math.isfinite(lr0) and lr0 > 0):
        raise ConfigError(path, f"baseline.{gb.lr_knob}", f"must be a positive number to scale, got {lr0!r}")
    if gb.max is not None:
        bound, source = gb.max, "search.global_batch.max"
    else:
        assert gb.cbs_summary is not None
        summary = Path(gb.cbs_summary).expanduser()
        if not summary.is_absolute():
            summary = (path.resolve().parent / summary).resolve()
        if not summary.is_file():
            raise ConfigError(path, "search.global_batch.cbs_summary",
                              f"no such file: {summary} (write it with `recipetune cbs fit|sweep|scale`)")
        try:
            bound = cbs_bound(summary, gb.group, gb.conservative)
        except ValueError as e:
            raise ConfigError(path, "search.global_batch.cbs_summary", str(e)) from None
        source = f"{'lower end of the 95% CI of ' if gb.conservative else ''}B* in {summary}"
    return BatchRule(knob, gb.lr_knob, int(base[knob]), float(lr0) if isinstance(lr0, int | float) else math.nan,
                     bound, source, gb.lr_scaling)
