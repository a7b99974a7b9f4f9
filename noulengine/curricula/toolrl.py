"""Train-side "which tool" decisions from ToolRL's SFT rows (``shared/data/toolrl_train``).

Source: ``rlla_sft.json`` (400 rows of ToolACE, Hammer with masked function names, and xLAM
dialogues; Apache-2.0; see its SOURCE.md). Each row has a system ``instruction`` holding a
numbered tool catalogue (``N. Name: ...``, ``Description: ...``, ``Parameters: {...}``), an
``input`` dialogue (``<user> ... </user>`` turns, possibly earlier ``<tool_call>``/``<obs>``
turns) and an ``output``: a ``<think>`` passage, then ``<tool_call>`` lines (one JSON object per
call, ``name`` and ``parameters``) or a plain answer.

Rules, in order (every row left out is counted under its reason in :class:`ToolData.report`):

1. **Parse.** A row that breaks the format raises :class:`~noulengine.records.errors.RecordError`
   naming the row and field. Only the text after the last ``</think>`` is read for calls (the
   reasoning mentions ``<tool_call>`` in prose).
2. **Left out:** ``no_tool_call`` (the output answers without a tool); ``earlier_dialogue_turns``
   (more than one user turn, or earlier tool calls/observations: the request alone would not
   decide); ``duplicate_tool_names`` (a catalogue names two tools alike); ``call_not_in_catalogue``.
3. **Contamination:** a row whose request (its first user message) overlaps a pinned evaluation
   row under :mod:`noulengine.train.contamination`'s rule (id, or whitespace-collapsed,
   lower-cased state text, or any state string of >= 32 characters) is dropped
   (``overlaps_evaluation_suite``); on this file those are 6 rows whose request is a toolace test
   request. Tool descriptions are state strings too, and the toolace suite's catalogues share
   some with this file (69 of 1,215 catalogue entries): a row whose *called* tool is one of them
   is dropped (``called_tool_in_evaluation_suite``); any other such tool is taken out of its
   catalogue (counted as ``catalogue_tools_removed_as_in_evaluation_suite``), so it is never an
   option or a distractor and the trainer's overlap guard never has to refuse a row.
4. **One decision per call.** A row calling one distinct tool (possibly several times) is one
   decision: the request and catalogue -> that tool. A row calling two or more distinct tools
   becomes one decision per distinct tool, in call order, each stating the tools already called
   (``called_so_far``), *only where the order is unambiguous*: each tool's calls form one
   contiguous run (else ``multi_call_interleaved``), every tool has an argument value that the
   request mentions (a number as a whole token, a string of >= 3 characters as a whole word,
   case folded; else ``multi_call_order_not_in_request``), and each tool's earliest mention
   comes after the previous tool's (else ``multi_call_order_disagrees_with_request``). The order
   is then the order the user asks for the tasks in, which the question states.
5. **Split.** Source rows (not decisions) are split into train and selection, so a request never
   appears on both sides; distractor tools are drawn within a side only.
6. **Records.** Each train decision is asked in :data:`NAME_POLICIES` variants: the catalogue's
   names kept, masked as Hammer masks them (random identifiers), or replaced by neutral codes
   (:func:`noulengine.curricula.procedural.opaque_names`), consistently in the state, the options and
   ``called_so_far``; a model must read the descriptions. A catalogue is filled up to 3-6 tools
   with tools of other rows (never one whose name or description equals a catalogue tool's, nor
   one whose description shares half its content words with a called tool's); a one-tool
   catalogue always gets at least two. The order is a permutation with the gold tool's position
   drawn from a per-catalogue-size cycle over every position (:class:`PositionSchedule`), so the
   gold position is uniform over the options (counts per position differ by at most one).

The records have the accuracy-v1 toolace suite's shape: ``state = {"request", "tools": [{"name",
"description"}]}`` (plus ``called_so_far`` for multi-call decisions), one ``choice`` question
``decision`` whose criteria are the same tools in the same order. Only ``state`` and
``questions`` reach the model; ``category`` (``tool:toolrl``), ``kind`` (``tool``) and
``source`` (row, step, name policy) stay record metadata. Deterministic in ``seed`` (one
``random.Random`` per call, inputs iterated in sorted order, no set iteration).
"""

