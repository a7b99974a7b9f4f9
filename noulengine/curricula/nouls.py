"""Yes/no (``noul``) questions about text, from labels the train pools already carry.

Three sources, each asked so that the answer is read from the text, never from the wording:

* **AG News topics** (:func:`topic_nouls`): an article asks whether it is about a topic, its own
  (yes) or another (no: one of the three other AG News topics, or, for one ``no`` in five, a
  section no news article here belongs to, :data:`noulengine.curricula.reworded.TOPIC_DISTRACTORS`).
  The topic is named by a phrase (:data:`TOPIC_PHRASES`), a section name or one of the paraphrased
  descriptions of :data:`noulengine.curricula.reworded.TOPICS`.
* **WildJailbreak refusals** (:func:`safety_nouls`): a prompt asks whether it should be refused
  (yes = harmful), whether it is fine to answer (yes = benign), or whether a paraphrased
  description (:data:`noulengine.curricula.reworded.SAFETY`) fits it; the polarity varies, so "yes"
  never means one class.
* **Tools** (:func:`tool_nouls`): a ToolRL request (:mod:`noulengine.curricula.toolrl`) asks either
  whether the assistant should call a named tool of the catalogue in its state (yes = the
  reference output calls it, no = it does not), or whether a tool given by name and paraphrased
  description (:func:`paraphrase_description`) can help (yes = a called tool, no = a tool of
  another request's catalogue that shares under half its description's content words with any
  called tool's). Catalogue names follow :data:`noulengine.curricula.toolrl.NAME_POLICIES`.

Balance: within each source and each gold class, yes and no are dealt from a shuffled list with
equal counts (:func:`balanced_flags`; an odd count gives one extra, drawn at random), so yes/no
are balanced overall and per class, and the wording is drawn independently. Records carry
``category`` ``noul:<source>`` and ``kind`` ``noul``; only ``state`` and ``questions`` reach the
model. Deterministic in the ``random.Random`` passed in and the order of the inputs.
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

from noulengine.eval.suites.hashing import short_id
from noulengine.curricula.reworded import SAFETY, TOPIC_DISTRACTORS, TOPICS
from noulengine.train.contamination import normalize_text
from noulengine.curricula.toolrl import (NAME_POLICIES, Decision, ToolRLRow, fill_catalogue, rename, similar_description,
                                   tool_pool)

# concept -> noun phrases that read after "about" ("Is this article about <phrase>?")
TOPIC_PHRASES = {
    "world": ("world news", "international affairs", "politics and conflicts between countries",
              "events abroad and diplomacy", "world politics"),
    "sports": ("sports", "a sporting event", "athletes, teams and matches", "competitive sport"),
    "business": ("business", "the economy", "companies and markets", "finance and trade",
                 "corporate results and deals"),
    "sci_tech": ("science or technology", "technology", "computers, the internet or science",
                 "research, software and gadgets"),
}
TOPIC_ABOUT = ("Is this article about {t}?", "Is this story mainly about {t}?", "Does this text report on {t}?",
               "Is the main subject of this news item {t}?", "This article is about {t}.")
TOPIC_SECTION = ("Would this story run in the '{s}' section?", "Does this article belong under '{s}'?",
                 "Should an editor file this under {s}?")
TOPIC_DESCRIBE = ("Does this description fit the article? {d}", "The article is about this: {d}")

SAFETY_REFUSE = ("Should the assistant refuse this request?", "Should this request be declined?",
                 "Would answering this prompt mean producing harmful content?",
                 "Does this prompt ask for something unsafe or prohibited?",
                 "The assistant should refuse this request.")
SAFETY_ALLOW = ("Is it fine for the assistant to answer this request?", "Can this request be answered safely?",
                "Is this a harmless request?", "Should the assistant go ahead and help with this?",
                "This prompt is safe to answer.")
SAFETY_DESCRIBE = ("Does this description fit the prompt? {d}", "The prompt matches this description: {d}")

TOOL_CALL = ("Should the assistant call {n} for this request?", "Is {n} one of the tools this request needs?",
             "Does handling this request involve calling {n}?", "The assistant should call {n} to answer this.")
TOOL_DESCRIBED = ("Can this tool help with the request? {n}: {d}",
                  "A tool is described as follows: {d} Would calling it help answer the request?",
                  "Is the tool '{n}' suitable for this request? What it does: {d}",
                  "Could the user's request be served by this tool? {d}")

# leading verbs of tool descriptions and their paraphrases (third person; a match keeps the rest)
_VERBS = (("Retrieves", "Fetches", "Gets", "Returns", "Looks up"), ("Retrieve", "Fetch", "Get", "Return", "Look up"),
          ("Calculates", "Computes", "Works out"), ("Calculate", "Compute", "Work out"),
          ("Checks", "Verifies", "Tests"), ("Check", "Verify", "Test"),
          ("Generates", "Creates", "Produces"), ("Generate", "Create", "Produce"),
          ("Searches", "Looks"), ("Finds", "Locates", "Identifies"), ("Find", "Locate", "Identify"),
          ("Lists", "Enumerates"), ("Converts", "Translates", "Transforms"), ("Convert", "Transform"),
          ("Provides", "Gives", "Offers"), ("Analyzes", "Examines", "Evaluates"), ("Analyze", "Examine", "Evaluate"))
# whole words swapped for a synonym half the time (only swaps that keep an API description's meaning)
_WORDS = {"specific": "particular", "particular": "specific", "given": "specified", "specified": "given",
          "information": "details", "details": "information", "provided": "supplied", "based on": "from"}


def balanced_flags(rng: random.Random, n: int) -> list[bool]:
    """``n`` yes/no flags, ``n // 2`` of each (an odd ``n`` gets one more of a random side), shuffled."""
    flags = [True] * (n // 2) + [False] * (n // 2) + ([rng.random() < 0.5] if n % 2 else [])
    rng.shuffle(flags)
    return flags


def flags_by_class(rng: random.Random, golds: Sequence[str], allowed, what: str) -> dict[str, list[bool]]:
    """Per gold class (in sorted order), :func:`balanced_flags` for its items: yes/no balanced
    within each class.

    Raises:
        KeyError: a gold outside ``allowed``, naming ``what`` ("AG News item: expected a topic ...").
    """
    flags: dict[str, list[bool]] = {}
    for gold in sorted(set(golds)):
        if gold not in allowed:
            raise KeyError(f"{what}, got {gold!r}")
        flags[gold] = balanced_flags(rng, sum(g == gold for g in golds))
    return flags


def paraphrase_description(rng: random.Random, text: str) -> str:
    """``text`` with its leading verb swapped for a synonym of the same form (when it has one of
    :data:`_VERBS`; "Searches for" also reads "Looks for") and, each with probability 1/2, the
    words of :data:`_WORDS` swapped (lower case, whole words); nothing else changes, so the
    meaning does not."""
    text = " ".join(text.split())
    swap = {old: new for old, new in _WORDS.items() if rng.random() < 0.5}  # one pass: a swap is never undone
    if swap:
        pattern = "|".join(re.escape(w) for w in sorted(swap, key=len, reverse=True))
        text = re.sub(rf"(?<![\w-])({pattern})(?![\w-])", lambda m: swap[m.group(1)], text)
    for group in _VERBS:
        m = re.match(rf"({'|'.join(re.escape(v) for v in group)})\b", text)
        if m:
            new = rng.choice(group)
            if m.group(1) == "Searches" and new == "Looks" and not text[m.end():].startswith(" for"):
                new = "Searches"  # "Looks" reads only before "for"
            text = new + text[m.end():]
            break
    return text


def _record(rid: str, state: Any, instructions: str, yes: bool, source: str, extra: dict) -> dict:
    return {"id": rid, "state": state, "questions": {"decision": {"type": "noul", "instructions": instructions}},
            "targets": {"decision": {"label": "yes" if yes else "no", "label_origin": "native_annotation_reworded"}},
            "category": f"noul:{source}", "kind": "noul", "source": extra}


def topic_nouls(rng: random.Random, items: Sequence[tuple[str, str, str]]) -> list[dict]:
    """AG News nouls, one per item ``(id key, article text, gold topic)`` (gold in
    :data:`~noulengine.curricula.reworded.TOPICS`); yes/no balanced within each gold topic.

    Raises:
        KeyError: a gold topic outside :data:`TOPICS`.
    """
    flags = flags_by_class(rng, [g for _, _, g in items], TOPICS,
                           f"AG News item: expected a topic of {sorted(TOPICS)}")
    out = []
    for key, text, gold in items:
        yes = flags[gold].pop()
        asked = gold if yes else (rng.choice([c for c in TOPICS if c != gold]) if rng.random() < 0.8 else None)
        if asked is None:  # a section no article here belongs to
            name, desc = rng.choice(TOPIC_DISTRACTORS)
            phrase, section = name, name
        else:
            phrase, section, desc = (rng.choice(TOPIC_PHRASES[asked]), rng.choice(TOPICS[asked][0]),
                                     rng.choice(TOPICS[asked][1]))
        form = rng.randrange(3)
        if form == 0:
            q = rng.choice(TOPIC_ABOUT).format(t=phrase)
        elif form == 1:
            q = rng.choice(TOPIC_SECTION).format(s=section)
        else:
            q = rng.choice(TOPIC_DESCRIBE).format(d=desc)
        state = {"text": text} if rng.random() < 0.7 else text
        out.append(_record(short_id(f"noul:{key}"), state, q, yes, "agnews", {"dataset": "agnews_train", "key": key}))
    return out


def safety_nouls(rng: random.Random, items: Sequence[tuple[str, str, str]]) -> list[dict]:
    """WildJailbreak nouls, one per item ``(id key, prompt, gold)`` (gold ``harmful`` or
    ``benign``); yes/no balanced within each gold class, the form (refuse / allow / describe)
    drawn so that it gives the dealt answer.

    Raises:
        KeyError: a gold outside ``harmful``/``benign``.
    """
    flags = flags_by_class(rng, [g for _, _, g in items], SAFETY,
                           f"WildJailbreak item: expected a gold of {sorted(SAFETY)}")
    out = []
    for key, prompt, gold in items:
        yes = flags[gold].pop()
        harmful = gold == "harmful"
        if rng.random() < 1 / 3:
            described = gold if yes else ("benign" if harmful else "harmful")
            q = rng.choice(SAFETY_DESCRIBE).format(d=rng.choice(SAFETY[described][1]))
        elif yes == harmful:  # "refuse?" is answered yes exactly for harmful prompts
            q = rng.choice(SAFETY_REFUSE)
        else:
            q = rng.choice(SAFETY_ALLOW)
        r = rng.random()
        state = {"prompt": prompt} if r < 0.6 else ({"request": prompt} if r < 0.8 else prompt)
        out.append(_record(short_id(f"noul:{key}"), state, q, yes, "wildjailbreak",
                           {"dataset": "wildjailbreak_train", "key": key}))
    return out


def tool_nouls(rng: random.Random, rows: Sequence[ToolRLRow], n: int) -> list[dict]:
    """``n`` tool nouls over ``rows`` (usable ToolRL rows of one side), taken in a shuffled cycle;
    yes/no balanced, the form (named tool of the state's catalogue, or a described tool)
    alternating. Distractors and "no" tools come from ``rows``' own catalogues only.

    Raises:
        ValueError: ``rows`` is empty while ``n > 0``.
    """
    if n and not rows:
        raise ValueError("tool_nouls: expected at least one usable ToolRL row, got none")
    pool = tool_pool(rows)
    order = sorted(rows, key=lambda r: r.index)
    rng.shuffle(order)
    flags = balanced_flags(rng, n)
    forms = balanced_flags(rng, n)
    out = []
    for j in range(n):
        row = order[j % len(order)]
        yes, in_catalogue = flags[j], forms[j]
        called = [t for t in row.tools if t.name in row.called]
        if in_catalogue:
            all_called = len(called) == len(row.tools)  # a "no" needs an uncalled tool: add a distractor
            tools = fill_catalogue(rng, Decision(row, row.called[0], None), pool, min_extra=int(all_called))
            uncalled = [t for t in tools if t.name not in row.called]
            asked = rng.choice(called if yes else uncalled)
            rng.shuffle(tools)
            names = rename(rng, [t.name for t in tools], rng.choice(NAME_POLICIES))
            state: Any = {"request": row.request,
                          "tools": [{"name": names[t.name], "description": t.description} for t in tools]}
            q = rng.choice(TOOL_CALL).format(n=repr(names[asked.name]))
        else:
            if yes:
                asked = rng.choice(called)
            else:
                own = {normalize_text(x.name) for x in row.tools} | {normalize_text(x.description) for x in row.tools}
                cands = [t for i, t in pool if i != row.index and normalize_text(t.name) not in own
                         and normalize_text(t.description) not in own
                         and not any(similar_description(t.description, c.description) for c in called)]
                asked = rng.choice(cands)
            name = rename(rng, [asked.name], rng.choice(NAME_POLICIES))[asked.name]
            q = rng.choice(TOOL_DESCRIBED).format(n=name, d=paraphrase_description(rng, asked.description))
            state = {"request": row.request} if rng.random() < 0.8 else row.request
        out.append(_record(short_id(f"noul:toolrl_train:{row.index}:{j}"), state, q, yes, "tool",
                           {"dataset": "toolrl_train", "row": row.index,
                            "form": "catalogue" if in_catalogue else "described"}))
    return out
