"""Synthetic shapes of natural language, seeded: word problems, booking dialogues, postal
addresses, calendar events, trivia questions, commit messages, recipe ingredient lines, shipping
notices, match results and bank-statement lines. Each row is one of a few templates (its type) whose
values are names, places, numbers, dates and the like; a one-token copy draws one value again (never a
template word), where the row has two or more; an embedded copy sits inside a short message,
paragraph or page of its kind.
"""

from __future__ import annotations

import dataclasses
import random

from .base import (
    CITIES,
    COLUMNS,
    DAYS,
    EVAL,
    FIRST,
    ITEMS,
    LAST,
    MONTH_ABBR,
    MONTHS,
    NOUNS,
    POOL,
    N,
    Parts,
    Shape,
    Values,
    _around,
    _drawn,
    _fixed,
    _name_or_number_changed,
    _repeated,
    _typed,
    drawn_rows,
    embedded,
    instructed,
)

PROBLEMS = (
    "{a} has {x} {item}. {a} buys {y} more {item} and gives {z} to {b}. How many {item} does {a} have now?",
    "A box holds {x} {item}. {a} fills {y} boxes and sells {z} {item}. How many {item} are left?",
    "{a} reads {x} pages a day for {y} days. The book has {z} pages. How many pages are left?",
    "{a} and {b} share {x} {item} equally. Then {a} eats {y}. How many {item} does {a} have?",
    "A train leaves {city} and travels {x} km in {y} hours. How far does it go in {z} hours?",
    "{a} saves {x} euros a week. After {y} weeks {a} spends {z} euros. How much is left?",
)