from __future__ import annotations

import json
import random
import re
import string
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from noulengine.eval.suites.hashing import short_id
from noulengine.records.errors import RecordError
from noulengine.train.contamination import normalize_text
from noulengine.curricula.procedural import opaque_names

SOURCE_FILE = "toolrl_train/rlla_sft.json"
SUITE_INSTRUCTIONS = "Which single tool from the catalog should be called for this request?"
SINGLE_QUESTIONS = (SUITE_INSTRUCTIONS, SUITE_INSTRUCTIONS, "Which tool should handle this request?",
                    "Route the user's request to one tool of the catalogue.", "Which function should be called here?",
                    "Pick the API that answers this request.")
NEXT_QUESTIONS = ("The request needs several tools, called in the order it asks for them. Which tool should be "
                  "called next?",
                  "Tools are called in the order the user asks for the tasks; called_so_far lists those already "
                  "called. Which tool comes next?",
                  "Given the tools already called (in the order the request asks for them), which tool should the "
                  "assistant call next?")
NAME_POLICIES = ("original", "masked", "neutral")
CATALOGUE_SIZE = (3, 6)  # a catalogue is filled up to a size drawn from this range (the toolace suite has 3-6)
MAX_CATALOGUE = 8  # the largest catalogue in the source; own tools are never removed
SIMILAR_JACCARD = 0.5  # a distractor sharing this share of content words with a called tool's description is skipped
_MASK_CHARS = string.ascii_letters + string.digits
_STOP = frozenset("this that with from into about given their there which will each other some such these those "
                  "than then them they what when where more most only also have been were your specific".split())


@dataclass(frozen=True)
class Tool:
    """One catalogue entry (name and description as the source writes them)."""

    name: str
    description: str


@dataclass(frozen=True)
class ToolRLRow:
    """One parsed source row.

    Attributes:
        index: 0-based position in ``rlla_sft.json``.
        tools: the catalogue in its numbered order.
        users: the text of each ``<user>`` turn, stripped.
        earlier_turns: the input holds tool calls, observations or responses before the output.
        calls: the output's calls in order, ``(name, arguments)``.
    """

    index: int
    tools: tuple[Tool, ...]
    users: tuple[str, ...]
    earlier_turns: bool
    calls: tuple[tuple[str, Any], ...]

    @property
    def source_id(self) -> str:
        return short_id(f"toolrl_train:{self.index}")

    @property
    def request(self) -> str:
        """The first user message (what the toolace suite's ``state.request`` holds)."""
        return self.users[0] if self.users else ""

    @property
    def called(self) -> tuple[str, ...]:
        """Distinct called tool names in order of first call."""
        return tuple(dict.fromkeys(name for name, _ in self.calls))


@dataclass(frozen=True)
class Decision:
    """One "which tool" decision taken from a source row.

    Attributes:
        row: the source row.
        gold: the called tool's name (original spelling).
        called_so_far: for a multi-call row, the tools called before this one (original names);
            None for a single-tool row.
    """

    row: ToolRLRow
    gold: str
    called_so_far: tuple[str, ...] | None

    @property
    def step(self) -> int:
        return 0 if self.called_so_far is None else len(self.called_so_far)


@dataclass
class ToolData:
    """What :func:`build` returns: records per side and the report (counts per rule)."""

    train_choice: list[dict] = field(default_factory=list)
    selection_choice: list[dict] = field(default_factory=list)
    train_rows: list[ToolRLRow] = field(default_factory=list)
    selection_rows: list[ToolRLRow] = field(default_factory=list)
    report: dict = field(default_factory=dict)


def _fail(index: int, fld: str, rule: str) -> RecordError:
    return RecordError(rule, record_id=f"toolrl_train row {index}", field=fld, file=SOURCE_FILE)


