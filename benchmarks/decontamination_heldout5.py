"""Held-out task shapes for the decontamination benchmark (issue 50, fifth batch).

Four shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` and the fourteen of ``benchmarks/decontamination_heldout.py``
to ``_heldout4.py`` (the first four batches). They were written by an engineer who did not change the
rule and never read it, and were never run against it: only their generators and the planting were
checked (row counts, types, samples of each leak kind next to their evaluation input). Registered as
held out in ``decontamination_unseen.py`` and measured once, with issue 50's fifth-round rule final
(docs/benchmarks.md):

    python benchmarks/decontamination_unseen.py \\
        --shapes "return statement,attribute assignment,commit message,ingredient line"

- ``return statement`` (natural data, a task with many near-identical legitimate rows): one ``return
  ...`` line of the standard library's sources (tests included), as written (``return
  self._name``), the whole line, on one line, no comment, at most 100 characters, with at least two
  tokens after ``return`` (a bare ``return x``, ``return None`` or ``return 0`` is left out: one name
  or constant, not a task's input); 2,440 unique rows from a run of consecutive files (the stdlib
  holds about 9,400: ``return self._name`` and ``return self._value`` differ in one name), shuffled;
  the question in the template, one type;
- ``attribute assignment`` (natural data): one ``self.<name> = <expr>`` line of the stdlib's sources
  (tests included; one target, no augmented or annotated assignment), as ``return statement`` (about
  6,900 in the stdlib: ``self.name = name`` and kin differ in one name);
- ``commit message`` (synthetic natural language, 10-14 tokens): one git commit subject line of 6
  templates (its type: a leak fix, a dependency bump, a revert, a merged pull request, a retry limit,
  a changelog) whose 4-5 values are modules, packages, versions' parts, pull request numbers, users,
  branches, services, platforms and dates (with fewer, most pool rows would be one value from an
  evaluation input: natural overlaps); one field, no instruction;
- ``ingredient line`` (synthetic): a fixed instruction and one recipe ingredient line or short list of
  6 templates (its type: cups of a dry ingredient, spoons and vegetables, a tin, a warmed liquid, eggs
  and a dry ingredient, meat in pieces; 8-16 tokens) whose 4-6 values are quantities, ingredients and
  preparations; its units and other words (``cups``, ``tbsp``, ``tinned``, ``warmed to``) are the
  template's.

How each leak kind is made (besides ``exact`` and ``case+space``, as in ``decontamination.py``):

- ``re-instructed``: the natural shapes and commit messages have no instruction in the input: a few
  words put before it (``Q: ``, ``Commit message: ``); ingredient lines: the instruction reworded;
- ``embedded``: a natural line among its neighbouring lines of its file (up to as many tokens again;
  a line of fewer than 3 tokens is not embedded); a commit message among the other lines of a
  ``git log --oneline`` and release-notes prose; an ingredient line among other lines of a recipe's
  ingredient list;
- ``one token changed``: natural lines as in ``_heldout4.py``: one name or number respelled, or one
  word of a string literal replaced by another word of these lines' strings, every occurrence of it,
  where the line has two or more such tokens; never a Python keyword, ``self``/``cls``, a builtin
  (``len``, ``float``) nor a keyword argument's name. So ``self.name = name`` and ``return
  self._name`` (one such token) plant none: the kind applies to 78% of the return statements'
  evaluation rows, 65% of the attribute assignments' (seed 0). Synthetic rows: one value drawn again
  as the generator draws it (a module, a package, a version's patch, a quantity, an ingredient, a
  preparation), never a template word or unit, nor a value written twice (a bump's major and minor
  version: two tokens); each one checked to differ from its source in one token, one not in the row
  already (all rows have two values and more: all commit messages apply, 99% of the ingredient lines,
  where ``1 3/4 cups``' fraction drawn again brings a digit already in the row or changes two).

Each has ``2 * EVAL + POOL`` unique rows but the two natural ones (2,440, as ``signature``), and plants
the five leak kinds, 40 each, half from each split (seeds 0-2: all 40 of each kind on all four). Natural
overlaps at seed 0 (pool rows kept apart, as ``decontamination.py`` decides them): return statement 485
of 2,040, attribute assignment 623 (the stdlib's ``return self._x`` and ``self.x = x`` share most
5-grams), commit message 5 of 3,000, ingredient line 24.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import string

import decontamination as bench
from decontamination import FIRST, LAST, NOUNS, Parts, Shape, instructed, ntokens
from decontamination_heldout import MONTHS, _around, lines_around, stdlib_modules
from decontamination_heldout2 import NATURAL_ROWS, Context
from decontamination_heldout3 import LONGEST
from decontamination_heldout4 import Values, _drawn, _natural, drawn_rows

N = 2 * bench.EVAL + bench.POOL


# --- the stdlib's return statements and attribute assignments, with their neighbouring lines ----------

def _self_attribute(node: ast.AST) -> bool:
    """``self.<name> = <expr>``: one target, an attribute of ``self``."""
    return (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(t := node.targets[0], ast.Attribute)
            and isinstance(t.value, ast.Name) and t.value.id == "self")


@functools.cache
def stdlib_lines() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``return ...`` lines, ``self.<name> = ...`` lines) of the standard library's sources (tests
    included): each unique one that is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it), a return with two tokens and more after ``return``, with its
    neighbouring lines where it first occurs, in file order."""
    returns: dict[str, Context] = {}
    assigns: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Return) and node.value is not None:
                found.append((returns, node))
            elif _self_attribute(node):
                found.append((assigns, node))
        for out, node in sorted(found, key=lambda x: x[1].lineno):
            line = _whole_line(lines, node)
            if line is None or line in out:
                continue
            if out is returns and ntokens(line) < 3:  # `return x`, `return None`: one token after it
                continue
            out[line] = lines_around(lines, node.lineno, node.lineno)
    return returns, assigns


