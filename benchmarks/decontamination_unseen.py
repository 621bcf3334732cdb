"""Planted leaks on task shapes the decontamination rule was not built with (issue 50).

    python benchmarks/decontamination_unseen.py --out benchmarks/results/decontamination_unseen.md
    python benchmarks/decontamination_unseen.py --shapes "csv row" --explain 10   # (tuning shapes only)

Thirty-two shapes, generated here and in ``benchmarks/decontamination_heldout.py``, ``_heldout2.py``,
``_heldout3.py``, ``_heldout4.py``, ``_heldout5.py``,
``_heldout6.py`` and ``_heldout7.py`` (seeded, from the standard library's sources or synthetic;
nothing downloaded), none of them in ``benchmarks/decontamination.py``:

- ``csv row`` (tuned on): a fixed instruction and one short CSV row of 3-4 literal values (numbers,
  decimals, dates, cities, quoted names, flags; its type is its number of fields); embedded copies
  sit among other rows of a CSV export;
- ``signature`` (tuned on): a stdlib function's signature ``def name(params):``, 2,440 unique rows
  from a run of consecutive stdlib files (the issue's argcount-like task): many share a parameter list
  (``(self, other)``), legitimate rows one name apart;
- ``expression`` (tuned on): a fixed instruction and a short arithmetic expression of 4 numbers
  2-99 (6 forms: its type) ``(48 - 7) * 3 + 12``;
- ``log line`` (**held out**: written before the rule was changed, never explained or tuned on; its
  figures were seen in each round):
  a fixed instruction and one short log line of one of 4 templates (paths, status codes, hosts,
  addresses, ids: 5-12 tokens); embedded copies sit among other log lines;
- ``literal`` (tuned on since its misses were studied in issue 50's second round; written after the
  first round's rule change): a fixed instruction and a Python literal of 2-4 values (list, tuple,
  set, dict: its type);
- ``url`` (held out in issue 50's second round; tuned on in its third, where its clean rows removed
  were explained): a fixed instruction and one URL with a query string (4 templates over 6 hosts: the
  path's collection and id, a user's name, the keys' values); embedded copies sit among other links;
  a one-token change never touches the URL's keys or hosts;
- ``import line``, ``shell command``, ``address``, ``calendar event`` (issue 50's third round, first
  batch): written by an engineer who did not change the rule and run against it once as held out
  (its values-differ change only); their misses were then read and the rule changed: tuned on since;
- ``class header``, ``raise statement``, ``html element`` (second batch) and ``assert call``,
  ``keyword call``, ``email header`` (third batch): written by an engineer who did not change the
  rule, never run against it until the third round's rule was final, measured once each (the batch
  modules say what they are); read in the fourth round (their natural overlaps removed): tuned on since;
- ``with statement``, ``for-loop header``, ``trivia question``, ``config line`` (fourth batch):
  written by an engineer who never read the rule, run against it once the fourth round's rule (the
  training rows' families) was final; the with statement's and the for-loop header's removals were
  read in the fifth round (tuned on since); trivia question and config line, never explained, stay
  held out (their figures seen);
- ``return statement``, ``attribute assignment``, ``commit message``, ``ingredient line`` (fifth
  batch): written by an engineer who never read the rule nor ran it, run against it once the fifth
  round's rule (a short input without its shared text) was final; the two stdlib shapes' misses
  were read then (tuned on since); commit message and ingredient line stay held out;
- ``if header``, ``append call``, ``shipping notice``, ``match score`` (sixth batch, **held out**):
  written by an engineer who never read the rule nor ran it, run against it once, the rule of the
  fifth round (unchanged by batch 5's reading); figures seen, never explained;
- ``except or raise line``, ``arithmetic assignment``, ``docstring summary``, ``bank transaction``
  (seventh batch, **held out**): written by an engineer who never read the rule nor ran it, run against
  it once, the fifth round's rule (issue 50's sixth round measured a change to it on the tuned shapes
  and kept none); only its re-instructed misses were read after.

Each plants the five leak kinds of ``benchmarks/decontamination.py`` (40 each, half from each split)
beside the clean rows that must stay; "one token changed" changes one name or one number wherever it
is (a signature: the function's name). Natural overlaps are decided as there. Besides its columns,
each shape reports **rows removed / true copies**: every row the rule removed against the planted
leaks plus the pool rows that are an evaluation input exactly (normalised); the target on a task
with many near-identical legitimate rows (signature) is at most 1.5x.
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import sys
import sysconfig
from collections.abc import Callable
from pathlib import Path

import decontamination as bench
from decontamination import (
    CITIES,
    COLUMNS,
    FIRST,
    ITEMS,
    LAST,
    NOUNS,
    Parts,
    Shape,
    _rename,
    _typed,
    current_rule,
    instructed,
    ntokens,
)
from decontamination_heldout import addresses, calendar_events, import_lines, shell_commands
from decontamination_heldout2 import class_headers, html_elements, raise_statements
from decontamination_heldout3 import assert_calls, email_headers, keyword_calls
from decontamination_heldout4 import SHAPES_4
from decontamination_heldout5 import SHAPES_5
from decontamination_heldout6 import SHAPES_6
from decontamination_heldout7 import SHAPES_7

from recipetune.data.ops import Decontaminate
from recipetune.trainer.data import STDLIB_SKIP_DIRS, walk_files

HELD_OUT = ("log line", "trivia question", "config line", "commit message", "ingredient line", *SHAPES_6, *SHAPES_7)
N = 2 * bench.EVAL + bench.POOL


def _among_its_kind(draw: Callable[[random.Random], tuple[str, str]]) -> Callable[[Parts, random.Random], Parts]:
    """An embedded copy for a shape whose generator is ``draw``: the input among three more of its kind
    (a CSV row among rows of an export, a log line in its log, a URL among a page's links)."""
    def embed(p: Parts, r: random.Random) -> Parts:
        return [p[0], _among(p[1], [draw(r)[1] for _ in range(3)], r)]
    return embed


def _among(text: str, other: list[str], rng: random.Random, sep: str = "\n") -> str:
    """``text`` among other lines (before, after or both), at most as many tokens again as it holds
    and at least half as many where the lines allow: a copy inside a longer training row."""
    n = ntokens(text)
    budget = rng.randint(max(1, (n + 1) // 2), max(1, n))
    before, after = [], []
    for line in other:
        toks = ntokens(line)
        if toks > budget:
            words = line.split(" ")
            while words and ntokens(" ".join(words)) > budget:
                words.pop()
            line, toks = " ".join(words), ntokens(" ".join(words))
        if not line:
            break
        (before if rng.random() < 0.5 else after).append(line)
        budget -= toks
        if budget <= 0:
            break
    return sep.join([*before, text, *after])


# --- csv row ----------------------------------------------------------------------------------------

CSV_INSTRUCTION = "Which field of this CSV row holds the largest number? Answer with its position."
CSV_REWORDED = ["Give the position of the field with the biggest number in the row below.",
                "Find the largest numeric field of this CSV line and say where it is.",
                "Position of the largest number in this CSV record?"]
STATUS = ("paid", "open", "void", "shipped", "returned", "pending")


def _date(rng: random.Random) -> str:
    return f"{rng.randint(2015, 2025)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def _literal(rng: random.Random) -> str:
    k = rng.randrange(7)
    return (str(rng.randint(0, 99)) if k == 0 else f"{rng.randint(0, 99)}.{rng.randint(0, 9)}" if k == 1
            else rng.choice(CITIES).title() if k == 2 else f'"{rng.choice(LAST)}"' if k == 3
            else rng.choice(("true", "false", "null")) if k == 4 else _date(rng) if k == 5 else rng.choice(ITEMS))


def _csv(rng: random.Random) -> tuple[str, str]:
    """A short row of 3-4 literal values; its type is the kinds of its values."""
    k = rng.choice((3, 4))
    return f"csv{k}", ",".join(_literal(rng) for _ in range(k))


def csv_rows(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [CSV_INSTRUCTION, row]) for kind, row in (_csv(rng) for _ in range(3 * N))])

    return instructed("csv row", "a fixed instruction and one short CSV row of 3-4 literal values (numbers 0-99, "
                      "decimals, cities, quoted names, flags, dates, items)", rows[:N], CSV_REWORDED, types,
                      _among_its_kind(_csv))


# --- signature --------------------------------------------------------------------------------------

SIGNATURE_ROWS = 2440  # the task size


def stdlib_signatures() -> list[str]:
    """Every stdlib function's signature line ``def name(params):``, in file order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in walk_files(root, frozenset({".py"}), STDLIB_SKIP_DIRS | {"__pycache__"}):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef):
                sig = f"def {node.name}({ast.unparse(node.args)}):"
                if len(sig) <= 120:
                    out.append(sig)
        if len(out) >= 60_000:
            break
    return out


def signatures(rng: random.Random) -> Shape:
    sigs = list(dict.fromkeys(stdlib_signatures()))  # unique, as a task split by its input is; in file order
    start = rng.randrange(len(sigs) - SIGNATURE_ROWS)  # a run of files: their classes' methods share parameters
    rows = [[s] for s in sigs[start : start + SIGNATURE_ROWS]]
    rng.shuffle(rows)

    def rename(p: Parts, r: random.Random) -> Parts | None:
        new = _rename(p[0], r, re.match(r"def (\w+)", p[0]).group(1))
        return [new] if new else None

    def embed(p: Parts, r: random.Random) -> Parts:  # the signature with a body line and a comment
        return [_among(p[0], ["    # " + " ".join(r.choice(bench.FILLER) for _ in range(6)),
                              "    return " + r.choice(("None", "self", "result", "value"))], r)]

    lead = ["Signature: ", "Here is the header: ", "Count the parameters of ", "Q: "]
    return Shape("signature", f"a stdlib function's signature `def name(params):`, {SIGNATURE_ROWS} unique "
                 "rows from a run of stdlib files (their classes' methods share parameter lists); the "
                 "instruction in the template",
                 rows, lambda p: f"How many parameters does this function take?\n{p[0]}\nAnswer: ", rename,
                 lambda p, r: [r.choice(lead) + p[0]], embed)


# --- expression -------------------------------------------------------------------------------------

EXPR_FORMS = ("({a} - {b}) * {c} + {d}", "{a} * {b} - {c} // {d}", "({a} + {b}) % {c} * {d}",
              "{a} ** 2 - {b} * {c} + {d}", "max({a}, {b}) - min({c}, {d})", "{a} / ({b} + {c}) - {d}")
EXPR_INSTRUCTION = "Evaluate this Python expression and give the result."
EXPR_REWORDED = ["What does this expression evaluate to?", "Compute the value of the expression below.",
                 "Work out the result of this arithmetic."]


def expressions(rng: random.Random) -> Shape:
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(EXPR_FORMS))
        text = EXPR_FORMS[k].format(a=rng.randint(2, 99), b=rng.randint(2, 99), c=rng.randint(2, 99),
                                    d=rng.randint(2, 99))
        return f"expr{k}", [EXPR_INSTRUCTION, text]

    rows, types = _typed([one() for _ in range(3 * N)])
    return instructed("expression", "a fixed instruction and a short arithmetic expression of 4 numbers 2-99 "
                      "(6 forms)", rows[:N], EXPR_REWORDED, types)


# --- log line (held out) ----------------------------------------------------------------------------

LOG_TEMPLATES = (
    "GET /api/{noun}/{n} {code} {ms}ms",
    "disk sd{dev} at {p}% on {city}-{k}",
    "login {first}.{last} from 10.{a}.{b}.{c}",
    "retry {k} of {n} for job {rid}",
)
LOG_INSTRUCTION = "What is the severity level of this log line?"
LOG_REWORDED = ["Give the log level of the following line.", "Which severity does this line carry?",
                "Name the level (INFO, WARN, ERROR, DEBUG) of the log entry below."]


def _log(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(LOG_TEMPLATES))
    text = LOG_TEMPLATES[k].format(k=rng.randint(1, 32), dev=rng.choice("abcdef"), p=rng.randint(10, 99),
                                   city=rng.choice(CITIES), n=rng.randint(1, 999), rid=f"r{rng.randint(1000, 99999)}",
                                   noun=rng.choice(NOUNS), code=rng.choice((400, 403, 404, 500, 502, 503)),
                                   ms=rng.randint(5, 30000), first=rng.choice(FIRST), last=rng.choice(LAST),
                                   a=rng.randint(0, 255), b=rng.randint(0, 255), c=rng.randint(1, 254))
    return f"log{k}", text


def log_lines(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [LOG_INSTRUCTION, line]) for kind, line in (_log(rng) for _ in range(3 * N))])

    return instructed("log line", "a fixed instruction and one short log line (4 templates, 5-12 tokens: paths, "
                      "hosts, ids, addresses)", rows[:N], LOG_REWORDED, types, _among_its_kind(_log))


# --- literal (held out, written after the rule was changed and never tuned on) --------------------------

LITERAL_INSTRUCTION = "What is the type of this Python literal?"
LITERAL_REWORDED = ["Name the type of the value below.", "Which Python type does this literal have?",
                    "Give the type of the following literal."]


def _scalar(rng: random.Random) -> str:
    k = rng.randrange(6)
    return (str(rng.randint(0, 99)) if k == 0 else f"{rng.randint(0, 99)}.{rng.randint(0, 99)}" if k == 1
            else f"'{rng.choice(CITIES)}'" if k == 2 else f"'{rng.choice(FIRST)}'" if k == 3
            else rng.choice(("True", "False", "None")) if k == 4 else f"'{rng.choice(ITEMS)}'")


def _literal_value(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(4)
    items = [_scalar(rng) for _ in range(rng.randint(2, 4))]
    if k == 0:
        return "list", f"[{', '.join(items)}]"
    if k == 1:
        return "tuple", f"({', '.join(items)})"
    if k == 2:
        return "set", "{" + ", ".join(items) + "}"
    return "dict", "{" + ", ".join(f"'{rng.choice(LAST)}': {x}" for x in items) + "}"


def literals(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [LITERAL_INSTRUCTION, text]) for kind, text in
                          (_literal_value(rng) for _ in range(3 * N))])
    return instructed("literal", "a fixed instruction and a Python literal of 2-4 values (list, tuple, set, dict)",
                      rows[:N], LITERAL_REWORDED, types)


# --- url (held out, written before the literal shape was tuned on, measured before and after only) -----

URL_HOSTS = ("shop.example.com", "api.acme.io", "portal.northwind.net", "app.contoso.org", "files.initech.co",
             "m.globex.com")
URL_TEMPLATES = (
    "https://{host}/{noun}?page={n}&sort={col}",
    "https://{host}/search?q={item}&city={city}&limit={n}",
    "https://{host}/users/{first}.{last}?tab={tab}&v={k}",
    "https://{host}/{noun}/{rid}/edit?lang={lang}&ref={noun2}",
)
URL_KEYS = frozenset({"https", "page", "sort", "search", "q", "city", "limit", "users", "tab", "v", "edit", "lang",
                      "ref", *(h for host in URL_HOSTS for h in host.split("."))})  # the URLs' schema
URL_INSTRUCTION = "Which query parameters does this URL set, and to what?"
URL_REWORDED = ["List the query string's keys and values of the URL below.",
                "Parse the query parameters of this link.", "What does the query part of this URL hold?"]


def _url(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(URL_TEMPLATES))
    text = URL_TEMPLATES[k].format(host=rng.choice(URL_HOSTS), noun=rng.choice(NOUNS), n=rng.randint(1, 99),
                                   col=rng.choice(COLUMNS), item=rng.choice(ITEMS), city=rng.choice(CITIES),
                                   first=rng.choice(FIRST), last=rng.choice(LAST),
                                   tab=rng.choice(("profile", "orders", "settings", "billing")),
                                   k=rng.randint(1, 9), rid=rng.randint(100, 99999),
                                   lang=rng.choice(("en", "de", "fr", "pl", "pt", "fi")), noun2=rng.choice(NOUNS))
    return f"url{k}", text


def urls(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [URL_INSTRUCTION, url]) for kind, url in (_url(rng) for _ in range(3 * N))])

    return instructed("url", "a fixed instruction and one URL with a query string (4 templates, 6 hosts: paths, ids, "
                      "names, cities, numbers as keys' values)", rows[:N], URL_REWORDED, types, _among_its_kind(_url),
                      URL_KEYS)


SHAPES = {"csv row": csv_rows, "signature": signatures, "expression": expressions, "log line": log_lines,
          "literal": literals, "url": urls, "import line": import_lines, "shell command": shell_commands,
          "address": addresses, "calendar event": calendar_events, "class header": class_headers,
          "raise statement": raise_statements, "html element": html_elements, "assert call": assert_calls,
          "keyword call": keyword_calls, "email header": email_headers, **SHAPES_4, **SHAPES_5, **SHAPES_6,
          **SHAPES_7}


# --- measuring --------------------------------------------------------------------------------------

def measure(settings: Decontaminate, shapes: list[str], seed: int, explain: int = 0) -> list[dict]:
    """``benchmarks/decontamination.py``'s measurement on these shapes (never explained when held out)."""
    saved = dict(bench.SHAPES)
    bench.SHAPES.update(SHAPES)
    try:
        return [row for name in shapes for row in bench.measure(current_rule(settings), [name], seed,
                                                                0 if name in HELD_OUT else explain)]
    finally:
        bench.SHAPES.clear()
        bench.SHAPES.update(saved)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--set", nargs="*", default=[], help="decontaminate settings, e.g. ngram=13")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="what removed the clean rows, which leaks were missed (never for held-out shapes)")
    args = parser.parse_args()
    settings = Decontaminate(op="decontaminate", **dict(kv.split("=", 1) for kv in args.set))
    shapes = [s.strip() for s in args.shapes.split(",")]
    tuned = [s for s in shapes if s not in HELD_OUT]
    held = [s for s in shapes if s in HELD_OUT]
    text = [f"`python benchmarks/decontamination_unseen.py {' '.join(sys.argv[1:])}`", "",
            f"Settings: {settings.model_dump(exclude={'op'})}; seed {args.seed}; {bench.EVAL} validation + "
            f"{bench.EVAL} test rows, {bench.PER_KIND} leaks of each kind (half from each split).", ""]
    if tuned:
        rows = measure(settings, tuned, args.seed, args.explain)
        text += ["Shapes the rule was tuned on:", "", bench.table(rows), ""]
    if held:
        text += ["Held out (never tuned on):", "", bench.table(measure(settings, held, args.seed)), ""]
    print("\n".join(text))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(text) + "\n")


if __name__ == "__main__":
    main()