def parse_catalogue(index: int, instruction: str) -> tuple[Tool, ...]:
    """The numbered catalogue of a row's ``instruction``.

    Raises:
        RecordError: no catalogue, numbering not 1..n, or an entry without ``Description:``.
    """
    starts = list(re.finditer(r"^(\d+)\. Name: (.*)$", instruction, re.M))
    if not starts:
        raise _fail(index, "instruction", "expected a numbered tool catalogue ('1. Name: ...'), found none")
    tools = []
    for k, m in enumerate(starts):
        if int(m.group(1)) != k + 1:
            raise _fail(index, "instruction", f"expected catalogue entry {k + 1}, got {m.group(1)}")
        end = starts[k + 1].start() if k + 1 < len(starts) else len(instruction)
        body = instruction[m.end():end]
        d = re.search(r"^Description: (.*?)\nParameters: ", body, re.M | re.S)
        if d is None:
            raise _fail(index, "instruction", f"catalogue entry {k + 1} ({m.group(2)!r}): expected 'Description: ...' "
                                              "then 'Parameters: ...'")
        tools.append(Tool(m.group(2).strip(), " ".join(d.group(1).split())))
    return tuple(tools)


def parse_calls(index: int, output: str) -> tuple[tuple[str, Any], ...]:
    """The ``<tool_call>`` lines after the output's last ``</think>``, in order.

    Raises:
        RecordError: a call line that is not a JSON object with a string ``name``.
    """
    tail = output.rsplit("</think>", 1)[-1]
    calls = []
    for block in re.findall(r"<tool_call>(.*?)</tool_call>", tail, re.S):
        for n, line in enumerate(x.strip() for x in block.strip().splitlines()):
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise _fail(index, "output", f"<tool_call> line {n + 1}: expected a JSON object, got {line[:60]!r} "
                                             f"({exc.msg})") from None
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                raise _fail(index, "output", f"<tool_call> line {n + 1}: expected an object with a string 'name', "
                                             f"got {line[:60]!r}")
            calls.append((obj["name"].strip(), obj.get("parameters", obj.get("arguments", {}))))
    return tuple(calls)


def parse_row(index: int, obj: Any) -> ToolRLRow:
    """One source object -> :class:`ToolRLRow`.

    Raises:
        RecordError: not an object with string ``instruction``, ``input`` and ``output``, or a
            malformed catalogue or call (naming the row and field).
    """
    if not isinstance(obj, dict):
        raise _fail(index, "row", f"expected an object, got {type(obj).__name__}")
    for key in ("instruction", "input", "output"):
        if not isinstance(obj.get(key), str):
            raise _fail(index, key, f"expected a string, got {type(obj.get(key)).__name__}")
    dialogue = obj["input"]
    users = tuple(u.strip() for u in re.findall(r"<user>(.*?)</user>", dialogue, re.S))
    earlier = any(tag in dialogue for tag in ("<tool_call>", "<obs>", "<response>"))
    return ToolRLRow(index, parse_catalogue(index, obj["instruction"]), users, earlier,
                     parse_calls(index, obj["output"]))


def load_rows(path: str | Path) -> list[ToolRLRow]:
    """Parse ``rlla_sft.json`` (a JSON array).

    Raises:
        RecordError: the file is not a JSON array, or a row breaks the format.
    """
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise RecordError(f"expected a JSON array of rows, got {type(data).__name__}", file=str(path))
    return [parse_row(i, obj) for i, obj in enumerate(data)]


# -- rules 2-4 ---------------------------------------------------------------------------------------------

def _values(args: Any):
    if isinstance(args, dict):
        for v in args.values():
            yield from _values(v)
    elif isinstance(args, list):
        for v in args:
            yield from _values(v)
    elif isinstance(args, bool) or args is None:
        return
    elif isinstance(args, (int, float)):
        yield repr(args)
        if isinstance(args, float) and args.is_integer():
            yield str(int(args))
    elif isinstance(args, str):
        yield args.strip()
        if re.fullmatch(r"-?\d+\.0+", args.strip()):  # "101.0" is mentioned as "101"
            yield args.strip().split(".")[0]


