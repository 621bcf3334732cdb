"""Held-out task shapes for the decontamination benchmark (issue 50, part 2, third round).

Four shapes, unlike the nine of ``benchmarks/decontamination.py`` and the six others of
``benchmarks/decontamination_unseen.py`` (which registers these four as held out). They were written
in issue 50's third round, before the rule's third-round change was measured on them, by an engineer
who did not change the rule, and were never run against the rule while it was being changed: only
their generators and the planting were checked (row counts, types, samples of each leak kind). Once
the rule is final:

    python benchmarks/decontamination_unseen.py --shapes "import line,shell command,address,calendar event"

- ``import line`` (natural data, a task with many near-identical legitimate rows): one import
  statement of the standard library's sources (tests included; a parenthesised one on one line),
  2,440 unique rows from a run of consecutive files (the stdlib holds about 2,900), shuffled; the
  question in the template, one type. One token changed: one imported name, alias or module-path
  component renamed wherever it is (never ``from``, ``import``, ``as``), where the line has two or more;
  embedded: the line among its neighbouring lines of its file;
- ``shell command`` (synthetic): a fixed instruction and one command of 6 templates (its type) sharing
  flags (tar, rsync, grep, docker, find, scp); one token changed: a value (a name, path word or
  number), never a command, flag or fixed path word; embedded: among other commands of a history;
- ``address`` (synthetic, short natural-language fields): a fixed question and one postal address of
  3-4 comma-separated fields (4 templates: its type); one token changed: a name or a number;
  embedded: inside a sentence or a letter's header;
- ``calendar event`` (synthetic natural language, 10-20 tokens): a fixed instruction and one event
  (5 templates: its type); one token changed: a name or a number (never a template word such as
  ``budget``); embedded: inside a short message.

Each has ``2 * EVAL + POOL`` unique rows but ``import line`` (2,440, as ``signature``), and plants
the five leak kinds of ``benchmarks/decontamination.py``.
"""

from __future__ import annotations

import ast
import keyword
import random
import re
import string
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import decontamination as bench
from decontamination import (
    CITIES,
    COLUMNS,
    DAYS,
    FIRST,
    LAST,
    NOUNS,
    TOKEN,
    Parts,
    Shape,
    _typed,
    instructed,
    ntokens,
)

from recipetune.trainer.data import walk_files

N = 2 * bench.EVAL + bench.POOL
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")


