"""Planted leaks: decontamination's recall per kind of leak and its false removals, per shape of task.

    python benchmarks/decontamination.py --out benchmarks/results/decontamination.md   # the 9 shapes it was built with
    python benchmarks/decontamination.py --shapes unseen --out benchmarks/results/decontamination_unseen.md  # 32 more
    python benchmarks/decontamination.py --set ngram=13 common_share=0.1     # other settings
    python benchmarks/decontamination.py --before                            # + the rule of commit 8464ad6
    python benchmarks/decontamination.py --shapes "short code" --explain 10  # which rule removed which clean rows

The shapes, their generators and the registry saying which are held out: ``benchmarks/decontam/``
(``registry.py``); the measurement: ``decontam/measure.py``; ``benchmarks/decontamination_hashes.py``
hashes every generated row and planted leak.

Each shape of task is built from what is on the machine (generated sums, the standard library's
docstrings, function sources and expressions): 200 validation and 200 test rows, and a pool of
training rows that are not copies of them. "Not a copy" is decided apart from the rule under test:
a pool row whose exact character 5-gram Jaccard similarity with some evaluation input reaches 0.5 is
a natural overlap (the stdlib repeats itself): kept in the training rows, neither planted nor clean,
and reported apart (how many the rule removed). A training input that holds a whole evaluation input
and is at most about twice as long is such an overlap; one more than twice as long is clean. Then 40
leaks of each kind are planted, half from validation and half from test rows:

- ``exact``: the evaluation input copied;
- ``case+space``: the same with its case changed and runs of spaces, tabs or newlines inserted;
- ``re-instructed``: what comes before the evaluation content reworded (the instruction, the chat
  turn's lead-in) or, where nothing does, a few words put before it;
- ``embedded``: the evaluation content inside a longer input, with up to as much other text again
  around it (words before and after it; for code expressions, code around it: ``print(...)``,
  ``x = ...``);
- ``one token changed``: an identifier renamed everywhere (the function's name, a word of a
  docstring); for short code, one name or one number changed. Not planted for sums: a sum with one
  number changed is another question with another answer.

A kind that cannot apply to a row is not planted from it (a row without a word to rename; an
evaluation input of fewer than 3 tokens, a bare name, is a copy only when copied whole, so it is not
embedded or changed). Recall = planted rows removed / planted; false removals = clean rows removed /
clean rows (the target: at most 1%); precision = planted rows removed / (planted + clean rows
removed). Beside the one-token recall: those of the one-token copies that can be told apart from the
task's legitimate rows (no other row and no other input fills the copy's frame), and the legitimate
rows of that same form (an input with one token changed, its frame theirs alone) the rule removed:
what finding those copies costs (``told_apart``; both decided from the rows, apart from the rule).
The rows are input parts as the task hands them to decontamination
(``TaskConfig.input_parts``). ``--before`` also runs the previous rule, which matched the rendered
prompt (template included) with datasketch's MinHash. Besides its columns, each shape reports rows
removed / true copies: every row the rule removed against the planted leaks plus the pool rows that
are an evaluation input exactly (normalised); the target on a task with many near-identical legitimate
rows (signature) is at most 1.5x. A held-out shape is never explained (``--explain`` skips it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from decontam.base import EVAL, PER_KIND
from decontam.measure import before_rule, current_rule, measure, table
from decontam.registry import BUILT, REGISTRY, UNSEEN

from recipetune.data.ops import Decontaminate

GROUPS = {"built": BUILT, "unseen": UNSEEN, "all": list(REGISTRY)}


def shapes_named(text: str) -> list[str]:
    """Shape names and groups (``built``, ``unseen``, ``all``), comma-separated: an unknown one exits 2."""
    out: list[str] = []
    for name in (s.strip() for s in text.split(",")):
        if name not in GROUPS and name not in REGISTRY:
            print(f"--shapes: no shape {name!r}; the groups: {', '.join(GROUPS)}; the shapes: {', '.join(REGISTRY)}",
                  file=sys.stderr)
            sys.exit(2)
        out += GROUPS.get(name, [name])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="built", help="shapes or groups: built (default), unseen, all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="decontaminate settings, e.g. ngram=13")
    parser.add_argument("--before", action="store_true", help="also measure the rule of commit 8464ad6")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="print what removed the clean rows and which leaks were missed (N examples each; "
                        "never for a held-out shape)")
    args = parser.parse_args()
    settings = Decontaminate(op="decontaminate", **dict(kv.split("=", 1) for kv in args.set))
    shapes = shapes_named(args.shapes)
    tuned = [s for s in shapes if not REGISTRY[s].held_out]
    held = [s for s in shapes if REGISTRY[s].held_out]
    text = [f"`python benchmarks/decontamination.py {' '.join(sys.argv[1:])}`", "",
            f"Settings: {settings.model_dump(exclude={'op'})}; seed {args.seed}; {EVAL} validation + {EVAL} test "
            f"rows, {PER_KIND} leaks of each kind (half from each split).", ""]
    rule = current_rule(settings)
    if tuned:
        text += [*(["Shapes the rule was tuned on:", ""] if held else []),
                 table(measure(rule, tuned, args.seed, args.explain)), ""]
    if held:
        text += ["Held out (never tuned on):", "", table(measure(rule, held, args.seed)), ""]
    if args.before:
        text += ["The rule of commit 8464ad6 (rendered prompt, 8-gram, datasketch MinHash 0.8):", "",
                 table(measure(before_rule(), shapes, args.seed)), ""]
    print("\n".join(text))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(text))


if __name__ == "__main__":
    main()