def _mention(request: str, value: str) -> int | None:
    """Where the request first mentions an argument value (case folded), or None: a number as a
    whole token (``5`` not inside ``1.5``), a string of >= 3 characters as a whole word."""
    if re.fullmatch(r"-?\d+(\.\d+)?", value):
        m = re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", request)
    elif len(value) >= 3:
        m = re.search(rf"(?<!\w){re.escape(value)}(?!\w)", request, re.I)
    else:
        return None
    return m.start() if m else None


def call_order(row: ToolRLRow) -> tuple[tuple[str, ...] | None, str | None]:
    """The distinct called tools in an unambiguous order, or ``(None, reason)`` (rule 4)."""
    runs = [name for k, (name, _) in enumerate(row.calls) if k == 0 or row.calls[k - 1][0] != name]
    if len(runs) != len(set(runs)):
        return None, "multi_call_interleaved"
    anchors = []
    for name in runs:
        found = [p for _, args in (c for c in row.calls if c[0] == name) for v in _values(args)
                 if (p := _mention(row.request, v)) is not None]
        if not found:
            return None, "multi_call_order_not_in_request"
        anchors.append(min(found))
    if any(b <= a for a, b in zip(anchors, anchors[1:])):
        return None, "multi_call_order_disagrees_with_request"
    return tuple(runs), None


def usable(row: ToolRLRow) -> str | None:
    """The rule-2 reason ``row`` is left out, or None."""
    if not row.calls:
        return "no_tool_call"
    if len(row.users) != 1 or row.earlier_turns:
        return "earlier_dialogue_turns"
    names = [t.name for t in row.tools]
    if len(names) != len(set(names)):
        return "duplicate_tool_names"
    if any(name not in names for name, _ in row.calls):
        return "call_not_in_catalogue"
    return None


def decisions_of(row: ToolRLRow) -> tuple[list[Decision], str | None]:
    """The decisions a usable row gives (rule 4), or ``([], reason)``."""
    called = row.called
    if len(called) == 1:
        return [Decision(row, called[0], None)], None
    order, reason = call_order(row)
    if order is None:
        return [], reason
    return [Decision(row, name, order[:k]) for k, name in enumerate(order)], None


# -- rule 6 ------------------------------------------------------------------------------------------------

class PositionSchedule:
    """Gold positions uniform over the options: per catalogue size ``k``, positions are dealt from
    shuffled cycles of ``range(k)``, so after any number of catalogues of size ``k`` the counts per
    position differ by at most one."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._left: dict[int, list[int]] = {}

    def next(self, k: int) -> int:
        """The gold's 0-based position in the next catalogue of ``k`` options."""
        left = self._left.get(k)
        if not left:
            left = list(range(k))
            self.rng.shuffle(left)
            self._left[k] = left
        return left.pop()


def _content(text: str) -> frozenset[str]:
    return frozenset(w for w in re.findall(r"[a-z]{4,}", text.lower()) if w not in _STOP)


def similar_description(a: str, b: str) -> bool:
    """Whether two descriptions share at least :data:`SIMILAR_JACCARD` of their content words
    (lower-cased words of >= 4 letters, a few function words left out)."""
    x, y = _content(a), _content(b)
    return bool(x and y) and len(x & y) / len(x | y) >= SIMILAR_JACCARD


def masked_name(rng: random.Random) -> str:
    """A Hammer-style masked identifier: 5-14 letters, digits, ``_`` or ``.``, starting with an alphanumeric."""
    n = rng.randint(5, 14)
    return rng.choice(_MASK_CHARS) + "".join(rng.choice(_MASK_CHARS + "_.") if rng.random() < 0.1 else
                                              rng.choice(_MASK_CHARS) for _ in range(n - 1))


