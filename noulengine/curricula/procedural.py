"""A procedural curriculum of typed decisions that can only be solved by reading the options.

Thirteen task kinds (the task kinds of the Procedural Typed Decisions family), each a small
world whose answers follow *exactly* from rules over the state:

arithmetic, entity belief tracking, event state reconstruction, evidence sufficiency, multi-view
adjudication, needle retrieval, partial-observation calibration, policy applicability, policy
under uncertainty, record aggregation, state perturbation, table lookup, taxonomy routing.

Why it forces reading: option *names* are drawn per record from varied vocabularies (plain words,
snake_case, Title Case, opaque queue codes, prefixed names), choice questions have 2-12 options
with distractors, and the trainer permutes every row's options. A model that answers by slot or
by a memorised label set cannot beat chance; only matching the state to the option text does.

Difficulty levels 0-4 scale the world (entities, log length, distractors, reasoning steps).
Questions whose answer is a probability (partial observation) carry the exact posterior as a soft
target (``targets[field].probabilities``) beside its argmax label.

Deterministic: ``generate(n, seed)`` returns the same records for the same arguments (one
``random.Random(seed)``; ids ``proc-<seed>-<index>``). Nothing here is drawn from any evaluation
suite: every name, number and sentence comes from the pools below.
"""

from __future__ import annotations

import random
from fractions import Fraction
from typing import Callable

LEVELS = (0, 1, 2, 3, 4)

_PEOPLE = ("ana", "ben", "chen", "dara", "eli", "femi", "gus", "hana", "ivo", "jade", "kai", "lena", "mo", "nia",
           "omar", "pia", "raj", "sara", "tom", "uma", "vik", "wen", "yara", "zeb", "ola", "pax", "quin", "rosa")
_PLACES = ("drawer", "basket", "cupboard", "box", "shelf", "bag", "fridge", "locker", "safe", "closet", "crate",
           "attic", "garage", "desk")
_OBJECTS = ("key", "ring", "ball", "letter", "coin", "map", "phone", "book", "badge", "ticket", "watch", "scarf")
_CITIES = ("Avalon", "Brisk", "Corvale", "Dunmore", "Elstow", "Farrow", "Glenby", "Harlow", "Istra", "Jorvik",
           "Kestrel", "Lunde", "Marrow", "Norwick", "Oskar", "Pellam", "Quarry", "Rysa", "Selby", "Tamsin")
_DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_REGIONS = ("north", "south", "east", "west", "central", "coastal", "highland", "valley", "harbour", "metro")
_COLORS = ("red", "blue", "green", "white", "black", "yellow")
_ITEMS = ("cable", "lamp", "desk", "chair", "router", "monitor", "kettle", "stapler", "battery", "printer", "mouse",
          "headset", "camera", "drill", "ladder", "tent", "backpack", "bottle", "jacket", "helmet", "scanner", "fan")

