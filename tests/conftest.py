"""Fixtures shared by several test files."""

from ft_fixtures import tiny_ft  # noqa: F401 - a tiny fine-tuning task and model in tmp_path