def rename(rng: random.Random, names: Sequence[str], policy: str) -> dict[str, str]:
    """A name map for one record: ``original`` keeps names, ``masked`` draws Hammer-style random
    identifiers, ``neutral`` draws codes that carry no meaning (queue codes, Greek letters, colours).

    Raises:
        ValueError: an unknown policy.
    """
    if policy == "original":
        return {n: n for n in names}
    if policy == "masked":
        out: dict[str, str] = {}
        for n in names:
            new = masked_name(rng)
            while new in out.values():
                new = masked_name(rng)
            out[n] = new
        return out
    if policy == "neutral":
        return dict(zip(names, opaque_names(rng, len(names))))
    raise ValueError(f"name policy must be one of {list(NAME_POLICIES)}, got {policy!r}")


def fill_catalogue(rng: random.Random, decision: Decision, pool: Sequence[tuple[int, Tool]], *,
                   min_extra: int = 0) -> list[Tool]:
    """The decision's own catalogue plus distractors of other rows, up to a size drawn from
    :data:`CATALOGUE_SIZE` (never below the own size; a one-tool catalogue gets at least two;
    at least ``min_extra`` distractors), in the source order (the caller permutes).

    ``pool``: ``(source row index, tool)`` of the same side, sorted.
    """
    own = list(decision.row.tools)
    want = min(MAX_CATALOGUE, max(len(own), rng.randint(*CATALOGUE_SIZE), 3 if len(own) == 1 else 0))
    want = max(want, len(own) + min_extra)
    if want <= len(own):
        return own
    called = [t.description for t in own if t.name in decision.row.called]
    names = {normalize_text(t.name) for t in own}
    descs = {normalize_text(t.description) for t in own}
    cands = [t for i, t in pool if i != decision.row.index and normalize_text(t.name) not in names
             and normalize_text(t.description) not in descs
             and not any(similar_description(t.description, c) for c in called)]
    extra: list[Tool] = []
    for t in rng.sample(cands, min(len(cands), 3 * (want - len(own)))):  # a few spares: picks must differ
        if len(extra) == want - len(own):
            break
        if normalize_text(t.name) in names or normalize_text(t.description) in descs:
            continue
        names.add(normalize_text(t.name))
        descs.add(normalize_text(t.description))
        extra.append(t)
    return own + extra


def choice_record(rng: random.Random, decision: Decision, pool: Sequence[tuple[int, Tool]], policy: str,
                  positions: PositionSchedule, variant: int) -> dict:
    """One canonical record for ``decision`` under name ``policy`` (rule 6)."""
    tools = fill_catalogue(rng, decision, pool)
    gold = next(t for t in tools if t.name == decision.gold)
    others = [t for t in tools if t is not gold]
    rng.shuffle(others)
    slot = positions.next(len(tools))
    order = others[:slot] + [gold] + others[slot:]
    names = rename(rng, [t.name for t in order], policy)
    state: dict[str, Any] = {"request": decision.row.request,
                             "tools": [{"name": names[t.name], "description": t.description} for t in order]}
    if decision.called_so_far is None:
        instructions = rng.choice(SINGLE_QUESTIONS)
    else:
        state["called_so_far"] = [names[n] for n in decision.called_so_far]
        instructions = rng.choice(NEXT_QUESTIONS)
    rid = short_id(f"toolrl_train:{decision.row.index}:{decision.step}:{variant}")
    return {"id": rid, "state": state,
            "questions": {"decision": {"type": "choice", "instructions": instructions,
                                       "criteria": {names[t.name]: t.description for t in order}}},
            "targets": {"decision": {"label": names[gold.name], "label_origin": "native_annotation_reworded"}},
            "category": "tool:toolrl", "kind": "tool",
            "source": {"dataset": "toolrl_train", "row": decision.row.index, "step": decision.step, "names": policy}}


def tool_pool(rows: Sequence[ToolRLRow]) -> list[tuple[int, Tool]]:
    """``(row index, tool)`` for every catalogue tool of ``rows``, first occurrence of each
    (name, description) kept, in row order."""
    seen, out = set(), []
    for row in sorted(rows, key=lambda r: r.index):
        for t in row.tools:
            if (t.name, t.description) not in seen:
                seen.add((t.name, t.description))
                out.append((row.index, t))
    return out