def word_problems(rng: random.Random) -> Shape:
    """One field, a grade-school word problem from one of 6 templates (its type): 15-30 tokens, the
    length where one changed token costs an 8-gram rule most of its n-grams."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(PROBLEMS))
        a, b = rng.sample(FIRST, 2)
        text = PROBLEMS[k].format(a=a.title(), b=b.title(), item=rng.choice(ITEMS), city=rng.choice(CITIES).title(),
                                  x=rng.randint(2, 99), y=rng.randint(2, 99), z=rng.randint(2, 99))
        return f"problem{k}", [text]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    lead = ["Solve: ", "Homework question: ", "Please work this out: ", "Q: "]
    return Shape("word problem", "one field, a word problem (6 templates, 50 names, 20 items, numbers 2-99)",
                 rows[: 2 * EVAL + POOL], lambda p: f"Problem: {p[0]}\nAnswer: ",
                 lambda p, r: [x] if (x := _name_or_number_changed(p[0], r)) else None,
                 lambda p, r: [r.choice(lead) + p[0]], lambda p, r: [embedded(p[0], r)], lambda p: p[0], types)


BOOKING = (
    "Hi, I would like to book a table for {x} at {place} on {day} at {h} pm.",
    "Can you move my {day} booking at {place} to {h} pm? It is under {a}.",
    "Please cancel the reservation for {x} people under the name {a} {b}.",
    "Is {place} open on {day}? We are {x} and would arrive around {h}.",
)
PLACES = ("Bistro", "Grill", "Kitchen", "Trattoria", "House", "Garden", "Table", "Cafe", "Tavern", "Deli")
DIALOGUE_SYSTEM = "You are the booking assistant of a restaurant group. Reply with the intent only."


def dialogue(rng: random.Random) -> Shape:
    """Short chat turns: a fixed system prompt and one user turn from one of 4 intents (its type)."""
    def one() -> tuple[str, Parts]:
        k = rng.randrange(len(BOOKING))
        place = f"{rng.choice(LAST).title()} {rng.choice(PLACES)}"
        day = f"{rng.choice(DAYS).title()} the {rng.randint(1, 28)}th"
        text = BOOKING[k].format(x=rng.randint(2, 12), place=place, day=day, h=rng.randint(5, 10),
                                 a=rng.choice(FIRST).title(), b=rng.choice(LAST).title())
        return f"intent{k}", [DIALOGUE_SYSTEM, text]

    rows, types = _typed([one() for _ in range(3 * (2 * EVAL + POOL))])
    return Shape("dialogue", "chat: a fixed system prompt and one short user turn (4 intents, 12-20 tokens)",
                 rows[: 2 * EVAL + POOL], lambda p: f"System: {p[0]}\nUser: {p[1]}\nAssistant: ",
                 lambda p, r: [p[0], x] if (x := _name_or_number_changed(p[1], r)) else None,
                 lambda p, r: [p[0], "Quick question. " + p[1]], lambda p, r: [p[0], embedded(p[1], r)],
                 lambda p: p[1], types)


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


# --- trivia question (synthetic natural language) ----------------------------------------------------

TRIVIA_TEMPLATES = (  # three values and more each: two random questions are rarely one value apart
    "What was the population of {City} when {First} {Last} was its mayor in {year}?",
    "Who wrote The {Adj} {Noun}, the {year} novel set in {City}?",
    "In which year did {First} {Last} of {City} win the {Prize} Prize?",
    "How many kilometres did {First} {Last} travel by {mode} from {City} to {City2}?",
    "Which museum in {City} bought the Still Life with {Item} that {First} {Last} painted in {year}?",
    "Which {instrument} player led the {City} orchestra under {First} {Last} in {year}?",
)
ADJECTIVES = ("Silent", "Golden", "Broken", "Last", "Hidden", "Northern", "Crimson", "Quiet", "Winter", "Distant",
              "Burning", "Forgotten", "Little", "Second", "Glass", "Hollow", "Bitter", "Restless", "Painted", "Iron")
TITLE_NOUNS = ("Harbour", "Garden", "Letter", "River", "Mirror", "Lantern", "Orchard", "Bridge", "Shore", "Tower",
               "Island", "Season", "Voyage", "Kingdom", "Widow", "Station", "Archive", "Meadow", "Road", "Summer")
PRIZES = ("Nobel", "Pulitzer", "Booker", "Turing", "Abel", "Pritzker", "Goncourt", "Wolf")
MODES = ("train", "road", "ferry", "bicycle", "bus", "air")
INSTRUMENTS = ("violin", "cello", "oboe", "flute", "horn", "trumpet", "clarinet", "viola", "harp", "bassoon")
TRIVIA_LEAD = ["Quiz question: ", "Here is one for the pub quiz. ", "Round three, question five: ",
               "Can you answer this? "]
TRIVIA_PROSE = ("Welcome back to the quiz.", "The next round is about history and the arts.",
                "Take your time, there is no penalty for guessing.", "Write your answers on the sheet.",
                "Last week's winners were the team by the window.", "Points are doubled in this round.")


def _trivia_values(rng: random.Random) -> Values:
    city, city2 = rng.sample(CITIES, 2)
    return dict(City=city.title(), City2=city2.title(), year=rng.randint(1850, 2020), Adj=rng.choice(ADJECTIVES),
                Noun=rng.choice(TITLE_NOUNS), First=rng.choice(FIRST).title(), Last=rng.choice(LAST).title(),
                Prize=rng.choice(PRIZES), mode=rng.choice(MODES), Item=rng.choice(ITEMS).title(),
                instrument=rng.choice(INSTRUMENTS))


def _trivia(rng: random.Random) -> tuple[str, str, Values]:
    return _drawn("trivia", TRIVIA_TEMPLATES, _trivia_values, rng)


def trivia_questions(rng: random.Random) -> Shape:
    rows, types, change = drawn_rows("trivia", TRIVIA_TEMPLATES, _trivia_values, rng)

    def embed(p: Parts, r: random.Random) -> Parts:  # inside a paragraph of other questions and prose
        other = [_trivia(r)[1] if r.random() < 0.5 else r.choice(TRIVIA_PROSE) for _ in range(4)]
        return [_around(p[0], " ".join(other[:2]), " ".join(other[2:]), r)]

    return Shape("trivia question", "one field, a trivia question of 13-17 tokens (6 templates: cities, names, years, "
                 "titles, prizes, instruments as values), no instruction", rows[:N],
                 lambda p: f"Question: {p[0]}\nAnswer: ", change, lambda p, r: [r.choice(TRIVIA_LEAD) + p[0]], embed,
                 lambda p: p[0], types)


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
DEPENDENCIES = ("requests", "urllib3", "numpy", "pyyaml", "jinja2", "certifi", "lodash", "axios", "webpack", "pytest",
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
                package=rng.choice(DEPENDENCIES), major=rng.randint(0, 9), minor=rng.randint(0, 40), patch=patch,
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
DROP_PLACES = ("neighbour", "porch", "concierge", "reception", "garage", "doorman", "shed", "locker", "mailroom",
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
                hour=rng.randint(10, 20), place=rng.choice(DROP_PLACES), no=rng.randint(1, 199),
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
ACCOUNT_PACKAGES = ("Basic", "Classic", "Comfort", "Premium", "Gold", "Platinum", "Student", "Plus", "Select", "Smart")
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
                fee=rng.randint(0, 9), interest=rng.randint(0, 99), Package=rng.choice(ACCOUNT_PACKAGES), **cents)


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
