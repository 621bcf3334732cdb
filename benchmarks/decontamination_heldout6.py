"""Held-out task shapes for the decontamination benchmark (issue 50, sixth batch).

Four shapes, unlike the nine of ``benchmarks/decontamination.py``, the six others of
``benchmarks/decontamination_unseen.py`` and the eighteen of ``benchmarks/decontamination_heldout.py``
to ``_heldout5.py`` (the first five batches). They were written by an engineer who did not change the
rule and never read it, and were never run against it: only their generators and the planting were
checked (row counts, types, samples of each leak kind next to their evaluation input). Registered
as held out in ``decontamination_unseen.py`` and measured once, with issue 50's fifth-round rule
final (docs/benchmarks.md):

    python benchmarks/decontamination_unseen.py --shapes "if header,append call,shipping notice,match score"

- ``if header`` (natural data, a task with many near-identical legitimate rows): one ``if ...:`` or
  ``elif ...:`` header line of the standard library's sources (tests included), as written (``if not
  isinstance(x, int):``), the whole line, on one line, no comment, its body on later lines, at most 100
  characters; 2,440 unique rows from a run of consecutive files (the stdlib holds about 19,000: ``if
  not isinstance(x, int):`` and ``if not isinstance(y, int):`` differ in one name), shuffled; the
  question in the template, one type;
- ``append call`` (natural data): one ``<target>.append(...)`` call line of the stdlib's sources (tests
  included; the whole line a call statement, on one line, no comment, at most 100 characters), as ``if
  header`` (about 2,900 in the stdlib: ``result.append(x)`` and ``res.append(x)`` differ in one name).
  The shape asked for was ``print call``: the stdlib holds 1,080 unique one-line ``print(...)`` lines,
  too few for 2,440 rows (``os.path.join(...)`` calls: 1,194; ``.write(...)`` lines: 1,423);
- ``shipping notice`` (synthetic natural language, 14-17 tokens): one parcel-tracking notice of 6
  templates (its type: left the depot, a failed delivery, held at customs, out for delivery, left with
  a neighbour, a return received) whose 4-5 values are tracking codes, order and return numbers,
  cities, carriers, shops, names, streets, dates and counts (with fewer, most pool rows would be one
  value from an evaluation input: natural overlaps); one field, no instruction;
- ``match score`` (synthetic): a fixed instruction and one sports result line or short block of 6
  templates (its type: a football score, tennis sets, a cricket result, basketball quarters, a league
  table row, a chess game; 12-17 tokens) whose 6-10 values are teams, players, scores, minutes, rounds,
  openings and venues; its other words (``beat``, ``overs``, ``all out``, ``Defence``) are the
  template's, and no template writes a value twice.

How each leak kind is made (besides ``exact`` and ``case+space``, as in ``decontamination.py``):

- ``re-instructed``: the natural shapes and shipping notices have no instruction in the input: a few
  words put before it (``Q: ``, ``Tracking update: ``); match scores: the instruction reworded;
- ``embedded``: a natural line among its neighbouring lines of its file (up to as many tokens again;
  a line of fewer than 3 tokens is not embedded); a notice among other notices of a tracking history
  and a carrier's boilerplate; a result among other results and headings of a results page;
- ``one token changed``: natural lines as in ``_heldout4.py``: one name or number respelled, or one
  word of a string literal replaced by another word of these lines' strings, every occurrence of it,
  where the line has two or more such tokens; never a Python keyword (``if``, ``elif``, ``not``,
  ``is``), ``self``/``cls``, a builtin (``isinstance``, ``len``, ``None``) nor a keyword argument's
  name, nor the shape's own method ``append`` (as ``_heldout3.py``'s ``assert...``: a respelled
  ``append`` no longer runs). So ``if not colon:``, ``if __name__ == "__main__":`` and
  ``self.append(d)`` (one such token and fewer) plant none: the kind applies to 71% of the if headers'
  evaluation rows, 95% of the append calls' (seed 0). Synthetic rows: one value drawn again as the
  generator draws it (a tracking code, a city, a carrier, a score, a minute, a set, a venue), never a
  template word; each one checked to differ from its source in one token, one not in the row already
  (all rows have four values and more: all apply).

Each has ``2 * EVAL + POOL`` unique rows but the two natural ones (2,440, as ``signature``), and plants
the five leak kinds, 40 each, half from each split (seeds 0-2: all 40 of each kind on all four). Natural
overlaps at seed 0 (pool rows kept apart, as ``decontamination.py`` decides them; counted with its
``natural_overlaps``, not the rule): if header 506 of 2,040, append call 691 (the stdlib's one-line
ifs and appends share most 5-grams), shipping notice 3 of 3,000, match score 0.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import random
import re

import decontamination as bench
from decontamination import CITIES, DAYS, FIRST, ITEMS, LAST, Parts, Shape, instructed
from decontamination_heldout import MONTHS, _around, lines_around, stdlib_modules
from decontamination_heldout2 import NATURAL_ROWS, Context
from decontamination_heldout3 import LONGEST, _one_token_changed, _string_words
from decontamination_heldout4 import KEEP, Values, _drawn, _has_comment, _natural, drawn_rows
from decontamination_heldout5 import _repeated, _whole_line

N = 2 * bench.EVAL + bench.POOL


# --- the stdlib's if headers and append calls, with their neighbouring lines ----------------------------

def _append(node: ast.AST) -> bool:
    """``<target>.append(...)`` as a statement."""
    return (isinstance(node, ast.Expr) and isinstance(c := node.value, ast.Call)
            and isinstance(c.func, ast.Attribute) and c.func.attr == "append")


@functools.cache
def stdlib_lines() -> tuple[dict[str, Context], dict[str, Context]]:
    """(``if``/``elif`` headers, ``.append(...)`` call lines) of the standard library's sources (tests
    included): each unique one that is a whole line of at most ``LONGEST`` characters as written (no
    comment, nothing else on it; a header's test on its line, its body on later lines), with its
    neighbouring lines where it first occurs, in file order."""
    ifs: dict[str, Context] = {}
    appends: dict[str, Context] = {}
    for lines, tree in stdlib_modules():
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and node.test.end_lineno == node.lineno < node.body[0].lineno:
                found.append((ifs, node))
            elif _append(node):
                found.append((appends, node))
        for out, node in sorted(found, key=lambda x: x[1].lineno):
            if out is ifs:
                whole = lines[node.lineno - 1].strip()
                ok = whole.startswith(("if ", "elif ")) and whole.endswith(":") and not _has_comment(whole)
                line = whole if ok and len(whole) <= LONGEST else None
            else:
                line = _whole_line(lines, node)
            if line is not None and line not in out:
                out[line] = lines_around(lines, node.lineno, node.lineno)
    return ifs, appends


def if_headers(rng: random.Random) -> Shape:
    return _natural("if header", "if", stdlib_lines()[0], "What condition does this line test?",
                    ["Line: ", "The branch starts with ", "Q: ", "Here is the condition: "], rng,
                    what=f"a stdlib one-line `if ...:` or `elif ...:` header, {NATURAL_ROWS} "
                    "unique rows from a run of stdlib files (tests included: many one name apart); "
                    "the question in the template")


def append_calls(rng: random.Random) -> Shape:
    context = stdlib_lines()[1]
    shape = _natural("append call", "append", context, "What does this line append, and to what?",
                     ["Line: ", "In the loop we find ", "Q: ", "Here is the call: "], rng)
    vocabulary = _string_words(context)

    def change(p: Parts, r: random.Random) -> Parts | None:  # as _natural's, `append` kept too
        keywords = frozenset(re.findall(r"[(,]\s*(\w+)=(?!=)", p[0]))
        changed = _one_token_changed(KEEP | keywords | {"append"}, vocabulary, p[0], r)
        return [changed] if changed else None

    return dataclasses.replace(shape, change=change, what=f"a stdlib one-line `<target>.append(...)` call, "
                               f"{NATURAL_ROWS} unique rows from a run of stdlib files (tests included: many one "
                               "name apart); the question in the template")


# --- shipping notice (synthetic natural language) -------------------------------------------------------

SHIPPING_TEMPLATES = (  # four values and more each, most with a tracking, order or return number
    "Your parcel {tracking} left the {City} depot on {d} {Month} and arrives by {Weekday}",
    "{Carrier} could not deliver order {order} to {First} {Last}; we will try again on {Weekday}",
    "Shipment {tracking} is held at {City} customs: {amount} EUR duty due within {k} days",
    "Out for delivery: {n} parcels from {Shop} for {First} via {Carrier}, before {hour}:00",
    "Parcel {tracking} was left with your {place} at {no} {Street} Street, signed by {First}",
    "Return {rma} for {n} {items} reached our {City} warehouse; refund within {k} days",
)
CARRIERS = ("DHL", "UPS", "FedEx", "DPD", "GLS", "Hermes", "Evri", "PostNL", "Bpost", "Posti", "Correos",
            "Chronopost", "Colissimo", "InPost")
SHOPS = ("Zalando", "Otto", "Etsy", "Asos", "Ikea", "Decathlon", "Boohoo", "Fnac", "Allegro", "Cdiscount",
         "Coolblue", "Thomann", "Wehkamp", "Vinted", "Temu", "Bol")
PLACES = ("neighbour", "porch", "concierge", "reception", "garage", "doorman", "shed", "locker", "mailroom",
          "landlord")
STREETS = ("Mill", "Church", "Station", "Park", "Queen", "High", "Harbour", "Bridge", "Market", "Chapel",
           "Orchard", "Castle", "Willow", "Elm", "Victoria")
SHIPPING_LEAD = ["Tracking update: ", "SMS from the courier: ", "Notification: ", "Email subject: "]
SHIPPING_PROSE = ("Thank you for shopping with us.", "Track your parcel in the app.", "Reply STOP to opt out.",
                  "Delivery updates:", "Do not reply to this message.", "Questions? Visit our help centre.")


def _tracking(rng: random.Random) -> str:  # a UPU S10 code: RR482913507DE, one token
    letters = "ABCDEFGHJKLMNPRSTUVWXYZ"
    country = rng.choice(("DE", "FR", "NL", "GB", "PL", "ES", "IT", "BE"))
    return f"{rng.choice(letters)}{rng.choice(letters)}{rng.randint(10**8, 10**9 - 1)}{country}"


def _shipping_values(rng: random.Random) -> Values:
    return dict(tracking=_tracking(rng), City=rng.choice(CITIES).title(), d=rng.randint(1, 28),
                Month=rng.choice(MONTHS), Weekday=rng.choice(DAYS).title(), Carrier=rng.choice(CARRIERS),
                order=rng.randint(10000, 99999), First=rng.choice(FIRST).title(), Last=rng.choice(LAST).title(),
                amount=rng.randint(3, 250), k=rng.randint(2, 14), n=rng.randint(2, 12), Shop=rng.choice(SHOPS),
                hour=rng.randint(10, 20), place=rng.choice(PLACES), no=rng.randint(1, 199),
                Street=rng.choice(STREETS), rma=f"RMA{rng.randint(100000, 999999)}", items=rng.choice(ITEMS))


def _shipping(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("shipping", SHIPPING_TEMPLATES, _shipping_values, rng)


def shipping_notices(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("shipping", SHIPPING_TEMPLATES, _shipping_values, rng, fixed=_repeated)

    def embed(p: Parts, r: random.Random) -> Parts:  # among a tracking history and a carrier's boilerplate
        other = [_shipping(r)[1] if r.random() < 0.6 else r.choice(SHIPPING_PROSE) for _ in range(4)]
        return [_around(p[0], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    return Shape("shipping notice", "one field, a parcel-tracking notice of 14-17 tokens (6 templates: tracking "
                 "codes, cities, carriers, shops, names, dates, counts as values), no instruction", rows[:N],
                 lambda p: f"Notice: {p[0]}\nWhat is the status of this delivery?\nAnswer: ", change,
                 lambda p, r: [r.choice(SHIPPING_LEAD) + p[0]], embed, lambda p: p[0], types)


# --- match score (synthetic) -----------------------------------------------------------------------------

MATCH_TEMPLATES = (  # no value written twice
    "{Home} {h}-{a} {Away} at {Venue}: {Scorer} scored in minute {minute}",
    "{Player} beat {Player2} {set1}, {set2} in the {round} at {Venue}",
    "{Home} {runs}/{wkts} ({overs} overs) beat {Away} ({runs2} all out) at {Venue}",
    "{Home}: {q1} {q2} {q3} {q4}\n{Away}: {r1} {r2} {r3} {r4}",
    "{pos}. {Home} played {played}, won {won}, drawn {drawn}, lost {lost}, {pts} points",
    "{Player} (white) beat {Player2} in {moves} moves, {Opening} Defence, round {rnd} at {Venue}",
)
VENUES = ("Riverside", "Eastgate", "Millfield", "Oakwood", "Hillside", "Westbrook", "Marshlands", "Northbank",
          "Kingsmead", "Parkview", "Lakeside", "Stonebridge")
SETS = ("6-0", "6-1", "6-2", "6-3", "6-4", "7-5", "7-6")
ROUNDS = ("final", "semifinal", "quarterfinal", "opener", "playoff")
OPENINGS = ("Sicilian", "French", "Pirc", "Alekhine", "Scandinavian", "Dutch", "Philidor", "Petrov", "Slav",
            "Benoni", "Modern", "Grunfeld")
MATCH_INSTRUCTION = "Summarise this result in one sentence: who won, and by how much?"
MATCH_REWORDED = ["Say in one sentence who won and by what margin.",
                  "Who came out on top in the result below, and by how much?",
                  "Give the winner and the margin of this sports result."]
RESULTS_PAGE = ("Full-time results", "Saturday's fixtures and results:", "Round 12", "Postponed: waterlogged pitch",
                "All times are local.", "Tables updated after the late games.", "Scores from the weekend:")


def _match_values(rng: random.Random) -> Values:
    home, away = (c.title() for c in rng.sample(CITIES, 2))
    player, player2 = (x.title() for x in rng.sample(LAST, 2))
    won, drawn, lost = rng.randint(0, 25), rng.randint(0, 12), rng.randint(0, 25)
    quarters = {f"{s}{i}": rng.randint(12, 38) for s in "qr" for i in range(1, 5)}
    return dict(Home=home, Away=away, h=rng.randint(0, 5), a=rng.randint(0, 5), Venue=rng.choice(VENUES),
                Scorer=rng.choice(LAST).title(), minute=rng.randint(1, 90), Player=player, Player2=player2,
                set1=rng.choice(SETS), set2=rng.choice(SETS), round=rng.choice(ROUNDS), runs=rng.randint(120, 420),
                wkts=rng.randint(2, 9), overs=rng.randint(20, 50), runs2=rng.randint(60, 300), **quarters,
                pos=rng.randint(1, 20), played=won + drawn + lost, won=won, drawn=drawn, lost=lost,
                pts=3 * won + drawn, moves=rng.randint(18, 90), Opening=rng.choice(OPENINGS), rnd=rng.randint(1, 11))


def _match(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("match", MATCH_TEMPLATES, _match_values, rng)


def match_scores(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("match", MATCH_TEMPLATES, _match_values, rng, (MATCH_INSTRUCTION,),
                                     _repeated)  # (never a template word)

    def embed(p: Parts, r: random.Random) -> Parts:  # among other results and headings of a results page
        other = [_match(r)[1] if r.random() < 0.6 else r.choice(RESULTS_PAGE) for _ in range(4)]
        return [p[0], _around(p[1], "\n".join(other[:2]), "\n".join(other[2:]), r, "\n")]

    shape = instructed("match score", "a fixed instruction and one sports result line or short block (6 templates: "
                       "football, tennis, cricket, basketball, a league table row, chess; teams, players, scores, "
                       "minutes, venues as values; template words never changed)", rows[:N], MATCH_REWORDED,
                       types, embed)
    return dataclasses.replace(shape, change=change)


SHAPES_6 = {"if header": if_headers, "append call": append_calls, "shipping notice": shipping_notices,
            "match score": match_scores}