def _whole_line(lines: list[str], node: ast.AST) -> str | None:
    """The statement ``node`` where it is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it)."""
    if node.lineno != node.end_lineno:
        return None
    whole = lines[node.lineno - 1]
    line = whole.encode()[node.col_offset : node.end_col_offset].decode()  # the offsets count UTF-8 bytes
    return line if line == whole.strip() and len(line) <= LONGEST else None


def return_statements(rng: random.Random) -> Shape:
    return _natural("return statement", "return", stdlib_lines()[0], "What does this line return?",
                    ["Line: ", "The function ends with ", "Q: ", "From the method body: "], rng,
                    what=f"a stdlib one-line `return ...` (two tokens and more after it), "
                    f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                    "name apart); the question in the template")


def attribute_assignments(rng: random.Random) -> Shape:
    return _natural("attribute assignment", "self", stdlib_lines()[1], "Which attribute does this line set, and to "
                    "what?", ["Line: ", "In __init__ we find ", "Q: ", "Here is the assignment: "], rng,
                    what=f"a stdlib one-line `self.<name> = <expr>`, {NATURAL_ROWS} unique rows "
                    "from a run of stdlib files (tests included: `self.name = name` and kin one name "
                    "apart); the question in the template")


# --- one value drawn again (the synthetic shapes) -------------------------------------------------------

def _repeated(template: str) -> frozenset[str]:
    """The fields ``template`` writes twice (a bump's major and minor): never drawn again, two tokens."""
    fields = [f for _, f, _, _ in string.Formatter().parse(template) if f]
    return frozenset(f for f in fields if fields.count(f) > 1)


# --- commit message (synthetic natural language) -------------------------------------------------------

COMMIT_TEMPLATES = (  # four values and more each: two random messages are rarely one value apart
    "Fix {leak} leak in {module} when more than {n} {things} are open on {Platform}",
    "Bump {package} from {major}.{minor}.{patch} to {major}.{minor}.{patch2}",
    "Revert \"{Verb} {noun} {store} in {module}\" (#{pr})",
    "Merge pull request #{pr} from {user}/{branch}-{module}-{noun}",
    "Raise {module} retry limit from {n} to {m} for {Service}",
    "Update changelog for {major}.{minor}.{patch} release on {d} {Month}",
)
MODULES = ("scheduler", "parser", "auth", "billing", "cache", "router", "exporter", "uploader", "indexer", "mailer",
           "worker", "gateway", "planner", "tokenizer", "loader", "renderer", "sync", "store", "cli", "api")