# Taxonomy routing: each domain has request phrasings and several paraphrased descriptions; the
# label shown for a domain is renamed per record, so only the description identifies it.
_DOMAINS = {
    "payments": (("my card payment failed", "an invoice shows the wrong amount", "I want a refund for my order",
                  "the subscription fee was taken twice", "my bank statement has an unknown charge"),
                 ("Payments, invoices, charges and refunds", "Money questions: billing, fees and refunds",
                  "Handles charges, invoices and money back")),
    "delivery": (("the courier never came", "my package is stuck in transit", "tracking has not updated for days",
                  "the box arrived at the wrong address", "when will my order be delivered"),
                 ("Parcels, couriers and delivery status", "Tracks shipments and late or lost packages",
                  "Anything about shipping and delivery")),
    "software": (("the app freezes on startup", "the website shows an error page", "the login button does nothing",
                  "the update broke the settings screen", "the page keeps crashing"),
                 ("Bugs and errors in the app or website", "Technical faults: crashes, error pages, broken features",
                  "Fixes software problems and outages")),
    "accounts": (("I forgot my password", "my account is locked", "I cannot receive the login code",
                  "I want to change my username", "someone else signed into my profile"),
                 ("Sign-in, passwords and account access", "Account security and access problems",
                  "Unlocks accounts and resets credentials")),
    "weather": (("will it rain tomorrow", "what is the temperature outside", "is a storm coming this weekend",
                 "how windy will it be on the coast"),
                ("Forecasts and current weather conditions", "Rain, wind and temperature outlooks")),
    "travel": (("book me a flight to the capital", "my train was cancelled", "I need a hotel near the airport",
                "change my seat on the plane"),
               ("Flights, trains and hotel bookings", "Trip planning and travel reservations")),
    "health": (("I need to see a doctor", "my prescription ran out", "book a dental check-up",
                "what are the clinic's opening hours"),
               ("Medical appointments and prescriptions", "Clinics, doctors and medicine")),
    "hr": (("how many vacation days do I have left", "my payslip is missing", "I want to report sick leave",
            "how do I apply for parental leave"),
           ("Leave, pay slips and employment questions", "Human resources: holidays, sick leave and pay")),
    "hardware": (("my laptop screen cracked", "the keyboard stopped working", "the printer is jammed",
                  "my headset has no sound"),
                 ("Repairs and replaces broken devices", "Physical equipment faults and replacements")),
    "legal": (("I need a contract reviewed", "is this clause enforceable", "we received a court summons",
               "check the terms of this licence"),
              ("Contracts, disputes and legal advice", "Reviews agreements and legal risks")),
    "music": (("play something relaxing", "add this song to my playlist", "find the album by that band"),
              ("Plays and recommends music", "Songs, albums and playlists")),
    "food": (("find a vegetarian recipe", "how long do I bake bread", "what can I cook with eggs and rice"),
             ("Recipes and cooking help", "Meals, ingredients and cooking times")),
}
_REQUEST_FORMS = ("{kw}.", "Hi, {kw}.", "Quick question: {kw}?", "Please help, {kw}.", "Hello team, {kw}, thanks.",
                  "{kw}. Can someone look at it?", "Urgent: {kw}!", "Not sure who to ask, but {kw}.")
_COUNT_WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven")


# -- label vocabularies -----------------------------------------------------------------------

def label_style(rng: random.Random) -> Callable[[str], str]:
    """A label naming style drawn per question: the same concept gets a different name each time."""
    prefix = rng.choice(("opt", "route", "to", "q", "pick", "team", "go"))
    styles = (
        lambda w: w,
        lambda w: w.replace(" ", "_"),
        lambda w: w.title().replace(" ", ""),
        lambda w: w.upper().replace(" ", "_"),
        lambda w: f"{prefix}_{w.replace(' ', '_')}",
        lambda w: w.replace(" ", "-"),
    )
    return rng.choice(styles)


