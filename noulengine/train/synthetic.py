"""Procedural typed decision records with exactly computable labels (training data only).

Each record is a small synthetic state (an inventory, a sensor log, a timeline, a support
request with a tool catalogue, a run summary) and 2-4 questions of all three types whose gold
answers follow from rules over the state: counts, comparisons, thresholds, membership, ordering
and description matching. They teach the *protocol* (read the options, answer with a symbol;
levels; yes/no) rather than a topic. Nothing here is drawn from any evaluation suite.

Deterministic: ``generate(n, seed)`` returns the same records for the same arguments (one
``random.Random(seed)``; ids ``synth-<seed>-<index>``).
"""

from __future__ import annotations

import random
from typing import Callable

_NAMES = ("ana", "ben", "chen", "dara", "eli", "femi", "gus", "hana", "ivo", "jade", "kai", "lena", "mo", "nia",
          "omar", "pia", "raj", "sara", "tom", "uma", "vik", "wen", "yara", "zeb")
_ITEMS = ("cable", "lamp", "desk", "chair", "router", "monitor", "kettle", "stapler", "battery", "printer", "mouse",
          "headset", "camera", "drill", "ladder", "tent", "backpack", "bottle", "jacket", "helmet")
_CATEGORIES = ("electronics", "furniture", "kitchen", "office", "outdoor", "tools")
_SENSORS = ("north", "south", "east", "west", "roof", "cellar", "lobby", "lab", "dock", "garage")
_ACTIONS = ("deployed a fix", "opened a ticket", "restarted the service", "approved the change", "rolled back",
            "paged on-call", "merged the patch", "closed the incident")
# Support domains: a keyword set a request mentions, and the tool/team description that serves it.
_DOMAINS = {
    "weather": (("forecast", "rain tomorrow", "temperature"), "Returns weather forecasts and current conditions"),
    "flights": (("flight", "airport", "boarding pass"), "Searches and books airline flights"),
    "billing": (("invoice", "charged twice", "refund"), "Handles payments, invoices and refunds"),
    "shipping": (("package", "delivery", "tracking number"), "Tracks parcels and delivery status"),
    "passwords": (("password", "locked out", "login code"), "Resets passwords and unlocks accounts"),
    "translation": (("translate", "in Spanish", "French version"), "Translates text between languages"),
    "calendar": (("meeting", "schedule", "reschedule"), "Creates and moves calendar events"),
    "stocks": (("share price", "stock", "market cap"), "Returns stock quotes and market data"),
    "recipes": (("recipe", "cook", "ingredients"), "Finds recipes and cooking instructions"),
    "maps": (("directions", "route to", "how far"), "Gives driving and walking directions"),
    "news": (("headlines", "latest news", "breaking story"), "Returns current news headlines"),
    "hr": (("vacation days", "payslip", "sick leave"), "Answers questions about leave and pay"),
    "hardware": (("laptop broke", "screen cracked", "keyboard"), "Repairs and replaces broken devices"),
    "music": (("playlist", "song", "album"), "Plays and recommends music"),
}
_REQUEST_FORMS = ("Can you help with the {kw}?", "I need something about {kw}, please.", "Quick one: {kw}.",
                  "Hi team, my question concerns the {kw}.", "Please look into this: {kw}.",
                  "Could you check {kw} for me today?")
