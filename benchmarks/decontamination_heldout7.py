"""Held-out task shapes for the decontamination benchmark (issue 50, seventh batch).

Four shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` and the twenty-two of ``benchmarks/decontamination_heldout.py``
to ``_heldout6.py`` (the first six batches). They were written by an engineer who did not change the
rule and never read it, and were never run against it: only their generators and the planting were
checked (row counts, types, samples of each leak kind next to their evaluation input). Registered
as held out in ``decontamination_unseen.py`` and measured once, with issue 50's fifth-round rule
(docs/benchmarks.md, "Sixth round"):

    python benchmarks/decontamination_unseen.py \\
        --shapes "except or raise line,arithmetic assignment,docstring summary,bank transaction"

- ``except or raise line`` (natural data, a task with many near-identical legitimate rows): one
  ``except ...:`` header line (``except (OSError, ValueError) as exc:``, its body on later lines) or
  one ``raise ...`` statement line (``raise ValueError("bad mode")``, a bare ``raise`` left out) of the
  standard library's sources (tests included), as written, the whole line, on one line, no comment, at
  most 100 characters; 2,440 unique rows from a run of consecutive files (the stdlib holds 3,349: 664
  except headers, 2,685 raise lines; ``except OSError as e:`` and ``except OSError as exc:``
  differ in one name), shuffled; the question in the template, one type. The shape asked for was
  ``except clause``, its header alone: the stdlib holds 664 unique one-line ``except ...:`` headers,
  too few for 2,440 rows (a header with its body's first line, the two lines as written: 2,208);
- ``arithmetic assignment`` (natural data): one augmented assignment (``x += 1``, ``flags |=
  re.IGNORECASE``) or one single-target assignment of a binary operation (``n = len(s) - 1``, ``msg =
  fmt % args``) of the stdlib's sources (tests included; the whole line a statement, on one line, no
  comment, at most 100 characters), as ``except or raise line`` (6,238 in the stdlib, 1,857 of
  them augmented: ``i += 1`` and ``n += 1`` differ in one name). The shape asked for was ``augmented
  assignment``, those alone: too few for 2,440 rows (with ``x = x + y`` and kin, the same update
  written out: 2,211);
- ``docstring summary`` (natural English): the first line of a function's or class's docstring of the
  stdlib's sources (tests included), as written (``Return the number of items in the queue.``), where
  it is the whole summary (the docstring's next line blank, or none): one sentence ending in a full
  stop, 4-20 words; 2,440 unique rows from a run of consecutive files (the stdlib holds 5,399:
  ``Return the file descriptor of the underlying socket.`` and kin), shuffled; one field, the question
  in the template, one type;
- ``bank transaction`` (synthetic): a fixed instruction and one bank-statement line of 6 templates (its
  type: a card payment, a transfer in, a transfer out, a direct debit, an ATM withdrawal, interest and
  an account fee; 15-18 tokens) whose 5-6 values are dates, times, amounts with their currency,
  merchants, payers and payees, IBAN-like account ids, references, mandates, banks, cities and
  balances; its other words (``Transfer from``, ``mandate``, ``ATM``, ``cash``, ``fee``) and the
  amounts' signs are the template's, and no template writes a value twice.

How each leak kind is made (besides ``exact`` and ``case+space``, as in ``decontamination.py``):

- ``re-instructed``: the natural shapes have no instruction in the input: a few words put before it
  (``Q: ``, ``The summary line reads ``); bank transactions: the instruction reworded;
- ``embedded``: a code line among its neighbouring lines of its file (up to as many tokens again; a
  line of fewer than 3 tokens is not embedded); a docstring summary among its docstring's other lines
  (or, where it has none, the next docstring's) and the previous docstring of its file; a transaction
  among other lines and headings of a bank statement;
- ``one token changed``: code lines as in ``_heldout4.py``: one name or number respelled, or one word
  of a string literal replaced by another word of these lines' strings, every occurrence of it, where
  the line has two or more such tokens; never a Python keyword (``except``, ``as``, ``raise``,
  ``from``), ``self``/``cls``, a builtin (``KeyError``, ``OSError``, ``len``) nor a keyword argument's
  name. So ``except (KeyError, ValueError):`` and ``except OSError as e:`` (one such token and fewer)
  plant none: the kind applies to 70% of the except or raise lines' evaluation rows, 95% of the
  arithmetic assignments' (seed 0). Docstring summaries: one word that is not a stop word (``the``,
  ``a``, ``of``, ``if``, ``is``), of two characters and more, replaced wherever it is by another of
  these summaries' vocabulary: a number by another of its digits, a name (``__file__``, ``TList``,
  ``utf8``) by another name of these summaries, an ordinary word (``Return``, ``queue``) by another
  ordinary word, its case kept, where the summary has two or more such words; each one checked to
  differ from its source in one token, one not in the summary already (99% apply: ``Same as a - b.``
  has one such word). Transactions: one value drawn again as the generator draws it (a day, a month,
  a merchant, an account id, the euros or the cents of an amount, a currency), never a template word
  or sign; each one checked to differ from its source in one token, one not in the row already (all
  rows apply).

Each has ``2 * EVAL + POOL`` unique rows but the three natural ones (2,440, as ``signature``), and
plants the five leak kinds, 40 each, half from each split (seeds 0-2: all 40 of each kind on all
four). Natural overlaps were not counted by its writer (``decontamination.py``'s ``natural_overlaps``
uses ``recipetune.data``'s text normalisation, which the writer was kept off); the measuring run's, at
seed 0: except or raise line 502 of 2,040, arithmetic assignment 244, docstring summary 168, bank
transaction 0 of 3,000.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import re

import decontamination as bench
from decontamination import CITIES, FIRST, LAST, TOKEN, Parts, Shape, instructed
from decontamination_heldout import _around, lines_around, stdlib_modules
from decontamination_heldout2 import NATURAL_ROWS, Context, _neighbours, _run
from decontamination_heldout3 import LONGEST, MONTH_ABBR
from decontamination_heldout4 import Values, _drawn, _has_comment, _natural, drawn_rows
from decontamination_heldout5 import _repeated, _whole_line

N = 2 * bench.EVAL + bench.POOL


# --- the stdlib's except headers, raise lines, arithmetic assignments and docstring summaries ----------

def _arithmetic(node: ast.AST) -> bool:
    """``x += 1``, or one target assigned a binary operation: ``n = len(s) - 1``."""
    return isinstance(node, ast.AugAssign) or (isinstance(node, ast.Assign) and len(node.targets) == 1
                                               and isinstance(node.value, ast.BinOp))


def _summary(node: ast.AST) -> tuple[int, list[str], str | None] | None:
    """(its line, its docstring's non-blank lines, its summary: the first line where it is the whole
    summary, one sentence of 4-20 words, else None) of a module, function or class with a docstring."""
    if not isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return None
    doc = ast.get_docstring(node)  # (cleaned: leading blank lines and the indentation left out)
    if not doc:
        return None
    lines = doc.split("\n")
    first = lines[0].strip()
    whole = len(lines) == 1 or not lines[1].strip()
    one = first.endswith(".") and not re.search(r"[.!?;]\s", first) and 4 <= len(first.split()) <= 20
    summary = first if whole and one and not isinstance(node, ast.Module) else None
    return node.body[0].lineno, [x for x in lines if x.strip()], summary


@functools.cache
def stdlib_lines() -> tuple[dict[str, Context], dict[str, Context], dict[str, Context]]:
    """(``except ...:`` headers and ``raise ...`` lines, arithmetic assignments, docstring summaries) of
    the standard library's sources (tests included): each unique one with its neighbouring lines where
    it first occurs, in file order. A code line is a whole line of at most ``LONGEST`` characters as
    written (a header's exceptions on its line, its body on later lines); a summary's neighbours are
    the previous docstring of its file (its last lines) and its docstring's other lines (or, where it
    has none, the next docstring's first lines)."""
    handling: dict[str, Context] = {}
    assigns: dict[str, Context] = {}
    summaries: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ExceptHandler):
                whole = lines[node.lineno - 1].strip()
                if (whole.startswith("except") and whole.endswith(":") and node.body[0].lineno > node.lineno
                        and len(whole) <= LONGEST and not _has_comment(whole)):
                    found.append((handling, whole, node.lineno))
            elif (isinstance(node, ast.Raise) and node.exc is not None or _arithmetic(node)) and (
                    line := _whole_line(lines, node)):
                found.append((assigns if _arithmetic(node) else handling, line, node.lineno))
            if doc := _summary(node):
                docs.append(doc)
        for out, line, at in sorted(found, key=lambda x: x[2]):
            if line not in out:
                out[line] = lines_around(lines, at, at)
        docs.sort(key=lambda x: x[0])
        for i, (_, doc, summary) in enumerate(docs):
            if summary and summary not in summaries:
                before = docs[i - 1][1][-4:] if i else []
                after = doc[1:5] or (docs[i + 1][1][:4] if i + 1 < len(docs) else [])
                summaries[summary] = "\n".join(before), "\n".join(after)
    return handling, assigns, summaries