def opaque_names(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct names that carry no meaning (queue codes, Greek letters, colours + numbers)."""
    kind = rng.randrange(4)
    if kind == 0:
        pool = [f"queue_{c}{d}" for c in "abcdefghjkmnpqrstuvwxyz" for d in range(1, 10)]
    elif kind == 1:
        pool = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
                "lima", "mike", "november", "oscar", "papa"]
    elif kind == 2:
        pool = [f"{c}_{d}" for c in ("amber", "cobalt", "jade", "ruby", "slate", "ivory", "coral") for d in range(1, 9)]
    else:
        pool = [f"desk {d}" for d in range(1, 40)]
    return rng.sample(pool, n)


def _choice(instructions: str, options: dict[str, str | None], gold: str) -> tuple[dict, dict]:
    assert gold in options, (gold, options)
    return ({"type": "choice", "instructions": instructions, "criteria": dict(options)},
            {"label": gold, "label_origin": "procedural_rule"})


def _noul(instructions: str, truth: bool, rng: random.Random, yes: str | None = None, no: str | None = None):
    q = {"type": "noul", "instructions": instructions}
    if yes and no and rng.random() < 0.5:
        q["criteria"] = {"true": yes, "false": no}
    return q, {"label": "yes" if truth else "no", "label_origin": "procedural_rule"}


def _posterior(instructions: str, p_yes: float, rng: random.Random) -> tuple[dict, dict]:
    """A noul question whose gold is an exact probability (soft target) with its argmax label."""
    q, _ = _noul(instructions, p_yes >= 0.5, rng)
    p = round(p_yes, 6)
    return q, {"label": "yes" if p >= 0.5 else "no", "probabilities": {"no": round(1 - p, 6), "yes": p},
               "label_origin": "procedural_posterior"}


def _score(instructions: str, levels: list[str], level: int) -> tuple[dict, dict]:
    return ({"type": "score", "instructions": instructions, "criteria": list(levels)},
            {"label": str(level), "label_origin": "procedural_rule"})


def _count_levels(value: int, top: int) -> tuple[list[str], int]:
    levels = list(_COUNT_WORDS[:top]) + [f"{_COUNT_WORDS[top]} or more"]
    return levels, min(value, top)


def _numeric_options(rng: random.Random, gold: int, k: int, spread: int) -> dict[str, None]:
    vals = {gold}
    while len(vals) < k:
        vals.add(gold + rng.randint(-spread, spread))
    vals = sorted(vals)
    rng.shuffle(vals)
    return {str(v): None for v in vals}


def _k(rng: random.Random, level: int, available: int, low: int = 2) -> int:
    """Options for a choice question: 2-12, more at higher levels, never more than available."""
    hi = min(available, 12, 3 + 2 * level + 2)
    return max(low, min(hi, rng.randint(low + level, max(low + level, hi))))


# -- the thirteen worlds ------------------------------------------------------------------------

def _arithmetic(rng, level):
    n = 2 + level + rng.randint(0, 2)
    opening = rng.randint(0, 200)
    tx = [{"type": rng.choice(("deposit", "withdrawal")), "amount": rng.randint(1, 20 + 20 * level)} for _ in range(n)]
    close = opening + sum(t["amount"] if t["type"] == "deposit" else -t["amount"] for t in tx)
    state = {"account": {"opening_balance": opening, "transactions": tx}}
    withdrawals = sum(t["type"] == "withdrawal" for t in tx)
    thr = close + rng.choice((-15, -5, -1, 1, 5, 15))
    levels, lv = _count_levels(withdrawals, 4)
    return state, [
        lambda: _choice("What is the closing balance?", _numeric_options(rng, close, _k(rng, level, 12), 10 + 10 * level),
                        str(close)),
        lambda: _noul(f"The closing balance is above {thr}.", close > thr, rng,
                      "The balance ends higher than that.", "The balance ends at or below that."),
        lambda: _score("How many withdrawals were made?", levels, lv),
        lambda: _noul("More money was deposited than withdrawn.", close > opening, rng),
    ]


def _belief(rng, level):
    people = rng.sample(_PEOPLE, 2 + min(level, 2))
    obj = rng.choice(_OBJECTS)
    places = rng.sample(_PLACES, 3 + level)
    where = rng.choice(places)
    present = set(people)
    belief = {p: where for p in people}
    # who is in the room at the start is stated: a person never named again still saw the first placement
    events = [f"{', '.join(people[:-1])} and {people[-1]} are in the room.", f"{people[0]} puts the {obj} in the {where}."]
    for _ in range(1 + level + rng.randint(0, 1)):
        p = rng.choice(people)
        if p in present and len(present) > 1 and rng.random() < 0.4:
            present.discard(p)
            events.append(f"{p} leaves the room.")
        elif p not in present:
            present.add(p)
            events.append(f"{p} comes back.")
        else:
            new = rng.choice([x for x in places if x != where])
            where = new
            events.append(f"{p} moves the {obj} to the {new}.")
            for q in present:
                belief[q] = new
    target = rng.choice(people)
    place_opts = rng.sample([x for x in places if x not in (where, belief[target])],
                            min(len(places) - len({where, belief[target]}), _k(rng, level, len(places)) - 1))
    style = label_style(rng)

    def opts(extra):
        names = sorted(set(place_opts) | set(extra))
        rng.shuffle(names)
        return {style(x): f"the {x}" for x in names}
    return {"story": events}, [
        lambda: _choice(f"Where is the {obj} now?", opts([where, belief[target]]), style(where)),
        lambda: _choice(f"Where will {target} look for the {obj} first?", opts([where, belief[target]]),
                        style(belief[target])),
        lambda: _noul(f"{target} knows where the {obj} is.", belief[target] == where, rng),
        lambda: _noul(f"{target} is in the room at the end.", target in present, rng),
    ]


_STATUS_FLOW = {"created": ("paid", "cancelled"), "paid": ("shipped", "refunded"), "shipped": ("delivered", "returned"),
                "delivered": ("returned",), "returned": ("refunded",), "cancelled": (), "refunded": ()}
_STATUS_DESC = {"created": ("placed but not paid", "awaiting payment"), "paid": ("paid, not yet sent", "payment received"),
                "shipped": ("on its way to the customer", "handed to the courier"),
                "delivered": ("received by the customer", "arrived at the destination"),
                "returned": ("sent back by the customer", "came back to the warehouse"),
                "cancelled": ("cancelled before payment", "called off by the customer"),
                "refunded": ("money given back", "payment reversed")}


def _event_state(rng, level):
    status, log = "created", [{"t": 1, "event": "created"}]
    for step in range(1 + level + rng.randint(0, 2)):
        nxt = _STATUS_FLOW[status]
        if not nxt:
            break
        status = rng.choice(nxt)
        log.append({"t": step + 2, "event": status})
    shown = log[:]
    if level >= 2:  # out-of-order log: the time stamps, not the line order, decide
        rng.shuffle(shown)
    style = label_style(rng)
    names = rng.sample(sorted(_STATUS_DESC), _k(rng, level, len(_STATUS_DESC), low=3))
    if status not in names:
        names[0] = status
    rng.shuffle(names)
    opts = {style(s): rng.choice(_STATUS_DESC[s]) for s in names}
    changes = len(log) - 1
    levels, lv = _count_levels(changes, 4)
    return {"order_id": f"#{rng.randint(1000, 9999)}", "event_log": shown}, [
        lambda: _choice("What is the order's current status?", opts, style(status)),
        lambda: _noul("The order was paid at some point.", any(e["event"] == "paid" for e in log), rng),
        lambda: _score("How many status changes happened after creation?", levels, lv),
        lambda: _noul("The order is still open (not cancelled, refunded or delivered).",
                      status in ("created", "paid", "shipped", "returned"), rng),
    ]


def _evidence(rng, level):
    people = rng.sample(_PEOPLE, 2 + level)
    facts, seen = [], set()
    for _ in range(2 + level * 2):
        p, c, d = rng.choice(people), rng.choice(_CITIES[:6 + level]), rng.choice(_DAYS[:3 + level])
        if (p, d) not in seen:
            seen.add((p, d))
            facts.append({"person": p, "city": c, "day": d})
    rng.shuffle(facts)
    kind = rng.choice(("supported", "refuted", "insufficient"))
    if kind == "insufficient":
        free = [(p, d) for p in people for d in _DAYS if (p, d) not in seen]
        p, d = rng.choice(free)
        c = rng.choice(_CITIES)
    else:
        f = rng.choice(facts)
        p, d = f["person"], f["day"]
        c = f["city"] if kind == "supported" else rng.choice([x for x in _CITIES if x != f["city"]])
    words = rng.choice((("supported", "refuted", "insufficient"), ("true", "false", "unknown"),
                        ("confirmed", "contradicted", "not enough info"), ("yes", "no", "cannot tell")))
    style = label_style(rng)
    descs = ("The records confirm the claim.", "The records contradict the claim.",
             "The records say nothing about this person on that day.")
    opts = {style(w): desc for w, desc in zip(words, descs)}
    gold = style(words[("supported", "refuted", "insufficient").index(kind)])
    keys = list(opts)
    rng.shuffle(keys)
    return {"travel_records": facts, "claim": f"{p} was in {c} on {d}."}, [
        lambda: _choice("Do the records support the claim?", {k: opts[k] for k in keys}, gold),
        lambda: _noul("The records are enough to decide the claim.", kind != "insufficient", rng),
    ]


def _adjudication(rng, level):
    labels = rng.sample(("spam", "safe", "abusive", "off-topic", "duplicate", "promotional", "question", "complaint"),
                        2 + min(level, 3))
    n = 3 + level
    reviewers = [{"reviewer": r, "weight": rng.choice((1, 1, 2, 3)), "label": rng.choice(labels)}
                 for r in rng.sample(_PEOPLE, n)]
    totals = {lab: sum(v["weight"] for v in reviewers if v["label"] == lab) for lab in labels}
    best = max(totals.values())
    winners = [lab for lab, t in totals.items() if t == best]
    style = label_style(rng)
    opts = {style(lab): None for lab in labels}
    if rng.random() < 0.5:
        opts = {style(lab): f"content judged {lab}" for lab in labels}
    keys = list(opts)
    rng.shuffle(keys)
    agree = max(sum(v["label"] == lab for v in reviewers) for lab in labels) / n
    lv = 0 if agree <= 0.5 else (1 if agree < 0.75 else (2 if agree < 1 else 3))  # half is no majority
    qs = [
        lambda: _noul("All reviewers gave the same label.", agree == 1.0, rng),
        lambda: _score("How strongly do the reviewers agree?",
                       ["no majority", "a slim majority", "a clear majority", "unanimous"], lv),
    ]
    if len(winners) == 1:
        qs.append(lambda: _choice("Which label wins when each vote counts its reviewer's weight?",
                                  {k: opts[k] for k in keys}, style(winners[0])))
    return {"item": f"post {rng.randint(100, 999)}", "votes": reviewers}, qs


def _needle(rng, level):
    n = 4 + 6 * level
    names = rng.sample([f"{a}-{b}" for a in ("unit", "crate", "node", "case", "lot") for b in range(100, 400)], n)
    rows = [{"id": x, "code": f"{rng.choice('ABCDEFGHJK')}{rng.randint(10, 99)}", "owner": rng.choice(_PEOPLE)}
            for x in names]
    tgt = rng.choice(rows)
    codes = list(dict.fromkeys([tgt["code"]] + [r["code"] for r in rows if r["code"] != tgt["code"]]))
    k = min(len(codes), _k(rng, level, 12))
    opts = codes[:k]
    rng.shuffle(opts)
    missing = rng.choice([x for x in (f"unit-{b}" for b in range(400, 500))])
    owner = rng.choice(_PEOPLE)
    return {"registry": rows}, [
        lambda: _choice(f"What is the code of {tgt['id']}?", {c: None for c in opts}, tgt["code"]),
        lambda: _noul(f"The registry lists {missing}.", False, rng),
        lambda: _noul(f"The registry lists {tgt['id']}.", True, rng),
        lambda: _noul(f"{owner} owns at least one entry.", any(r["owner"] == owner for r in rows), rng),
    ]


def _partial(rng, level):
    """Exact posteriors: a draw from one of two bags, or a noisy sensor (Bayes' rule)."""
    if rng.random() < 0.5:
        r, b = rng.randint(0, 9), rng.randint(1, 9)
        state = {"bag": {"red": r, "blue": b}, "procedure": "one token is drawn uniformly at random, unseen"}
        return state, [lambda: _posterior("The drawn token is red.", r / (r + b), rng)]
    prior = rng.choice((0.1, 0.2, 0.3, 0.5, 0.7))
    sens, fpr = rng.choice((0.8, 0.9, 0.95)), rng.choice((0.05, 0.1, 0.2, 0.3))
    alarm = rng.random() < 0.7
    like_f = sens if alarm else 1 - sens
    like_n = fpr if alarm else 1 - fpr
    post = prior * like_f / (prior * like_f + (1 - prior) * like_n)
    state = {"machine": {"prior_fault_rate": prior, "alarm_detects_fault": sens, "false_alarm_rate": fpr},
             "observation": "the alarm sounded" if alarm else "the alarm stayed silent"}
    return state, [lambda: _posterior("The machine is faulty.", post, rng),
                   lambda: _noul("The alarm sounded.", alarm, rng)]


_POLICIES = (
    ("refund", "Refunds are allowed within {d} days of purchase for unopened items.",
     lambda c, d: c["days_since_purchase"] <= d and not c["opened"]),
    ("exchange", "Exchanges are allowed within {d} days, opened or not, with a receipt.",
     lambda c, d: c["days_since_purchase"] <= d and c["receipt"]),
    ("repair", "Free repair applies to damaged items within {d} days of purchase.",
     lambda c, d: c["days_since_purchase"] <= d and c["damaged"]),
)


def _policy(rng, level):
    case = {"days_since_purchase": rng.randint(1, 60), "opened": rng.random() < 0.5, "receipt": rng.random() < 0.6,
            "damaged": rng.random() < 0.4}
    pols = [(name, text.format(d=d), rule, d) for (name, text, rule), d in
            zip(_POLICIES, (rng.choice((14, 30, 45)) for _ in _POLICIES))]
    name, text, rule, d = rng.choice(pols)
    applies = [p for p in pols if p[2](case, p[3])]
    style = label_style(rng)
    qs = [lambda: _noul(f"Under this policy the customer qualifies: {text}", rule(case, d), rng,
                        "The case meets every condition.", "Some condition is not met.")]
    if len(applies) == 1:
        opts = {style(p[0]): p[1] for p in pols}
        opts[style("none")] = "No listed policy applies."
        keys = list(opts)
        rng.shuffle(keys)
        qs.append(lambda: _choice("Which single policy applies to this case?", {k: opts[k] for k in keys},
                                  style(applies[0][0])))
    elif not applies:
        opts = {style(p[0]): p[1] for p in pols}
        opts[style("none")] = "No listed policy applies."
        qs.append(lambda: _choice("Which single policy applies to this case?", opts, style("none")))
    return {"case": case, "policies": [p[1] for p in pols]}, qs


def _uncertain_policy(rng, level):
    p = rng.choice((0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9))
    loss_block, loss_allow = rng.choice((1, 2, 5)), rng.choice((5, 10, 20, 50))
    review_cost = rng.choice((1, 2, 3, 4))
    # expected losses: allow risks loss_allow when fraud; block loses loss_block when legitimate;
    # review costs review_cost always
    costs = {"allow": p * loss_allow, "block": (1 - p) * loss_block, "review": review_cost}
    # exact costs: in floats 0.3 * 10 > 3 and (1 - 0.8) * 5 < 1, which broke exact ties
    exact = {"allow": Fraction(str(p)) * loss_allow, "block": (1 - Fraction(str(p))) * loss_block,
             "review": Fraction(review_cost)}
    winners = [a for a, c in exact.items() if c == min(exact.values())]
    float_tie = sum(c == min(costs.values()) for c in costs.values()) > 1
    state = {"transaction": {"fraud_probability": p},
             "costs": {"allowing_a_fraud": loss_allow, "blocking_a_legitimate_payment": loss_block,
                       "manual_review": review_cost},
             "rule": "choose the action with the lowest expected cost"}
    words = rng.choice((("allow", "block", "review"), ("approve", "decline", "escalate"), ("pass", "stop", "check")))
    style = label_style(rng)
    descs = ("let the payment through", "reject the payment", "send it to a human reviewer")
    opts = {style(w): dsc for w, dsc in zip(words, descs)}
    keys = list(opts)
    rng.shuffle(keys)
    thr = rng.choice((0.25, 0.5, 0.75))
    qs = [lambda: _noul(f"The fraud probability exceeds {int(100 * thr)} percent.", p > thr, rng)]
    if not float_tie:  # (the float rule decides whether a question slot exists: other records' draws are kept)
        gold = style(words[("allow", "block", "review").index(winners[0])])
        qs.append(lambda: None if len(winners) > 1 else _choice("Which action has the lowest expected cost?",
                                                                {k: opts[k] for k in keys}, gold))
    return state, qs


def _aggregation(rng, level):
    regions = rng.sample(_REGIONS, 2 + min(level + 1, 6))
    recs = [{"region": rng.choice(regions), "units": rng.randint(1, 30)} for _ in range(4 + 3 * level)]
    totals = {r: sum(x["units"] for x in recs if x["region"] == r) for r in regions}
    best = max(totals.values())
    winners = [r for r, t in totals.items() if t == best]
    style = label_style(rng)
    grand = sum(totals.values())
    a = rng.choice(regions)
    thr = totals[a] + rng.choice((-6, -2, 2, 6))
    lv = sum(grand >= b for b in (40, 80, 120))
    qs = [
        lambda: _noul(f"The {a} region sold more than {thr} units in total.", totals[a] > thr, rng),
        lambda: _score("How many units were sold overall?", ["under 40", "40 to 79", "80 to 119", "120 or more"], lv),
    ]
    if len(winners) == 1:
        opts = {style(r): f"the {r} region" if rng.random() < 0.5 else None for r in regions}
        qs.append(lambda: _choice("Which region sold the most units?", opts, style(winners[0])))
    return {"sales": recs}, qs


def _perturbation(rng, level):
    limit = rng.randint(30, 90)
    value = rng.randint(limit - 20, limit + 20)
    delta = rng.choice((-15, -8, -3, 3, 8, 15))
    after = value + delta
    def status(v):
        return "critical" if v > limit + 10 else ("warning" if v > limit else "normal")
    words = rng.choice((("normal", "warning", "critical"), ("green", "amber", "red"), ("ok", "watch", "alarm"),
                        ("fine", "elevated", "severe")))
    style = label_style(rng)
    descs = (f"at or below {limit}", f"above {limit} by at most 10", f"more than 10 above {limit}")
    opts = {style(w): dsc for w, dsc in zip(words, descs)}
    keys = list(opts)
    rng.shuffle(keys)
    idx = ("normal", "warning", "critical")
    return {"limit": limit, "reading": value, "change": f"the reading {'rises' if delta > 0 else 'falls'} by {abs(delta)}"}, [
        lambda: _choice("What is the status after the change?", {k: opts[k] for k in keys},
                        style(words[idx.index(status(after))])),
        lambda: _noul("The change alters the status.", status(after) != status(value), rng),
        lambda: _choice("What is the status before the change?", {k: opts[k] for k in keys},
                        style(words[idx.index(status(value))])),
    ]


def _table(rng, level):
    cities = rng.sample(_CITIES, 3 + 2 * level)
    rows = [{"city": c, "population_k": rng.randint(10, 900), "color": rng.choice(_COLORS)} for c in cities]
    tgt = rng.choice(rows)
    others = [r for r in rows if r is not tgt]
    col = rng.choice(_COLORS)
    a, b = rng.sample(rows, 2)
    k = _k(rng, level, len(rows))
    opt_rows = [tgt] + rng.sample(others, k - 1)
    rng.shuffle(opt_rows)
    qs = [
        lambda: _choice(f"Which city has a population of {tgt['population_k']} thousand?",
                        {r["city"]: None for r in opt_rows}, tgt["city"])
        if sum(r["population_k"] == tgt["population_k"] for r in rows) == 1 else None,
        lambda: _noul(f"{a['city']} is larger than {b['city']}.", a["population_k"] > b["population_k"], rng),
        lambda: _choice(f"What colour is {tgt['city']}'s flag?",
                        {c: None for c in rng.sample(_COLORS, len(_COLORS))}, tgt["color"]),
        lambda: (lambda lv, top: _score(f"How many cities have a {col} flag?", *(_count_levels(lv, top))))(
            sum(r["color"] == col for r in rows), 3),
    ]
    return {"table": rows}, qs


def _routing(rng, level):
    names = sorted(_DOMAINS)
    k = _k(rng, level, len(names), low=3)
    domains = rng.sample(names, k)
    gold = rng.choice(domains)
    kw = rng.choice(_DOMAINS[gold][0])
    text = rng.choice(_REQUEST_FORMS).format(kw=kw)
    text = text[0].upper() + text[1:]
    if level >= 3:  # a distractor sentence that names no domain
        text += rng.choice((" I have been a customer for years.", " Thanks in advance.", " My name is on the account."))
    opaque = rng.random() < 0.4
    labels = opaque_names(rng, k) if opaque else None
    style = label_style(rng)
    label = {d: (labels[i] if opaque else style(d)) for i, d in enumerate(domains)}
    opts = {label[d]: rng.choice(_DOMAINS[d][1]) for d in domains}
    other = rng.choice([d for d in domains if d != gold])
    state = {"message": text} if rng.random() < 0.5 else text
    return state, [
        lambda: _choice(rng.choice(("Which team should handle this message?", "Route the message to one queue.",
                                    "Which option serves this request?", "Where should this go?")),
                        opts, label[gold]),
        lambda: _noul(f"The message belongs to this area: {rng.choice(_DOMAINS[other][1])}.", False, rng),
        lambda: _noul(f"The message belongs to this area: {rng.choice(_DOMAINS[gold][1])}.", True, rng),
    ]


TASKS: dict[str, Callable] = {
    "arithmetic": _arithmetic, "entity_belief_tracking": _belief, "event_state_reconstruction": _event_state,
    "evidence_sufficiency": _evidence, "multi_view_adjudication": _adjudication, "needle_retrieval": _needle,
    "partial_observation_calibration": _partial, "policy_applicability": _policy,
    "policy_under_uncertainty": _uncertain_policy, "record_aggregation": _aggregation,
    "state_perturbation": _perturbation, "table_lookup": _table, "taxonomy_routing": _routing,
}


def make_record(rng: random.Random, rid: str, task: str, level: int, *, max_questions: int = 4,
                tasks: dict[str, Callable] | None = None, category: str = "procedural") -> dict:
    """One record of ``task`` at ``level``: a state and 1-``max_questions`` typed questions, each
    with a rule-computed target. Metadata (``task``, ``level``) never reaches the model.
    ``tasks`` is the generator table (default :data:`TASKS`; :mod:`noulengine.curricula.scenarios`
    passes its own, with its ``category`` prefix).

    Raises:
        KeyError: unknown task.
    """
    state, makers = (TASKS if tasks is None else tasks)[task](rng, level)
    rng.shuffle(makers)
    want = rng.randint(min(2, len(makers)), min(max_questions, len(makers)))
    questions, targets = {}, {}
    for make in makers:
        if len(questions) >= want:
            break
        made = make()
        if made is None:
            continue
        q, target = made
        field = f"q{len(questions) + 1}"
        questions[field] = q
        targets[field] = target
    return {"id": rid, "state": state, "questions": questions, "targets": targets, "category": f"{category}:{task}",
            "task": task, "level": level}


def generate(n: int, seed: int = 0, *, tasks: tuple[str, ...] | None = None, levels: tuple[int, ...] = LEVELS) -> list[dict]:
    """``n`` records, tasks and levels cycled evenly (a balanced curriculum), deterministic in ``seed``.

    Raises:
        KeyError: an unknown task name.
    """
    return generate_from(TASKS, n, seed, tasks=tasks, levels=levels, id_prefix="proc", what="procedural task")


def generate_from(table: dict[str, Callable], n: int, seed: int, *, tasks: tuple[str, ...] | None,
                  levels: tuple[int, ...], id_prefix: str, what: str, max_questions: int = 4,
                  category: str = "procedural") -> list[dict]:
    """``n`` records of the generators in ``table`` (kinds and levels cycled evenly, one
    ``random.Random(seed)``, ids ``<id_prefix>-<seed>-<i>``, ``category`` ``<category>:<kind>``);
    a record left without questions is skipped. Shared by :func:`generate` and
    :func:`noulengine.curricula.scenarios.generate`.

    Raises:
        KeyError: a kind not in ``table`` (the message names ``what``).
    """
    tasks = tuple(tasks or table)
    for t in tasks:
        if t not in table:
            raise KeyError(f"unknown {what} {t!r}; known: {sorted(table)}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        task = tasks[i % len(tasks)]
        level = levels[(i // len(tasks)) % len(levels)]
        rec = make_record(rng, f"{id_prefix}-{seed}-{i}", task, level, max_questions=max_questions, tasks=table,
                          category=category)
        if rec["questions"]:
            out.append(rec)
    return out
