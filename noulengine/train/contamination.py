"""The evaluation-overlap guard: training on test data must be impossible by accident.

Every suite registered under ``benchmarks/`` (accuracy-v1, the known-distribution pilot, any
suite added later) pins its rows in a manifest. Before training, each available suite's prepared
file is verified against its pins and indexed by record id and by *normalised state text*; a
training row whose id or normalised state text occurs in that index is refused.

Normalised text (the same rule validation-v1 uses against the test suites): whitespace collapsed,
lower-cased. Two keys are indexed per evaluation row: the whole state rendered as canonical JSON,
and each string inside the state of at least ``MIN_LEAF_CHARS`` characters, so a test article
copied into another key (``{"article": ...}`` instead of ``{"text": ...}``) is still caught.
A suite whose manifest sets ``"overlap_leaf_strings": false`` is indexed by whole state only: a
procedural suite's states are built from the same template sentences as the training curriculum
("one token is drawn uniformly at random, unseen" is in every bag world), so its strings are not
evidence of a copied row; its whole states are (benchmarks/procedural-v1).

Rows with images are indexed by the sha256 of each image's decoded pixels instead
(:func:`noulengine.vision.inputs.pixel_digest`: RGB pixels and size, so a re-encoded or renamed
copy is caught; a lossy re-encoding such as JPEG is not): their evidence is the image, and their
state text is often shared by every row ("Look at the image."). A training row that holds any
evaluation image is refused; its state text is checked against the text-only rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from noulengine.records.schema import canonical_json

MIN_LEAF_CHARS = 32


def normalize_text(text: str) -> str:
    """Whitespace collapsed, lower-cased (validation-v1's overlap rule)."""
    return " ".join(text.split()).lower()


def _string_leaves(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _string_leaves(v)
    elif isinstance(value, list):
        for v in value:
            yield from _string_leaves(v)


def state_key(state: Any) -> str:
    """The normalised text of a whole state (a string as it is, anything else as canonical JSON)."""
    return normalize_text(state if isinstance(state, str) else canonical_json(state))


def state_keys(state: Any, *, leaves: bool = True) -> set[str]:
    """The normalised texts a state is indexed (and checked) under: the whole state and, with
    ``leaves``, each string in it of at least ``MIN_LEAF_CHARS`` characters."""
    keys = {state_key(state)}
    if leaves:
        keys.update(normalize_text(s) for s in _string_leaves(state) if len(s.strip()) >= MIN_LEAF_CHARS)
    keys.discard("")
    return keys


@dataclass
class EvaluationIndex:
    """Ids and normalised state texts of every pinned evaluation row.

    Attributes:
        ids: record id -> suite name.
        texts: normalised state text -> suite name.
        suites: per suite, ``{"rows": n}`` or ``{"status": ...}`` when it could not be indexed.
    """

    ids: dict[str, str] = field(default_factory=dict)
    texts: dict[str, str] = field(default_factory=dict)
    suites: dict[str, dict] = field(default_factory=dict)
    images: dict[str, str] = field(default_factory=dict)

    def add(self, suite: str, record_id: str | None, state: Any, image_digests: tuple[str, ...] = (), *,
            leaves: bool = True) -> None:
        """Index one evaluation row (``image_digests``: its images' pixel digests; ``leaves``: its
        long state strings too, not only the whole state)."""
        if record_id is not None:
            self.ids.setdefault(record_id, suite)
        if image_digests:
            for digest in image_digests:
                self.images.setdefault(digest, suite)
            return
        for key in state_keys(state, leaves=leaves):
            self.texts.setdefault(key, suite)

    def overlap(self, record_id: str, state: Any, images=()) -> tuple[str, str] | None:
        """``(field, rule)`` a training row breaks by overlapping an evaluation row, or None.

        Args:
            images: the row's :class:`~noulengine.records.schema.Image` objects.

        Raises:
            RecordError: an image cannot be decoded (naming the record and ``images[i]``).
        """
        if record_id in self.ids:
            return "id", f"id {record_id!r} is a row of evaluation suite {self.ids[record_id]!r}"
        from noulengine.vision.inputs import pixel_digest

        for i, image in enumerate(images if self.images else ()):  # decode only when there is something to match
            digest = pixel_digest(image, record_id=record_id, field=f"images[{i}]")
            if digest in self.images:
                return f"images[{i}]", (f"images[{i}] has the pixels of an image of evaluation suite "
                                        f"{self.images[digest]!r} (pixel sha256 {digest[:16]}...); test rows never "
                                        "feed training")
        for key in sorted(state_keys(state)):
            if key in self.texts:
                shown = key if len(key) <= 60 else key[:57] + "..."
                return "state", (f"state text {shown!r} occurs in evaluation suite {self.texts[key]!r} "
                                 "(whitespace-collapsed, lower-cased); test rows never feed training")
        return None

    def summary(self) -> dict:
        return {"suites": self.suites, "ids": len(self.ids), "texts": len(self.texts), "images": len(self.images),
                "rule": f"id, or whitespace-collapsed lower-cased state JSON or any state string of >= "
                        f"{MIN_LEAF_CHARS} chars (rows without images; whole state only for suites whose manifest "
                        "sets overlap_leaf_strings false), or an image's pixels (sha256 of RGB pixels and size)"}


def build_evaluation_index(*, source: str | None = None, prepare: bool = True) -> EvaluationIndex:
    """Index every registered evaluation suite (preparing it from raw data when needed).

    A suite whose data is not on this machine cannot be indexed; it is listed in
    :attr:`EvaluationIndex.suites` with its status (and ``training.json`` records it).

    Raises:
        noulengine.eval.suites.errors.PreparedFileChangedError / SourceFileChangedError: a
            prepared or raw file differs from its manifest pin (the index would be unreliable).
    """
    from noulengine.eval.suites.registry import get_suite, list_suites

    index = EvaluationIndex()
    for name in list_suites():
        suite = get_suite(name)
        rows = None
        try:
            path = suite.prepare(source) if prepare else suite.verify()
            if suite.format not in ("canonical", "jevbench"):  # a benchmark family's upstream rows, projected at load
                rows = suite.load(source=source, auto_prepare=False)
        except Exception as exc:  # noqa: BLE001 - recorded per suite; hash mismatches re-raised below
            from noulengine.eval.suites.errors import PreparedFileChangedError, SourceFileChangedError

            if isinstance(exc, (PreparedFileChangedError, SourceFileChangedError)):
                raise
            index.suites[name] = {"status": "unavailable", "reason": str(exc).splitlines()[0][:200]}
            continue
        if rows is not None:
            index_records(index, suite, rows)
        else:
            index_suite(index, suite, path)
    return index


def index_records(index: EvaluationIndex, suite, rows) -> None:
    """Add a suite's loaded ``(row, Record)`` pairs to ``index``: for the benchmark families
    (:mod:`noulengine.eval.suites.families`), whose upstream rows span several files or keep the
    state as a JSON string, so the model's own evidence is indexed, not the raw line."""
    from noulengine.vision.inputs import pixel_digest

    leaves = suite.manifest.get("overlap_leaf_strings", True) is not False
    for _, rec in rows:
        index.add(suite.name, rec.id, rec.request.state, tuple(pixel_digest(im) for im in rec.request.images),
                  leaves=leaves)
    index.suites[suite.name] = {"rows": len(rows), "path": str(suite.prepared_dir),
                                **({} if leaves else {"leaf_strings": False})}


def index_suite(index: EvaluationIndex, suite, path: Path) -> None:
    """Add every row of ``suite``'s prepared file ``path`` to ``index`` (by the rule its manifest sets)."""
    from noulengine.records.loader import iter_jsonl, parse_json_line

    leaves = suite.manifest.get("overlap_leaf_strings", True) is not False
    rows = 0
    for n, text in iter_jsonl(path):
        obj = parse_json_line(text, file=path, line=n)
        if not isinstance(obj, dict):
            continue
        state = obj.get("state")  # canonical and jevbench rows both keep the evidence here
        rid = obj.get("id") if isinstance(obj.get("id"), str) else None
        index.add(suite.name, rid, state, _image_digests(obj.get("images"), path.parent), leaves=leaves)
        rows += 1
    index.suites[suite.name] = {"rows": rows, "path": str(path), **({} if leaves else {"leaf_strings": False})}


def _image_digests(images: Any, media_root: Path) -> tuple[str, ...]:
    """The pixel digest of each image of an evaluation row (paths relative to its prepared file)."""
    from noulengine.records.images import coerce_image
    from noulengine.vision.inputs import pixel_digest

    if not isinstance(images, list):
        return ()
    return tuple(pixel_digest(coerce_image(raw, media_root=media_root)) for raw in images)