def except_or_raise_lines(rng: random.Random) -> Shape:
    return _natural("except or raise line", "except", stdlib_lines()[0], "Which exception does this line "
                    "catch or raise?", ["Line: ", "In the try statement we find ", "Q: ", "Here is the line: "], rng,
                    what=f"a stdlib one-line `except ...:` header or `raise ...` statement, "
                    f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                    "name apart); the question in the template")


def arithmetic_assignments(rng: random.Random) -> Shape:
    return _natural("arithmetic assignment", "x += ...", stdlib_lines()[1], "Which variable does this line "
                    "update, and how?", ["Line: ", "In the loop we find ", "Q: ", "Here is the assignment: "], rng,
                    what=f"a stdlib one-line augmented assignment `x += ...` or assignment of a "
                    f"binary operation `x = a - b`, {NATURAL_ROWS} unique rows from a run of stdlib files "
                    "(tests included: many one name apart); the question in the template")


# --- docstring summary (natural English) ----------------------------------------------------------------

STOP_WORDS = frozenset({"a", "an", "the", "of", "to", "in", "on", "at", "by", "for", "from", "with", "without", "into",
                        "onto", "over", "under", "about", "as", "and", "or", "but", "nor", "not", "no", "if", "then",
                        "else", "than", "that", "this", "these", "those", "it", "its", "is", "are", "was", "were",
                        "be", "been", "being", "do", "does", "did", "has", "have", "had", "can", "could", "may",
                        "might", "must", "shall", "should", "will", "would", "which", "who", "whom", "whose", "what",
                        "when", "where", "why", "how", "all", "any", "each", "every", "some", "such", "only", "also",
                        "so", "too", "very", "there", "here", "their", "them", "they", "we", "our", "you", "your",
                        "he", "she", "his", "her", "him", "i", "me", "my"})
