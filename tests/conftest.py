"""Fixtures shared by several test files, and how pytest-xdist shares the tests out (scripts/test.sh)."""

from collections import Counter
from pathlib import Path

import pytest
from ft_fixtures import tiny_ft  # noqa: F401 - a tiny fine-tuning task and model in tmp_path

# The modules that start a Ray cluster: one cluster on the machine at a time (a second would be the one
# address 'auto' finds), so under xdist they share a worker and run one after the other.
RAY_MODULES = {"test_distributed_ray", "test_distributed_cluster"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The modules with the most slow tests first (a stable sort: each module's own order kept), so a
    # parallel run does not end on one long module while the other workers idle.
    slow = Counter(item.path.stem for item in items if item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path.stem])


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # without pytest-xdist the tests run one at a time
    LoadScopeScheduling = None

if LoadScopeScheduling is not None:
    class _ByModule(LoadScopeScheduling):
        """A module's tests on one worker: its module-scoped fixtures (a baseline profiled over seeds, a
        reference run, a Ray cluster) are built once, not once per worker; the Ray modules as one unit.
        (xdist's own --dist loadgroup marks a group in the node id, which pytest 9 no longer lets it do.)"""

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "ray" if Path(module).stem in RAY_MODULES else module

    def pytest_xdist_make_scheduler(config: pytest.Config, log) -> LoadScopeScheduling:
        config.option.loadscopereorder = False  # keep the order above: the longest modules first
        return _ByModule(config, log)