def _around(text: str, before: str, after: str, rng: random.Random, sep: str = " ") -> str:
    """``text`` after the end of ``before`` and before the start of ``after``, with as many tokens again
    as it holds around it or up to half less (less only where the context runs out): a copy inside a
    longer training row."""
    n = ntokens(text)
    budget = rng.randint(max(1, (n + 1) // 2), max(1, n))
    tail = _cut(after, budget - ntokens(_cut(before, rng.randint(0, budget), True)), False)
    head = _cut(before, budget - ntokens(tail), True)
    return sep.join(x for x in (head, text, tail) if x)


def _cut(text: str, most: int, from_end: bool) -> str:
    """The end (or start) of ``text`` that holds ``most`` of its tokens (all of them if it has fewer)."""
    found = list(TOKEN.finditer(text))
    if most >= len(found):
        return text.strip()
    if most <= 0:
        return ""
    return (text[found[-most].start() :] if from_end else text[: found[most - 1].end()]).strip()


def _fixed(templates: tuple[str, ...]) -> frozenset[str]:
    """The templates' own words (commands, flags, keys, words like ``budget``): never changed."""
    return frozenset(w for t in templates for w in re.findall(r"\w+", re.sub(r"\{\w+\}", " ", t)))


# --- import line (natural data, many near-identical legitimate rows) ---------------------------------

IMPORT_ROWS = 2440  # the task size, as the signature shape
IMPORT_WORDS = frozenset({"from", "import", "as"})


def stdlib_modules() -> Iterator[tuple[list[str], ast.Module]]:
    """Each stdlib source file that parses, in file order: its lines and its syntax tree."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in walk_files(root, frozenset({".py"}), frozenset({"site-packages", "dist-packages", "__pycache__"})):
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
            continue
        yield text.splitlines(), tree


def lines_around(lines: list[str], first: int, last: int) -> tuple[str, str]:
    """Up to 4 non-blank lines of a file before its line ``first`` and after its line ``last`` (counted
    from 1): where a natural statement of the stdlib is embedded."""
    before = [x for x in lines[max(0, first - 9) : first - 1] if x.strip()][-4:]
    after = [x for x in lines[last : last + 8] if x.strip()][:4]
    return "\n".join(before), "\n".join(after)


def stdlib_imports() -> list[tuple[str, str, str]]:
    """(statement, the lines before it, the lines after it) of every import statement of the standard
    library's sources (tests included) of at most 120 characters, file by file, on one line; its
    neighbours are up to 4 non-blank lines of its file on each side."""
    out = []
    for lines, tree in stdlib_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and len(line := ast.unparse(node)) <= 120:
                out.append((line, *lines_around(lines, node.lineno, node.end_lineno)))
    return out


def import_lines(rng: random.Random) -> Shape:
    context: dict[str, tuple[str, str]] = {}
    for line, before, after in stdlib_imports():
        context.setdefault(line, (before, after))  # unique, as a task split by its input is; in file order
    found = list(context)
    start = rng.randrange(len(found) - IMPORT_ROWS)  # a run of files: `from test.support import ...` and the like
    rows = [[x] for x in found[start : start + IMPORT_ROWS]]
    rng.shuffle(rows)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one name, wherever it is
        names = sorted(set(re.findall(r"\w+", p[0])) - IMPORT_WORDS)
        if len(names) < 2:  # `import os` -> `import xy`: another line, not a copy
            return None
        old, new = r.choice(names), ""
        while not new or keyword.iskeyword(new) or re.search(rf"\b{new}\b", p[0]):
            new = "".join(r.choice(string.ascii_lowercase) for _ in old)
            new = new.upper() if old.isupper() else new.title() if old[0].isupper() else new  # its case kept
        return [re.sub(rf"\b{re.escape(old)}\b", new, p[0])]

    def embed(p: Parts, r: random.Random) -> Parts | None:  # among its neighbouring lines
        if ntokens(p[0]) < 3 or not any(context[p[0]]):
            return None
        return [_around(p[0], *context[p[0]], r, "\n")]

    lead = ["Import: ", "Here is the line: ", "Q: ", "From the top of the module: "]
    return Shape("import line", f"a stdlib import statement, {IMPORT_ROWS} unique rows from a run of stdlib files "
                 "(tests included: many differ in one name); the question in the template", rows,
                 lambda p: f"Which module does this line import from?\n{p[0]}\nAnswer: ", change,
                 lambda p, r: [r.choice(lead) + p[0]], embed)


# --- shell command ----------------------------------------------------------------------------------

SHELL_TEMPLATES = (
    "tar -czf /backup/{noun}-{day}-{n}.tar.gz /var/{noun2}/{first}",
    "rsync -avz --delete /srv/{noun}/{k}/ {first}@{city}-{n}:/backup/{noun2}",
    'grep -rn -m {n} "{col}" src/{noun}/{first} --include=*.{lang}',
    "docker run -d -p {port}:{port} --name {noun}-{k} {noun2}-api:{k}.{n}",
    'find /home/{first}/{noun} -name "*.{ext}" -mtime +{n} -size +{m}M -delete',
    "scp -P {port} {first}@{city}-{k}:/var/log/{noun}.log ./{day}/",
)
SHELL_FIXED = _fixed(SHELL_TEMPLATES)
SHELL_INSTRUCTION = "Explain what this shell command does."
SHELL_REWORDED = ["Describe what the following command does.", "What happens when this shell command runs?",
                  "Explain the command below in plain words."]
SHELL_HISTORY = ("cd ..", "ls -la", "git status", "df -h", "sudo systemctl restart nginx", "history | tail -5",
                 "clear", "cat ~/.ssh/config")
EXTS = ("csv", "log", "tmp", "bak", "pdf", "jpg", "json", "gz")
LANGS = ("py", "js", "go", "rs", "sql", "sh")
PORTS = (80, 443, 2222, 3000, 5432, 6379, 8000, 8080, 9000)


def _shell(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(SHELL_TEMPLATES))
    noun, noun2 = rng.sample(NOUNS, 2)
    text = SHELL_TEMPLATES[k].format(noun=noun, noun2=noun2, n=rng.randint(1, 99), first=rng.choice(FIRST),
                                     city=rng.choice(CITIES), k=rng.randint(1, 9), col=rng.choice(COLUMNS),
                                     port=rng.choice(PORTS), ext=rng.choice(EXTS), m=rng.randint(1, 500),
                                     day=rng.choice(DAYS), lang=rng.choice(LANGS))
    return f"shell{k}", text


def shell_commands(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [SHELL_INSTRUCTION, c]) for kind, c in (_shell(rng) for _ in range(3 * N))])

    def embed(p: Parts, r: random.Random) -> Parts:  # other commands of a shell history around it
        lines = [_shell(r)[1] if r.random() < 0.5 else r.choice(SHELL_HISTORY) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(lines[:2]), "\n".join(lines[2:]), r, "\n")]

    return instructed("shell command", "a fixed instruction and one shell command (6 templates sharing flags: "
                      "tar, rsync, grep, docker, find, scp; names, paths, hosts, ports)", rows[:N], SHELL_REWORDED,
                      types, embed, SHELL_FIXED)


# --- address ----------------------------------------------------------------------------------------

ADDRESS_TEMPLATES = (
    "Flat {n}, {m} {last} Street, {city} {zip}",
    "{first} {last}, PO Box {n}, {city} {zip}",
    "{m} {last2} Road, Unit {n}, {city}, {zip}",
    "c/o {first} {last}, {m} Station Road, {city} {zip}",
)
ADDRESS_INSTRUCTION = "Which country is this postal address in?"
ADDRESS_REWORDED = ["In which country is the address below?", "Name the country of this postal address.",
                    "Which country would a letter to this address go to?"]
ADDRESS_BEFORE = ("Please send the signed copies to", "From next month our office moves to",
                  "The parcel came back from")
ADDRESS_AFTER = ("before the end of the week.", "so please update your records.", "because nobody was home.")


def _address(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(ADDRESS_TEMPLATES))
    last, last2 = rng.sample(LAST, 2)
    text = ADDRESS_TEMPLATES[k].format(n=rng.randint(1, 99), m=rng.randint(1, 250), first=rng.choice(FIRST).title(),
                                       last=last.title(), last2=last2.title(), city=rng.choice(CITIES).title(),
                                       zip=rng.randint(1000, 99999))
    return f"address{k}", text


def addresses(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [ADDRESS_INSTRUCTION, a]) for kind, a in (_address(rng) for _ in range(3 * N))])

    def embed(p: Parts, r: random.Random) -> Parts:  # in a sentence, or in a letter's header
        if r.random() < 0.5:
            return [p[0], _around(p[1], r.choice(ADDRESS_BEFORE), r.choice(ADDRESS_AFTER), r)]
        sender = f"{r.choice(FIRST).title()} {r.choice(LAST).title()}\nAccounts payable"
        date = f"{r.randint(1, 28)} {r.choice(MONTHS)} 2024\nDear {r.choice(FIRST).title()},"
        return [p[0], _around(p[1], sender, date, r, "\n")]

    return instructed("address", "a fixed question and one postal address of 3-4 comma-separated fields "
                      "(4 templates: names, streets, numbers, cities, postcodes)", rows[:N], ADDRESS_REWORDED,
                      types, embed, _fixed(ADDRESS_TEMPLATES))


# --- calendar event ---------------------------------------------------------------------------------

EVENT_TEMPLATES = (
    "Meeting with {first} {last} on {day} {d} {month} at {h}:{mm} in {city} room {n}",
    "Call {first} {last} about the {noun} budget on {day} at {h}:{mm} for {k} minutes",
    "{col} workshop in {city} on {day} {d} {month} from {h}:{mm} to {h2}:{mm}, room {n}",
    "Dentist appointment for {first} {last} on {d} {month} at {h}:{mm}",
    "Review of the {noun} report with {first} and {first2}, {day} at {h}:{mm}, {city} office",
)
EVENT_INSTRUCTION = "Add this event to the calendar."
EVENT_REWORDED = ["Put the following event in my calendar.", "Create a calendar entry for this.",
                  "Schedule this in the calendar, please."]
EVENT_BEFORE = ("Hi all, a quick reminder for next week:", "Forwarded from my phone:", "As agreed on the call,")
EVENT_AFTER = ("Please confirm that you can make it.", "Bring the latest figures.",
               "Tell me if the time does not work for you.")


def _event(rng: random.Random) -> tuple[str, str]:
    k = rng.randrange(len(EVENT_TEMPLATES))
    first, first2 = rng.sample(FIRST, 2)
    h = rng.randint(8, 17)
    text = EVENT_TEMPLATES[k].format(first=first.title(), first2=first2.title(), last=rng.choice(LAST).title(),
                                     day=rng.choice(DAYS).title(), d=rng.randint(1, 28), month=rng.choice(MONTHS),
                                     h=h, h2=h + 1, mm=rng.choice(("00", "15", "30", "45")),
                                     city=rng.choice(CITIES).title(), n=rng.randint(1, 40),
                                     noun=rng.choice(NOUNS), k=rng.choice((15, 20, 30, 45, 60, 90)),
                                     col=rng.choice(COLUMNS).title())
    return f"event{k}", text


def calendar_events(rng: random.Random) -> Shape:
    rows, types = _typed([(kind, [EVENT_INSTRUCTION, e]) for kind, e in (_event(rng) for _ in range(3 * N))])

    def embed(p: Parts, r: random.Random) -> Parts:  # inside a short message
        return [p[0], _around(p[1], r.choice(EVENT_BEFORE), r.choice(EVENT_AFTER), r)]

    return instructed("calendar event", "a fixed instruction and one calendar event of 10-20 tokens (5 templates: "
                      "names, days, dates, times, cities, rooms)", rows[:N], EVENT_REWORDED, types, embed,
                      _fixed(EVENT_TEMPLATES))