WORD = re.compile(r"\w+")


def _changeable(word: str) -> bool:
    """A summary's word that may be changed: a number, or a word of two characters and more that is not
    a stop word."""
    return word.isdigit() or (len(word) >= 2 and word.lower() not in STOP_WORDS)


def _name(word: str) -> bool:
    """``__file__``, ``utf8``, ``TList``: not an ordinary word (lower, title or upper case letters)."""
    return not word.isalpha() or not (word.islower() or word.istitle() or word.isupper())


def _vocabulary(found: dict[str, Context]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(ordinary words, names) of these summaries: what a summary's word is changed to."""
    words = {w for line in found for w in WORD.findall(line) if _changeable(w) and not w.isdigit()}
    return (tuple(sorted({w.lower() for w in words if not _name(w) and len(w) >= 3})),
            tuple(sorted(w for w in words if _name(w) and not w.isdigit())))


def _word_changed(line: str, words: tuple[str, ...], names: tuple[str, ...], r: random.Random) -> str | None:
    """``line`` with one of its changeable words (a number, a name, an ordinary word) replaced by another
    of its kind, every occurrence of it (its case kept), where it has two or more; checked to differ
    from ``line`` in one token, one not in it already."""
    found = sorted({w.lower() for w in WORD.findall(line) if _changeable(w)})
    if len(found) < 2:
        return None
    old = r.choice(found)
    where = re.compile(rf"(?<!\w){re.escape(old)}(?!\w)", re.IGNORECASE)
    written = where.search(line).group()
    tokens = {t.lower() for t in TOKEN.findall(line)}
    if old.isdigit():
        low = 10 ** (len(old) - 1) if len(old) > 1 else 0
        pool = [str(x) for x in r.sample(range(low, 10 ** len(old)), min(100, 10 ** len(old) - low))]
    else:
        pool = r.sample(names, len(names)) if _name(written) else r.sample(words, len(words))
    new = next((x for x in pool if x.lower() not in tokens and x.lower() not in STOP_WORDS), None)
    if new is None:
        return None

    def cased(m: re.Match) -> str:
        w = m.group()
        if _name(w) or new.isdigit():
            return new
        return new.upper() if w.isupper() and len(w) > 1 else new[0].upper() + new[1:] if w[0].isupper() else new

    changed = where.sub(cased, line)
    a, b = TOKEN.findall(line.lower()), TOKEN.findall(changed.lower())
    pairs = {(x, y) for x, y in zip(a, b, strict=False) if x != y}
    return changed if len(a) == len(b) and len(pairs) == 1 and next(iter(pairs))[1] not in a else None


def docstring_summaries(rng: random.Random) -> Shape:
    context = stdlib_lines()[2]
    rows = _run(context, rng)
    words, names = _vocabulary(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # one word, number or name, wherever it is
        changed = _word_changed(p[0], words, names, r)
        return [changed] if changed else None

    lead = ["Docstring: ", "The summary line reads ", "Q: ", "From the reference: "]
    return Shape("docstring summary", f"a stdlib function's or class's docstring summary line (one sentence, 4-20 "
                 f"words), {NATURAL_ROWS} unique rows from a run of stdlib files (tests included); one field, the "
                 "question in the template", rows, lambda p: f"What does this function or class do?\n{p[0]}\nAnswer: ",
                 change, lambda p, r: [r.choice(lead) + p[0]], _neighbours(context))


# --- bank transaction (synthetic) ---------------------------------------------------------------------

BANK_TEMPLATES = (  # five values and more each, one token each field; no value written twice
    "{d} {Mon} Card payment {Merchant} {City} -{eur}.{ct} {Cur}, card *{card}",
    "{d} {Mon} Transfer from {First} {Last} {City} {iban} ref {ref} +{eur}.{ct} {Cur}",
    "{d} {Mon} Transfer to {Payee} {iban} -{eur}.{ct} {Cur}, balance {bal}.{bct}",
    "Direct debit {Payee} mandate {mandate} on {d} {Mon}: -{eur}.{ct} {Cur}, customer {customer}",
    "{d} {Mon} {hh}:{mm} ATM {Bank} {City} cash -{cash} {Cur}, fee {fee}.{fct}",
    "{d} {Mon} interest +{interest}.{ict}, {Package} account fee -{fee}.{fct} {Cur}; {iban}",
)
MERCHANTS = ("Lidl", "Aldi", "Carrefour", "Rewe", "Tesco", "Ikea", "Zara", "Decathlon", "Starbucks", "Shell",
             "Esso", "Apple", "Amazon", "Spotify", "Uber", "Bolt", "Ryanair", "Booking", "Primark", "Mediamarkt",
             "Douglas", "Rossmann", "Edeka", "Netto", "Monoprix", "Biedronka", "Jumbo", "Albert", "Billa", "Coop")
PAYEES = ("Vodafone", "Vattenfall", "Allianz", "Netflix", "Orange", "Telekom", "Endesa", "Eneco", "Engie", "Iberdrola",
          "Generali", "Axa", "Enel", "Ziggo", "Proximus", "Telia", "Fortum", "Ista", "Techem", "Hiscox")
BANKS = ("Sparkasse", "Santander", "ING", "BNP", "Rabobank", "Commerzbank", "Raiffeisen", "Nordea", "Unicredit",
         "Belfius", "Danske", "Erste", "Intesa", "Bankinter", "Sabadell", "KBC")
PACKAGES = ("Basic", "Classic", "Comfort", "Premium", "Gold", "Platinum", "Student", "Plus", "Select", "Smart")
CURRENCIES = ("EUR", "GBP", "CHF", "SEK", "DKK", "NOK", "PLN", "CZK", "HUF", "USD")
COUNTRIES = ("DE", "FR", "NL", "BE", "AT", "ES", "IT", "PT", "IE", "FI", "LU", "SK")
REFERENCES = ("INV", "ORD", "RF", "PO", "RENT", "LOAN", "TAX", "SAL")
BANK_INSTRUCTION = "What kind of transaction is this bank statement line, and how much money moved?"
BANK_REWORDED = ["Classify the statement entry below and give the amount.",
                 "Which type of payment is this, and for how much?",
                 "Say what this line of a bank statement records and its amount."]
STATEMENT = ("Date Description Amount", "Opening balance", "Pending transactions:", "Page 2 of 3",
             "Closing balance", "Account statement", "All amounts in the account's currency.",
             "Transactions since your last statement:")


def _bank_values(rng: random.Random) -> Values:
    cents = {k: f"{rng.randint(0, 99):02d}" for k in ("ct", "bct", "fct", "ict")}
    return dict(d=rng.randint(1, 28), Mon=rng.choice(MONTH_ABBR), Merchant=rng.choice(MERCHANTS),
                City=rng.choice(CITIES).title(), eur=rng.randint(1, 2999), Cur=rng.choice(CURRENCIES),
                card=rng.randint(1000, 9999), First=rng.choice(FIRST).title(), Last=rng.choice(LAST).title(),
                iban=f"{rng.choice(COUNTRIES)}{rng.randint(10, 99)}{rng.randint(10**13, 10**14 - 1)}",
                ref=f"{rng.choice(REFERENCES)}{rng.randint(1000, 99999)}", Payee=rng.choice(PAYEES),
                bal=rng.randint(0, 49999), mandate=f"MD{rng.randint(10**6, 10**7 - 1)}",
                customer=rng.randint(10**5, 10**6 - 1), hh=f"{rng.randint(0, 23):02d}", mm=f"{rng.randint(0, 59):02d}",
                Bank=rng.choice(BANKS), cash=rng.choice((10, 20, 40, 50, 60, 80, 100, 150, 200, 250, 300, 400, 500)),
                fee=rng.randint(0, 9), interest=rng.randint(0, 99), Package=rng.choice(PACKAGES), **cents)


def _bank(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("bank", BANK_TEMPLATES, _bank_values, rng)


def bank_transactions(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("bank", BANK_TEMPLATES, _bank_values, rng, (BANK_INSTRUCTION,),
                                     _repeated)  # (never a template word or a sign)

    def embed(p: Parts, r: random.Random) -> Parts:  # among other lines and headings of a bank statement
        other = [_bank(r)[1] if r.random() < 0.6 else r.choice(STATEMENT) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    shape = instructed("bank transaction", "a fixed instruction and one bank-statement line (6 templates: card "
                       "payment, transfers in and out, direct debit, ATM, interest and fee; dates, amounts, "
                       "currencies, merchants, accounts, references, cities, balances as values; template words "
                       "never changed)", rows[:N], BANK_REWORDED, types, embed)
    return dataclasses.replace(shape, change=change)


SHAPES_7 = {"except or raise line": except_or_raise_lines, "arithmetic assignment": arithmetic_assignments,
            "docstring summary": docstring_summaries, "bank transaction": bank_transactions}