_COUNT_WORDS = ("none", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def _count_question(instructions: str, value: int, top: int) -> tuple[dict, str]:
    """A score question whose levels are counts 0..top (top = "top or more")."""
    levels = [f"{_COUNT_WORDS[i]}" for i in range(top)] + [f"{_COUNT_WORDS[top]} or more"]
    return {"type": "score", "instructions": instructions, "criteria": levels}, str(min(value, top))


def _noul(instructions: str, truth: bool, rng: random.Random, yes: str | None = None, no: str | None = None):
    q = {"type": "noul", "instructions": instructions}
    if yes and no and rng.random() < 0.5:
        q["criteria"] = {"true": yes, "false": no}
    return q, "yes" if truth else "no"


def _choice(instructions: str, options: dict, gold: str, rng: random.Random) -> tuple[dict, str]:
    keys = list(options)
    rng.shuffle(keys)
    return {"type": "choice", "instructions": instructions, "criteria": {k: options[k] for k in keys}}, gold


def _inventory(rng: random.Random):
    names = rng.sample(_ITEMS, rng.randint(3, 6))
    items = [{"name": n, "qty": rng.randint(0, 12), "price": round(rng.uniform(2, 300), 2),
              "category": rng.choice(_CATEGORIES)} for n in names]
    state = {"inventory": items, "currency": "USD"}
    lo = rng.randint(2, 6)
    qs = [
        lambda: _count_question(f"How many items have a quantity below {lo}?",
                                sum(i["qty"] < lo for i in items), min(5, len(items))),
        lambda: _choice("Which item has the highest price?", {i["name"]: None for i in items},
                        max(items, key=lambda i: i["price"])["name"], rng),
        lambda: _choice("Which item has the lowest quantity in stock?",
                        {i["name"]: f"{i['category']} item" for i in items},
                        min(items, key=lambda i: (i["qty"], i["name"]))["name"], rng)
        if len({i["qty"] for i in items}) == len(items) else None,
        lambda: (lambda t: _noul(f"The total quantity in stock is above {t}.", sum(i["qty"] for i in items) > t, rng,
                                 "More units than that are in stock.", "That many units or fewer are in stock."))(
            sum(i["qty"] for i in items) + rng.choice((-7, -3, -1, 0, 2, 5))),
        lambda: (lambda c: _noul(f"Is there at least one item in the {c} category?",
                                 any(i["category"] == c for i in items), rng))(rng.choice(_CATEGORIES)),
        lambda: (lambda p: _noul(f"Does any item cost more than ${p}?", any(i["price"] > p for i in items), rng))(
            rng.choice((20, 50, 100, 150, 250))),
        lambda: _choice("Which category holds the most items?", {c: None for c in _CATEGORIES},
                        _mode([i["category"] for i in items]), rng) if _mode([i["category"] for i in items]) else None,
        lambda: (lambda top: ({"type": "score", "instructions": "How expensive is the most expensive item?",
                               "criteria": ["under $50", "$50 to $150", "$150 to $250", "over $250"]},
                              str(sum(top >= b for b in (50, 150, 250)))))(max(i["price"] for i in items)),
    ]
    return state, qs


def _mode(values):
    counts = {v: values.count(v) for v in values}
    best = max(counts.values())
    winners = [v for v, c in counts.items() if c == best]
    return winners[0] if len(winners) == 1 else None


def _sensors(rng: random.Random):
    names = rng.sample(_SENSORS, rng.randint(3, 6))
    limit = rng.randint(40, 80)
    readings = {n: rng.randint(limit - 30, limit + 30) for n in names}
    state = {"sensor_readings_celsius": readings, "alarm_limit": limit}
    over = sum(v > limit for v in readings.values())
    qs = [
        lambda: _count_question("How many sensors read above the alarm limit?", over, min(5, len(names))),
        lambda: _noul("At least one sensor is above the alarm limit.", over > 0, rng,
                      "Some reading exceeds the limit.", "Every reading is at or below the limit."),
        lambda: _choice("Which sensor reports the highest temperature?", {n: f"the {n} sensor" for n in names},
                        max(names, key=lambda n: readings[n]), rng) if len(set(readings.values())) == len(names) else None,
        lambda: _choice("Which sensor reports the lowest temperature?", {n: None for n in names},
                        min(names, key=lambda n: readings[n]), rng) if len(set(readings.values())) == len(names) else None,
        lambda: (lambda a, b: _noul(f"Is the {a} sensor warmer than the {b} sensor?", readings[a] > readings[b], rng))(
            *rng.sample(names, 2)),
        lambda: _choice("What should the operator do?",
                        {"ignore": "All readings are at or below the limit.",
                         "inspect": "Exactly one sensor is above the limit.",
                         "evacuate": "Two or more sensors are above the limit."},
                        "ignore" if over == 0 else ("inspect" if over == 1 else "evacuate"), rng),
    ]
    return state, qs


def _timeline(rng: random.Random):
    people = rng.sample(_NAMES, rng.randint(3, 5))
    n = rng.randint(3, 7)
    minutes = sorted(rng.sample(range(8 * 60, 18 * 60), n))
    events = [{"time": f"{m // 60:02d}:{m % 60:02d}", "who": rng.choice(people), "action": rng.choice(_ACTIONS)}
              for m in minutes]
    state = {"incident_log": events}
    who = rng.choice(people)
    qs = [
        lambda: _choice("Who acted first?", {p: None for p in people}, events[0]["who"], rng),
        lambda: _choice("Who made the last entry in the log?", {p: None for p in people}, events[-1]["who"], rng),
        lambda: _count_question(f"How many log entries are by {who}?", sum(e["who"] == who for e in events), 4),
        lambda: _noul(f"Did {who} take part in the incident?", any(e["who"] == who for e in events), rng),
        lambda: (lambda a, b: _noul(f"The entry at {events[a]['time']} came before the entry at {events[b]['time']}.",
                                    a < b, rng))(*rng.sample(range(n), 2)),
        lambda: _count_question("How many entries were logged before noon?",
                                sum(m < 12 * 60 for m in minutes), min(5, n)),
    ]
    return state, qs


def _routing(rng: random.Random):
    domains = rng.sample(sorted(_DOMAINS), rng.randint(3, 6))
    gold = rng.choice(domains)
    kw = rng.choice(_DOMAINS[gold][0])
    state = {"request": rng.choice(_REQUEST_FORMS).format(kw=kw), "channel": rng.choice(("chat", "email", "phone"))}
    style = rng.choice(("tool", "team", "plain"))
    label = {"tool": lambda d: f"get_{d}_data", "team": lambda d: f"{d}_team", "plain": lambda d: d}[style]
    options = {label(d): _DOMAINS[d][1] for d in domains}
    other = rng.choice([d for d in _DOMAINS if d != gold])
    qs = [
        lambda: _choice(rng.choice(("Which tool should handle this request?", "Route the request to one option.",
                                    "Which single option serves this request?")), options, label(gold), rng),
        lambda: _noul(f"The request is about {other}.", False, rng),
        lambda: _noul(f"The request is about {gold}.", True, rng),
        lambda: _noul("The request came in by email.", state["channel"] == "email", rng),
    ]
    return state, qs


def _run_summary(rng: random.Random):
    s = {"steps": rng.randint(1, 40), "tool_errors": rng.choice((0, 0, 1, 2, 3, 5)),
         "retries": rng.randint(0, 4), "finished": rng.random() < 0.6}
    state = {"run": s, "owner": rng.choice(_NAMES)}
    errors = s["tool_errors"]
    qs = [
        lambda: _count_question("How many tool errors occurred?", errors, 4),
        lambda: _noul("The run finished.", s["finished"], rng),
        lambda: _noul(f"The run took more than {(t := rng.choice((5, 10, 20, 30)))} steps.", s["steps"] > t, rng),
        lambda: _choice("What is the run's status?",
                        {"clean": "Finished without tool errors.", "degraded": "Finished with tool errors.",
                         "unfinished": "Did not finish."},
                        "unfinished" if not s["finished"] else ("clean" if errors == 0 else "degraded"), rng),
        lambda: ({"type": "score", "instructions": "How many retries were needed?",
                  "criteria": ["no retries", "one or two", "three or more"]},
                 str(0 if s["retries"] == 0 else (1 if s["retries"] <= 2 else 2))),
    ]
    return state, qs


_WORLDS: tuple[Callable, ...] = (_inventory, _sensors, _timeline, _routing, _run_summary)


def make_record(rng: random.Random, rid: str, *, min_questions: int = 2, max_questions: int = 4) -> dict:
    """One synthetic canonical record (state, 2-4 questions, a target for each)."""
    state, makers = rng.choice(_WORLDS)(rng)
    rng.shuffle(makers)
    want = rng.randint(min_questions, max_questions)
    questions, targets = {}, {}
    for make in makers:
        if len(questions) >= want:
            break
        made = make()
        if made is None:
            continue
        q, label = made
        field = f"q{len(questions) + 1}"
        questions[field] = q
        targets[field] = {"label": label, "label_origin": "synthetic_rule"}
    return {"id": rid, "state": state, "questions": questions, "targets": targets, "category": "synthetic_rules"}


def generate(n: int, seed: int = 0) -> list[dict]:
    """``n`` synthetic records, deterministic in ``seed``."""
    rng = random.Random(seed)
    return [make_record(rng, f"synth-{seed}-{i}") for i in range(n)]
