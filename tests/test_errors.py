"""Bad input is reported once and completely: every invalid field, with what it allows."""

from __future__ import annotations

from pathlib import Path
from typing import Literal, get_args

import pytest
from pydantic import BaseModel, Field, ValidationError
from typer.testing import CliRunner

from recipetune.cli import app
from recipetune.config import SearchConfig, load_campaign
from recipetune.core.errors import ConfigError, validation_error

THREE_BAD = "baseline: {model: nano}\nsearch: {strategy: foo, budget: {trials: 0}}\nrun: {steps: -1}\n"


class Inner(BaseModel):
    rate: float = Field(0.5, gt=0, le=1)


class Outer(BaseModel):
    mode: Literal["fast", "slow"] = "fast"
    inner: Inner = Inner()


def _error(raw: dict, **kw) -> ConfigError:
    with pytest.raises(ValidationError) as e:
        Outer.model_validate(raw)
    return validation_error(e.value, "f.yaml", **kw)


def test_every_bad_field_is_named_with_its_allowed_values():
    err = _error({"mode": "medium", "inner": {"rate": 2}})
    assert str(err) == "f.yaml: mode: must be one of 'fast', 'slow' (got 'medium'); inner.rate: must be <= 1 (got 2)"
    assert err.field == "mode"  # the first, for code that reads one field


def test_a_prefix_places_a_nested_value_in_its_file():
    err = _error({"inner": {"rate": 0}}, prefix="search.data.step")
    assert str(err) == "f.yaml: search.data.step.inner.rate: must be > 0 (got 0)"


def test_a_campaign_file_reports_all_its_bad_fields(tmp_path: Path):
    bad = tmp_path / "c.yaml"
    bad.write_text(THREE_BAD)
    with pytest.raises(ConfigError) as err:
        load_campaign(bad)
    text = str(err.value)
    choices = ", ".join(repr(c) for c in get_args(SearchConfig.model_fields["strategy"].annotation))
    assert f"search.strategy: must be one of {choices} (got 'foo')" in text
    assert "search.budget.trials: must be >= 1 (got 0)" in text  # a nested field: its dotted path
    assert "run.steps: must be >= 1 (got -1)" in text


def test_a_bad_workload_kind_names_its_choices(tmp_path: Path):
    bad = tmp_path / "c.yaml"
    bad.write_text("workload: {kind: docker}\n")
    with pytest.raises(ConfigError) as err:
        load_campaign(bad)
    assert err.value.field == "workload.kind" and "one of 'reference', 'command' (got 'docker')" in str(err.value)


def test_a_playbook_keeps_its_own_error_type(tmp_path: Path):
    from recipetune.engine.playbook import PlaybookError, load_playbook

    book = tmp_path / "book.yaml"
    book.write_text("rules:\n  - {name: a, why: b}\n  - {name: c, why: d, action: {}, extra: 1}\n")
    with pytest.raises(PlaybookError) as err:
        load_playbook(book)
    assert "rules.0.action" in str(err.value) and "rules.1.extra" in str(err.value)


def test_a_data_step_is_named_by_its_place_in_the_campaign():
    from recipetune.finetune.space import check_data_steps

    with pytest.raises(ConfigError) as err:
        check_data_steps({"ascii": {"op": "filter_charset", "charset": "greek"}}, "ft.yaml")
    assert err.value.field == "search.data.ascii.charset"
    assert "must be one of 'ascii', 'latin', 'cyrillic' (got 'greek')" in str(err.value)


@pytest.mark.parametrize("command", ["run", "verify"])
def test_three_bad_fields_exit_2_through_the_cli_all_named(tmp_path: Path, command: str):
    bad = tmp_path / "c.yaml"
    bad.write_text(THREE_BAD)
    out = tmp_path / "never"
    files = [str(bad)] * (2 if command == "verify" else 1)  # verify reads a baseline and a candidate file
    res = CliRunner().invoke(app, [command, *files, "--out", str(out)])
    assert res.exit_code == 2, res.output
    text = " ".join(res.output.split())
    for field in ("search.strategy", "search.budget.trials", "run.steps"):
        assert field in text
    assert "Traceback" not in res.output and not out.exists()
