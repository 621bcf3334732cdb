"""Decontamination on short inputs of shapes it was not built with (issue 50): short literal rows,
expressions, signatures that share parameter lists. Each rule at its edge, beside the equivalent case
it must keep (data/decontam.py, data/frames.py)."""

from __future__ import annotations

import random

import pytest

from recipetune.data.decontam import ContaminationIndex
from recipetune.data.evidence import RENAME_CHANCE
from recipetune.data.ops import Decontaminate


def settings(**kw) -> Decontaminate:
    return Decontaminate(op="decontaminate", **kw)


def index_of(inputs: list[str], extra: int = 200) -> ContaminationIndex:
    """The given inputs and, up to ``extra`` in all, rows of three names no other row has."""
    rows = list(inputs) + [f"u{k}a,u{k}b,u{k}c" for k in range(extra - len(inputs))]
    return ContaminationIndex({"validation": [[r] for r in rows[::2]], "test": [[r] for r in rows[1::2]]},
                              settings(near_threshold=1.0))


def csv_index(first: int, third: int) -> ContaminationIndex:
    """200 rows of three names; `kilo,lima,mike` among them, `kilo` first in ``first`` of them and `lima`
    second in ``third`` (never with the other: the run `kilo , lima ,` is that row's alone)."""
    rows = ["kilo,lima,mike"]
    rows += [f"kilo,x{k},y{k}" for k in range(first - 1)] + [f"p{k},lima,q{k}" for k in range(third - 1)]
    return index_of(rows)


@pytest.mark.parametrize("third, found", [(3, True), (4, False)])
def test_a_short_row_with_one_value_changed_is_a_copy_where_the_rest_is_improbable(third, found):
    """`kilo,lima,zulu`: two names kept in their places, each in 3 of 200 rows there (not rare, 1%, so
    the word-count rule says nothing): a legitimate row matches that frame by chance 200 x 3/200 x
    3/200 = 0.045 times (<= 0.05, a copy); with `lima` there in 4 rows, 0.06 times: another row."""
    index = csv_index(3, third)
    assert (3 * third / 200 <= RENAME_CHANCE) is found
    assert (index.hits(["kilo,lima,zulu"]) == ("validation", "renamed copy")) is found
    assert index.hits(["kilo,lima,mike"]) == ("validation", "same input")  # (whatever the counts)
    assert index.hits(["kilo,yank,zulu"]) is None  # two changed
    assert index.hits(["kilo,lima"]) is None  # shorter than the row: no copy of it


def test_a_renamed_short_row_inside_a_longer_one_counts_every_place_it_could_lie():
    """The same copy with a value before it could lie at 3 places of that field: 3 x 0.045 > 0.05. Its
    run is found whole where its names are rarer (in 1 row each: 3 x 0.005)."""
    assert csv_index(3, 3).hits(["true,kilo,lima,zulu"]) is None
    assert csv_index(1, 1).hits(["true,kilo,lima,zulu"]) == ("validation", "renamed copy")


def test_one_value_kept_is_never_enough():
    """`kilo,lima` -> `kilo,zulu` keeps one name however rare (347+589= -> 347+588=: another sum)."""
    index = index_of(["kilo,lima"])
    assert index.hits(["kilo,zulu"]) is None
    assert index.hits(["kilo,lima"]) == ("validation", "same input")


def flags_index() -> ContaminationIndex:
    """Rows of a city, two flags and a city; `, true , false ,` in 20 of 200: shared text, masked, so
    `lodz,true,false,bergen` varies in two tokens only, one anchor pair."""
    rows = ["lodz,true,false,bergen"] + [f"c{k},true,false,d{k}" for k in range(19)]
    return index_of(rows)