PACKAGES = ("requests", "urllib3", "numpy", "pyyaml", "jinja2", "certifi", "lodash", "axios", "webpack", "pytest",
            "django", "flask", "protobuf", "grpcio", "pillow", "cryptography", "setuptools", "babel", "eslint",
            "typescript")
LEAKS = ("memory", "socket", "cursor", "thread", "buffer", "lock", "handle", "connection", "descriptor", "timer")
THINGS = ("connections", "files", "sessions", "cursors", "sockets", "tabs", "streams", "workers", "uploads",
          "transactions", "subscriptions", "watchers")
VERBS = ("Add", "Remove", "Enable", "Disable", "Rework", "Split", "Inline", "Drop", "Rename", "Simplify")
PLATFORMS = ("Linux", "Windows", "macOS", "FreeBSD", "Android", "iOS", "Solaris", "AIX")
STORES = ("cache", "index", "queue", "pool", "buffer", "table", "view", "lock")
BRANCHES = ("fix", "feature", "hotfix", "refactor", "docs", "chore")
SERVICES = ("S3", "GCS", "Azure", "Kafka", "Redis", "Postgres", "MySQL", "Stripe", "Twilio", "Slack", "SQS", "LDAP")
COMMIT_LEAD = ["Commit message: ", "git log says: ", "Latest commit: ", "The subject line reads "]
COMMIT_PROSE = ("Changes since the last release:", "All of these were merged into main this week.",
                "See the pull requests for details.", "The CI run for this range was green.",
                "Thanks to everyone who reviewed.", "Squashed before tagging.")


def _commit_values(rng: random.Random) -> Values:
    patch = rng.randint(0, 19)
    return dict(leak=rng.choice(LEAKS), module=rng.choice(MODULES), n=rng.randint(2, 99), things=rng.choice(THINGS),
                package=rng.choice(PACKAGES), major=rng.randint(0, 9), minor=rng.randint(0, 40), patch=patch,
                patch2=patch + rng.randint(1, 9), Verb=rng.choice(VERBS), noun=rng.choice(NOUNS),
                pr=rng.randint(100, 9999), user=f"{rng.choice(FIRST)[0]}{rng.choice(LAST)}",
                branch=rng.choice(BRANCHES), m=rng.randint(100, 999), Service=rng.choice(SERVICES),
                d=rng.randint(1, 28), Month=rng.choice(MONTHS), Platform=rng.choice(PLATFORMS),
                store=rng.choice(STORES))


