"""Every shape of task the decontamination benchmark plants leaks in: its generator, the batch it came
in, whether it is still held out, and since when the rule was tuned on it.

The rule (``src/recipetune/data/decontam.py``) was built with the nine shapes of batch ``built``. The
others were written later to see it on shapes it was not built with, each batch by an engineer who did
not change the rule (from batch 4 on, who never read it either) and run against the rule once it was
final. A shape is *tuned on* from the day its misses or removals were read (``tuned_since``); it is
*held out* while they were never read, so its figures still say how the rule does on a shape it has
not seen. The history, batch by batch, with the commands: docs/benchmarks.md, "Decontamination on
shapes it was not built with"; the notes each batch was written with (what each shape draws, its natural
overlaps at seed 0) are in the batch files before this package: ``git show
a449ae8:benchmarks/decontamination_heldout4.py`` (``_heldout.py`` ... ``_heldout7.py``).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from .base import Shape
from .natural import (
    append_calls,
    arithmetic_assignments,
    assert_calls,
    attribute_assignments,
    chat,
    class_headers,
    code,
    docstring_summaries,
    docstrings,
    except_or_raise_lines,
    for_loops,
    if_headers,
    import_lines,
    keyword_calls,
    raise_statements,
    return_statements,
    short_code,
    signatures,
    with_statements,
)
from .prose import (
    addresses,
    bank_transactions,
    calendar_events,
    commit_messages,
    dialogue,
    ingredient_lines,
    match_scores,
    shipping_notices,
    trivia_questions,
    word_problems,
)
from .records import (
    arith,
    config_lines,
    csv_rows,
    email_headers,
    expressions,
    html_elements,
    json_records,
    literals,
    log_lines,
    shell_commands,
    sql,
    urls,
)


@dataclass(frozen=True)
class Entry:
    make: Callable[[random.Random], Shape]
    batch: str  # "built" (the rule was built with it), "unseen" (the first six it was not), "1" ... "7"
    held_out: bool  # its misses and removals never read: never explained (``--explain`` skips it)
    tuned_since: str | None  # the day its misses or removals were first read; None while held out


def _batch(batch: str, since: str | None, **shapes: Callable[[random.Random], Shape]) -> dict[str, Entry]:
    return {name.replace("_", " "): Entry(make, batch, since is None, since) for name, make in shapes.items()}


REGISTRY: dict[str, Entry] = {
    # the nine the rule was built with (the first five from the start, the four generated ones later)
    **_batch("built", "2026-12-01", arith=arith, docstring=docstrings),
    "instruction+code": Entry(code, "built", False, "2026-12-01"),
    **_batch("built", "2026-12-01", chat=chat),
    **_batch("built", "2026-12-03", short_code=short_code),
    **_batch("built", "2026-12-04", sql=sql, word_problem=word_problems, json_record=json_records, dialogue=dialogue),
    # the first shapes it was not built with: three tuned on from the start, literal and url once read
    **_batch("unseen", "2026-12-05", csv_row=csv_rows, signature=signatures, expression=expressions),
    **_batch("unseen", None, log_line=log_lines),
    **_batch("unseen", "2026-12-05", literal=literals, url=urls),
    # the batches written apart from the rule: 1-3 read in the third and fourth rounds (2026-12-05)
    **_batch("1", "2026-12-05", import_line=import_lines, shell_command=shell_commands, address=addresses,
             calendar_event=calendar_events),
    **_batch("2", "2026-12-05", class_header=class_headers, raise_statement=raise_statements,
             html_element=html_elements),
    **_batch("3", "2026-12-05", assert_call=assert_calls, keyword_call=keyword_calls, email_header=email_headers),
    # batch 4: its two code shapes read in the fifth round; batch 5: its two code shapes read after it
    "with statement": Entry(with_statements, "4", False, "2026-12-05"),
    "for-loop header": Entry(for_loops, "4", False, "2026-12-05"),
    **_batch("4", None, trivia_question=trivia_questions, config_line=config_lines),
    **_batch("5", "2026-12-05", return_statement=return_statements, attribute_assignment=attribute_assignments),
    **_batch("5", None, commit_message=commit_messages, ingredient_line=ingredient_lines),
    # batches 6 and 7: measured once each, never explained (batch 7's re-instructed misses were read after)
    **_batch("6", None, if_header=if_headers, append_call=append_calls, shipping_notice=shipping_notices,
             match_score=match_scores),
    **_batch("7", None, except_or_raise_line=except_or_raise_lines, arithmetic_assignment=arithmetic_assignments,
             docstring_summary=docstring_summaries, bank_transaction=bank_transactions),
}
BUILT = [name for name, e in REGISTRY.items() if e.batch == "built"]
UNSEEN = [name for name, e in REGISTRY.items() if e.batch != "built"]
HELD_OUT = [name for name, e in REGISTRY.items() if e.held_out]