def choice_records(rows: Sequence[ToolRLRow], *, seed: int, variants: int) -> list[dict]:
    """Every decision of ``rows`` asked ``variants`` times (name policies cycled from a random
    start per decision), distractors drawn from ``rows``' own catalogues."""
    rng = random.Random(seed)
    positions = PositionSchedule(rng)
    pool = tool_pool(rows)
    out = []
    for row in sorted(rows, key=lambda r: r.index):
        for decision in decisions_of(row)[0]:
            start = rng.randrange(len(NAME_POLICIES))
            for v in range(variants):
                out.append(choice_record(rng, decision, pool, NAME_POLICIES[(start + v) % len(NAME_POLICIES)],
                                         positions, v))
    return out


def build(path: str | Path, *, index, seed: int, selection_rows: int, variants: int) -> ToolData:
    """Rules 1-6 over ``rlla_sft.json``.

    Args:
        path: the source file.
        index: an :class:`~noulengine.train.contamination.EvaluationIndex` (rule 3).
        seed: the seed of the split and of every record.
        selection_rows: source rows held out for selection (one variant per decision there).
        variants: records per train decision (cycling :data:`NAME_POLICIES`).

    Returns:
        :class:`ToolData`; ``report`` counts source rows per outcome and reason, decisions and
        records per side, and lists the dropped overlapping rows with the suite they overlap.

    Raises:
        RecordError: a malformed source row.
        ValueError: ``selection_rows`` exceeds the usable rows.
    """
    rows = load_rows(path)
    reasons: Counter = Counter()
    kept, overlaps, removed = [], [], 0
    for row in rows:
        reason = usable(row)
        if reason is None:
            hit = index.overlap(row.source_id, {"request": row.request})
            if hit is not None:
                reason = "overlaps_evaluation_suite"
                overlaps.append({"row": row.index, "field": hit[0], "rule": hit[1]})
        if reason is None:
            in_eval = [index.overlap(row.source_id, {"name": t.name, "description": t.description}) is not None
                       for t in row.tools]
            if any(hit and t.name in row.called for hit, t in zip(in_eval, row.tools)):
                reason = "called_tool_in_evaluation_suite"
            else:
                removed += sum(in_eval)
                row = replace(row, tools=tuple(t for hit, t in zip(in_eval, row.tools) if not hit))
        if reason is None:
            reason = decisions_of(row)[1]
        if reason is None:
            kept.append(row)
        else:
            reasons[reason] += 1
    if selection_rows > len(kept):
        raise ValueError(f"selection_rows: expected at most {len(kept)} usable source rows, got {selection_rows}")
    rng = random.Random(seed)
    held = set(rng.sample([r.index for r in kept], selection_rows))
    data = ToolData(train_rows=[r for r in kept if r.index not in held],
                    selection_rows=[r for r in kept if r.index in held])
    data.train_choice = choice_records(data.train_rows, seed=seed + 1, variants=variants)
    data.selection_choice = choice_records(data.selection_rows, seed=seed + 2, variants=1)
    for rec in data.selection_choice:
        rec["validation_role"] = "selection"
    n_dec = {side: sum(len(decisions_of(r)[0]) for r in rs)
             for side, rs in (("train", data.train_rows), ("selection", data.selection_rows))}
    data.report = {
        "source_rows": len(rows), "kept_rows": len(kept), "left_out": dict(sorted(reasons.items())),
        "overlaps_evaluation_suite": overlaps, "catalogue_tools_removed_as_in_evaluation_suite": removed,
        "multi_call_rows_kept": sum(len(r.called) > 1 for r in kept),
        "one_tool_catalogues_filled": sum(len(r.tools) == 1 for r in kept),
        "train": {"source_rows": len(data.train_rows), "decisions": n_dec["train"], "records": len(data.train_choice)},
        "selection": {"source_rows": len(data.selection_rows), "decisions": n_dec["selection"],
                      "records": len(data.selection_choice)},
        "rules": "see noulengine.curricula.toolrl (module docstring)",
    }
    return data