def test_an_input_of_two_varying_tokens_with_one_changed_keeps_too_little_to_say_which():
    """Its anchors find it with either token changed (before issue 50 its one anchor was the pair `lodz
    bergen`), and what is left alike is one city and the flags, which come together (`false` follows
    `true` there in every other input): a legitimate row matches `lodz,true,false,_` by chance 200 x
    1/200 x 20/200 x 19/19 = 0.1 times (issue 50's second round multiplied the flags' shares as if
    apart, 0.01, and took it for a copy)."""
    index = flags_index()
    assert index.hits(["lodz,true,false,bergen"]) == ("validation", "same input")
    assert index.hits(["lodz,true,false,utrecht"]) is None
    assert index.hits(["graz,true,false,bergen"]) is None
    assert index.hits(["graz,true,false,utrecht"]) is None  # what every row of its kind shares


def expressions_index() -> tuple[ContaminationIndex, list[str]]:
    r = random.Random(7)
    rows = [f"({r.randint(2, 99)} - {r.randint(2, 99)}) * {r.randint(2, 99)} + {r.randint(2, 99)}"
            for _ in range(150)]
    rows += [f"{r.randint(100, 999)}+{r.randint(100, 999)}=" for _ in range(50)]
    return index_of(rows), rows


def test_an_expression_with_one_number_changed_is_a_copy_and_with_two_another():
    """Four numbers of 2-99 (each in a few percent of the inputs: none rare, fewer than 4 kept): three
    in their places among the operators are improbable by chance; two are another expression, and a
    sum with one of its two numbers changed is another sum."""
    index, rows = expressions_index()
    e = rows[0]
    a, rest = e[1:].split(" - ", 1)
    one = e.replace(f"({a} ", "(101 ", 1)
    assert index.hits([one]) == ("validation", "renamed copy")
    assert index.hits([one.replace(" * ", " * 1", 1)]) is None  # and a second number changed
    total = rows[150]
    x = total.split("+")[0]
    assert index.hits([total.replace(x, "123", 1)]) is None


SIGNATURES = ["def __init__(self, y):", "def __init__(self, x, y):", "def __init__(self, zq):"]
SIGNATURES += [f"def __init__(self, p{k}):" for k in range(20)]  # `def __init__ ( self ,`: shared text
SIGNATURES += [f"def g{k}(self, y, c{k}):" for k in range(6)]  # `y` in 8 inputs of 200: not rare (1%)
SIGNATURES += [f"def m{k}(self, a{k}, b{k}=None):" for k in range(100)]


def signature_index(*inputs: str) -> ContaminationIndex:
    return index_of(SIGNATURES + list(inputs))


def how(index: ContaminationIndex, text: str) -> str | None:
    """What the row is found as (whichever split)."""
    hit = index.hits([text])
    return hit and hit[1]


def test_a_third_method_with_a_parameter_list_two_evaluation_inputs_share_is_no_copy():
    """`http_error_301` and `http_error_302` share their parameters (its 8-grams are most of either):
    `http_error_401` with them is one more method of that family (before: removed by 8-grams). With one
    of them alone in the evaluation inputs, it is a renamed copy, and a row that is neither one token
    from it (a parameter added) is still judged by its n-grams."""
    params = "(self, req, fp, code, msg, headers):"
    family = signature_index(f"def http_error_301{params}", f"def http_error_302{params}")
    assert how(family, f"def http_error_401{params}") is None
    assert how(family, f"def http_error_302{params}") == "8-grams"  # (a copy)
    alone = signature_index(f"def http_error_302{params}")
    assert how(alone, f"def http_error_401{params}") == "renamed copy"


def test_an_input_that_says_one_common_name_is_a_copy_only_as_all_its_field_says():
    """`def __init__(self, y):` varies only in `y ) :` (the rest is shared text): one name and
    punctuation, found in `def sety(self, y):` as 3 of its 5 varying tokens; that says no more which
    input it is than `y` does, a name in 8 of 200 inputs (before: a copy). The input itself is a copy;
    `x , y ) :` says two names; `zq ) :` one that only that input has, inside a longer row. Where the
    row changes the input's own shared text (`__init__` to `setzq`), one rare name kept is 1 in 200 at
    each of its 3 places: another method (issue 50's fifth round: before, a copy)."""
    index = signature_index()
    assert how(index, "def sety(self, y):") is None
    assert how(index, "def __init__(self, y):") == "same input"
    assert how(index, "def setxy(self, x, y):") == "contains a whole input"
    assert how(index, "def __init__(self, zq): pass") == "contains a whole input"
    assert how(index, "def setzq(self, zq):") is None