def _commit(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("commit", COMMIT_TEMPLATES, _commit_values, rng)


def commit_messages(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("commit", COMMIT_TEMPLATES, _commit_values, rng, fixed=_repeated)

    def embed(p: Parts, r: random.Random) -> Parts:  # among a `git log --oneline` and release-notes prose
        other = [f"{r.getrandbits(28):07x} {_commit(r)[1]}" if r.random() < 0.6 else r.choice(COMMIT_PROSE)
                 for _ in range(4)]
        return [_around(p[0], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    return Shape("commit message", "one field, a git commit subject line of 10-14 tokens (6 templates: modules, "
                 "packages, versions, pull requests, users, services, dates as values), no instruction", rows[:N],
                 lambda p: f"Commit: {p[0]}\nWhat kind of change is this?\nAnswer: ", change,
                 lambda p, r: [r.choice(COMMIT_LEAD) + p[0]], embed, lambda p: p[0], types)


# --- ingredient line (synthetic) ---------------------------------------------------------------------

INGREDIENT_TEMPLATES = (
    "{q} {frac} cups {dry} ({g} g), {prep}",
    "{n} tbsp {fat}; {k} {veg}, {prep}",
    "{g} g tinned {tinned} in {medium} ({k} cans), {prep}",
    "{ml} ml {liquid}, warmed to {t} °C, with {n} tsp {spice}",
    "{eggs} large eggs, {prep}; {g} g {dry}; a pinch of {spice}",
    "{lb} lb ({grams} g) {meat} {part}, {trimmed} and cut into {cm} cm pieces",
)
FRACTIONS = ("1/2", "1/3", "1/4", "3/4", "2/3")
DRY = ("flour", "sugar", "oats", "cocoa", "semolina", "polenta", "cornmeal", "breadcrumbs", "almonds", "walnuts",
       "rice", "couscous", "quinoa", "raisins", "cornflour", "hazelnuts", "coconut", "bran", "buckwheat", "pecans")
PREPS = ("sifted", "chopped", "toasted", "ground", "softened", "melted", "rinsed", "drained", "grated", "sliced",
         "diced", "crushed", "halved", "minced", "peeled", "beaten", "warmed", "chilled", "packed", "divided")
FATS = ("butter", "oil", "ghee", "lard", "honey", "tahini", "yogurt", "vinegar", "mustard", "margarine", "mayonnaise",
        "pesto", "miso", "harissa", "ketchup")
VEG = ("onions", "shallots", "carrots", "leeks", "peppers", "courgettes", "potatoes", "tomatoes", "mushrooms",
       "parsnips", "beetroots", "aubergines", "chillies", "radishes", "turnips")
TINNED = ("tomatoes", "chickpeas", "beans", "lentils", "peaches", "sweetcorn", "pineapple", "sardines", "tuna",
          "artichokes", "pears", "apricots")
LIQUIDS = ("milk", "water", "stock", "cream", "buttermilk", "wine", "cider", "beer", "juice", "coffee")
SPICES = ("cinnamon", "nutmeg", "salt", "paprika", "cumin", "cardamom", "turmeric", "ginger", "cloves", "allspice",
          "saffron", "coriander")
MEATS = ("beef", "lamb", "pork", "chicken", "venison", "duck", "turkey", "veal", "goat", "rabbit")
MEDIA = ("water", "brine", "juice", "syrup", "oil", "sauce")
TRIMS = ("trimmed", "boned", "skinned", "rolled", "marinated", "scored", "butterflied", "brined")
PARTS = ("shoulder", "breast", "thigh", "loin", "fillet", "shank", "leg", "neck")
INGREDIENT_INSTRUCTION = "Which ingredients does this recipe line call for, and how much of each?"
INGREDIENT_REWORDED = ["List each ingredient below with its quantity.", "How much of what does this line ask for?",
                       "Name the ingredients and the amounts in this recipe line."]
RECIPE = ("Ingredients", "For the sauce:", "For the topping:", "Serves 4", "salt and pepper to taste",
          "a handful of fresh parsley", "For the dough:")


def _ingredient_values(rng: random.Random) -> Values:
    return dict(q=rng.randint(1, 4), frac=rng.choice(FRACTIONS), dry=rng.choice(DRY), g=rng.randint(50, 999),
                prep=rng.choice(PREPS), n=rng.randint(1, 6), fat=rng.choice(FATS), k=rng.randint(2, 12),
                veg=rng.choice(VEG), tinned=rng.choice(TINNED), ml=rng.randint(50, 999), liquid=rng.choice(LIQUIDS),
                t=rng.randint(20, 90), spice=rng.choice(SPICES), lb=rng.randint(1, 5), grams=rng.randint(400, 2500),
                meat=rng.choice(MEATS), part=rng.choice(PARTS), cm=rng.randint(1, 8), medium=rng.choice(MEDIA),
                eggs=rng.randint(2, 6), trimmed=rng.choice(TRIMS))


def _ingredient(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("ingredient", INGREDIENT_TEMPLATES, _ingredient_values, rng)


def ingredient_lines(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("ingredient", INGREDIENT_TEMPLATES, _ingredient_values, rng,
                                     (INGREDIENT_INSTRUCTION,), _repeated)  # (never a unit or template word)

    def embed(p: Parts, r: random.Random) -> Parts:  # among other lines of a recipe's ingredient list
        other = [_ingredient(r)[1] if r.random() < 0.6 else r.choice(RECIPE) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    shape = instructed("ingredient line", "a fixed instruction and one recipe ingredient line or short list (6 "
                       "templates; quantities, ingredients, preparations as values; units never changed)",
                       rows[:N], INGREDIENT_REWORDED, types, embed)
    return dataclasses.replace(shape, change=change)


SHAPES_5 = {"return statement": return_statements, "attribute assignment": attribute_assignments,
            "commit message": commit_messages, "ingredient line": ingredient_lines}
