"""The executor a campaign's ``execute:`` section names.

Apart from executor.py (the interface and the local executor) so that the interface never imports
an implementation: ray.py imports the interface, and only this module knows both.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from recipetune.core.errors import ConfigError
from recipetune.execute.config import ExecuteConfig
from recipetune.execute.executor import Executor, LocalExecutor


def make_executor(settings: ExecuteConfig, n_devices: int, file: Path, shared: Sequence[Path] = ()) -> Executor:
    """The executor ``settings`` name, for trials of ``n_devices`` processes; ConfigError (exit 2) when bad.

    ``file`` is the campaign file the settings came from, named in the error. ``shared``: the campaign
    folder and the files its runs read, which every node of a cluster must see at the same paths
    (checked before anything runs; nothing to check on one machine)."""
    if settings.executor == "local":
        if settings.parallel > 1:
            raise ConfigError(file, "--parallel", "the local executor runs one trial at a time: two measured "
                              "runs on one machine would share its hardware; use --executor ray")
        return LocalExecutor(settings.loss_runs)
    try:
        from recipetune.execute.ray import RayExecutor
    except ImportError:
        raise ConfigError(file, "--executor", "ray is not installed: pip install 'recipetune[ray]'") from None
    return RayExecutor(settings, n_devices, file, shared)
