"""Moved to core/options.py (the engine holds no command-line code). speed/verify.py still imports
it from here until its import line reads ``from recipetune.core import options as opt``; then this
file goes."""

from recipetune.core.options import Executor, RayAddress, option_overrides

__all__ = ["Executor", "RayAddress", "option_overrides"]
