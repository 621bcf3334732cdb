"""A short evaluation input found in a training row without its shared text (issue 50, fifth round,
data/evidence.py: ``Evidence.improbable``): what varies of `with self.open(helper.TESTFN, encoding="utf-8")
as f:` is `helper.TESTFN`, the rest is masked for being common; a row that holds it with other shared
text around it is a copy only where what it kept of the input is improbable by chance. Before, any row
that held it was one (`with open(helper.TESTFN, "rb") as fp:`, another line of another test). At the
edge (one other evaluation input holds what was kept), in both modes (among 100 evaluation inputs or
more the chance decides; among fewer, the rule counts names), beside the copies it must still find."""

from __future__ import annotations

import pytest

from recipetune.data.decontam import ContaminationIndex
from recipetune.data.evidence import RARE_MIN_INPUTS
from recipetune.data.ops import Decontaminate

INPUT = 'with self.open(helper.TESTFN, encoding="utf-8") as f:'
RARE = 'with self.open(kilo.lima.mike, encoding="utf-8") as f:'


def index(n: int, others: int) -> ContaminationIndex:
    """``n`` evaluation inputs: ``INPUT``, ``RARE``, ``others`` more that hold `open(helper.TESTFN,`
    (with other modes and names), and the rest in two common shapes with a name each."""
    rows = [INPUT, RARE] + [f'with self.open(helper.TESTFN, "w{k}") as g{k}:' for k in range(others)]
    rows += [f'with open(name{k}, "rb") as f:' for k in range((n - len(rows)) // 2)]
    rows += [f'with self.open(name{k + 500}, encoding="utf-8") as f:' for k in range(n - len(rows))]
    return ContaminationIndex({"validation": [[r] for r in rows[::2]], "test": [[r] for r in rows[1::2]]},
                              Decontaminate(op="decontaminate", near_threshold=1.0))


def how(index: ContaminationIndex, row: str) -> str | None:
    hit = index.hits([row])
    return None if hit is None else hit[1]


OTHER_SHARED_TEXT = ['with open(helper.TESTFN, "rb") as fp:',  # `self.`, the mode and the name changed
                     'with self.open(helper.TESTFN) as f:']  # the encoding left out


@pytest.mark.parametrize("others, copy", [(0, True), (1, False), (4, False)])
def test_what_varies_of_a_short_input_without_its_shared_text_is_a_copy_only_where_improbable(others, copy):
    """`open ( helper . testfn ,` kept (the rest of the input's field open): where no other evaluation
    input holds it, its names are 1 in 200 at their places (a copy); where one other does, a legitimate
    row holds it by chance about once at each of the row's 9 places: another line of another test."""
    ix = index(200, others)
    assert ix.inputs[0].varying == ("helper", ".", "testfn")  # (the fixture: all else is shared text)
    for row in OTHER_SHARED_TEXT:
        assert (how(ix, row) is not None) is copy, row


@pytest.mark.parametrize("others", [0, 1, 4])
def test_the_input_whole_and_a_rare_input_without_its_shared_text_are_still_copies(others):
    ix = index(200, others)
    assert how(ix, INPUT) == "same input"
    assert how(ix, f"x = 1\n{INPUT}\ny = 2") == "contains a whole input"  # embedded: its field whole
    assert how(ix, f"# open the file\n{INPUT}") == "contains a whole input"  # a lead-in before it
    assert how(ix, 'with open(kilo.lima.mike, "rb") as fp:') == "contains a whole input"  # three rare names
    assert how(ix, RARE.replace("utf-8", "utf-16")) == "renamed copy"  # one value changed: the renamed rule


@pytest.mark.parametrize("n, rare", [(RARE_MIN_INPUTS - 2, False), (RARE_MIN_INPUTS, True)])
def test_among_few_inputs_what_varies_whole_is_enough(n, rare):
    """Among fewer than ``RARE_MIN_INPUTS`` evaluation inputs how common a run is cannot be told: the
    rule counts names, and two (`helper`, `TESTFN`) say which input it is, as before this round."""
    ix = index(n, 3)
    assert ix.inputs[0].varying == ("helper", ".", "testfn") and bool(ix.evidence.rare_rows) is rare
    assert (how(ix, OTHER_SHARED_TEXT[0]) is None) is rare
    assert how(ix, 'with open(kilo.lima.mike, "rb") as fp:') == "contains a whole input"