TABS = ("billing", "orders", "profile", "settings", "keys", "teams", "alerts", "usage", "tokens", "plans",
        "audit", "hooks")


def url_index() -> ContaminationIndex:
    """200 links `open link|url https://h<k>.example.com/users/<name>?tab=<tab>&v=<n>`, each user's name
    its own: the host (1 of 3), the lead word (1 of 2), the tab (1 of 12: 8%) and the version (1 of 9)
    are common enough to be shared text, so what varies of an input is its user's name. The tab and
    the version are the input's values all the same (8% and a number: no word of the task's structure)."""
    rows = [f"open {('link', 'url')[k % 2]} https://h{k % 3}.example.com/users/f{k}.l{k}?tab={TABS[k % 12]}"
            f"&v={k % 9 + 1}" for k in range(199)]
    return index_of(["open link https://h0.example.com/users/yasmin.okafor?tab=billing&v=7", *rows])


def test_an_input_whose_name_a_row_holds_with_other_values_in_its_shared_places_is_another_input():
    """A user's name is all that varies of the link, but the row that holds it with another tab and
    another version is another link of the template (before: `same input`, 0.84% of the clean rows of
    issue 50's URL task on seed 1). With only the version changed it is the link with one value changed,
    judged as such: a renamed copy. Among other links, and with the lead word of the task reworded, it
    is the input."""
    index = url_index()
    link = "https://h0.example.com/users/yasmin.okafor?tab=billing&v=7"
    assert how(index, f"open link {link}") == "same input"
    assert how(index, f"open link {link.replace('billing&v=7', 'orders&v=5')}") is None
    assert how(index, f"open link {link.replace('v=7', 'v=5')}") == "renamed copy"
    assert how(index, f"open link {link} or https://h2.example.com/users/f3.l3?tab=keys&v=2") == \
        "contains a whole input"
    assert how(index, f"open url {link}") == "same input"  # (`link` is in half the inputs: the task's word)


def imports_index(together: int) -> ContaminationIndex:
    """`from tkinter.ttk import scrollbar` among 150 `from m<k>.s<k> import n<k>` lines, with
    ``together`` more lines `import tkinter.ttk as t<k>`: there `ttk` follows `tkinter` each time."""
    rows = ["from tkinter.ttk import scrollbar", *(f"import tkinter.ttk as t{k}" for k in range(together))]
    rows += [f"from m{k}.s{k} import n{k}" for k in range(150)]
    return index_of(rows)


@pytest.mark.parametrize("together, copy", [(0, True), (3, False)])
def test_words_that_come_together_are_counted_once(together, copy):
    """`from tkinter.ttk import frame` keeps `from`, `tkinter`, `ttk` and `import` in place. Where the
    two names come only in this input, a legitimate line matches that by chance 200 x 150/200 x 1/200 x
    1/200 x 150/200 = 0.003 times: a copy. Where `ttk` follows `tkinter` in three more inputs, `ttk`
    says nothing once `tkinter` is there: 200 x 150/200 x 4/200 x 3/3 x 150/200 = 2.3, another line of
    that module (issue 50, third round: stdlib import lines, 1.5% of the clean rows removed)."""
    assert (imports_index(together).hits(["from tkinter.ttk import frame"]) == ("validation", "renamed copy")) is copy


def test_a_word_of_the_tasks_structure_changed_is_a_copy_only_with_enough_values_left():
    """The verb of these one-line docs is the task's vocabulary (each in a third of the inputs): with it
    changed, two values left (`tcp server`) may be another function's doc; six say which input it is."""
    rows = ["Create a TCP server.", "Create a TCP server on port 8080 for host alpha."]
    rows += [f"{verb} the w{k} thing." for k in range(66) for verb in ("Create", "Connect", "Close")]
    index = index_of(rows)
    assert how(index, "Connect a TCP server.") is None
    assert how(index, "Connect a TCP server on port 8080 for host alpha.") == "renamed copy"
    assert how(index, "Create a TCP server.") == "same input"
