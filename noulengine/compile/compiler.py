"""Compiler: a :class:`~noulengine.records.Request` to a packed token tree with readout terms.

Readout modes, per question:

1. ``symbols``: choice labels map in criteria order to A, B, ...; score levels to 0, 1, ...;
   noul to no/yes. One token read at the answer position.
2. ``label-token``: the first token of each candidate's own text (and of its capitalised
   spelling); texts whose first tokens collide cannot use it. Noul reads "no"/"No" and
   "yes"/"Yes" as alternatives.
3. ``label-sequence``: the full log-likelihood of each candidate's text plus the end-of-answer
   token, each candidate a branch of the same pass (tree attention): any number of options works.

A candidate's text (:func:`~noulengine.compile.render.candidate_texts`) is a choice option's label;
for a score question whose levels all have distinct non-blank descriptions, the level's own
description ("can wait", "this week", "today"), else its digit. Decisions stay keyed by the labels
(score: ``"0".."n-1"``).

``auto`` picks, per question: noul -> label-token (yes/no words); score without level texts ->
symbols (digits); choice, and score with level texts -> label-token when the first tokens are
distinct, else label-sequence.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass

from noulengine.compile.layout import (READOUT_MODES, CompiledRequest, QuestionPlan, SequenceBuilder,
                                       common_prefix_length)
from noulengine.compile.render import (DEFAULT_LAYOUT, candidate_texts, check_layout, prompt_version,
                                       reads_level_texts, render_cue, render_evidence, render_question, render_schema,
                                       render_state)
from noulengine.compile.symbols import DIGITS, NOUL_CASED, NOUL_WORDS, SYMBOLS, single_token_in_context
from noulengine.compile.template import PromptFrame, TextTokenizer, build_frame
from noulengine.records.errors import OverlengthError, RecordError, TokenizerError, UnsupportedModalityError
from noulengine.records.schema import Question, Request, canonical_json

DEBIAS_MODES = ("none", "permute", "contextual")
MAX_PERMUTE_VIEWS = 16


@dataclass(frozen=True)
class CompilerConfig:
    """Compiler settings.

    Attributes:
        readout: ``auto`` or one of ``symbols``, ``label-token``, ``label-sequence``.
        debias: ``none``, ``permute`` (rotations of choice options as extra branches) or
            ``contextual`` (the engine divides by a content-free prior; compiled like ``none``).
        max_positions: the context window in tokens; a request whose deepest branch needs more
            is rejected, never truncated.
        max_packed_tokens: the most packed tokens one request may take (prefix + all branches).
        use_chat_template: None uses the model's chat template when it has one.
        symbols_fallback: with readout ``symbols``, read a question with more candidates than
            there are symbols (62 for choice, 10 for score) with ``label-sequence`` instead of
            refusing it (set for symbol-trained models read with their own readout, so they
            still accept 2..255 options).
        layout: the prompt layout (:data:`noulengine.compile.render.LAYOUTS`): ``state-first``
            (``HEAD + state + question + TAIL``) or ``schema-first`` (``HEAD + questions + state +
            cue + TAIL``: the questions a workload repeats form a token prefix shared across
            requests). Part of the prompt version.
    """

    readout: str = "auto"
    debias: str = "none"
    max_positions: int = 8192
    max_packed_tokens: int = 32768
    use_chat_template: bool | None = None
    symbols_fallback: bool = False
    layout: str = DEFAULT_LAYOUT

    def __post_init__(self):
        check_layout(self.layout)
        if self.readout not in ("auto",) + READOUT_MODES:
            raise ValueError(f"readout must be 'auto' or one of {list(READOUT_MODES)}, got {self.readout!r}")
        if self.debias not in DEBIAS_MODES:
            raise ValueError(f"debias must be one of {list(DEBIAS_MODES)}, got {self.debias!r}")


class Compiler:
    """Compiles requests for one tokenizer.

    Only ``request.state``, ``request.questions`` and ``request.images`` are read: ids, targets,
    roles and metadata cannot reach the prompt.

    Args:
        tokenizer: the model's Hugging Face tokenizer (or a :class:`TextTokenizer`).
        config: :class:`CompilerConfig`.
        vision: a vision-language model's family adapter
            (:class:`noulengine.vision.VisionAdapter`); None for a text-only model, which refuses
            requests with images.

    A request's images go at the start of the user content, before the state, as the block the
    processor expands their placeholders to (``HEAD + images + state + question + TAIL``; the
    image block is its own tokenization piece: it holds special tokens).
    """

    def __init__(self, tokenizer, config: CompilerConfig | None = None, *, vision=None):
        self.config = config or CompilerConfig()
        self.vision = vision
        self.tok = tokenizer if isinstance(tokenizer, TextTokenizer) else TextTokenizer(tokenizer)
        self.frame: PromptFrame = build_frame(self.tok, use_chat_template=self.config.use_chat_template)
        self._symbol_ids: dict[str, int] = {}
        self._symbol_errors: dict[str, str] = {}
        for sym in SYMBOLS + NOUL_WORDS + NOUL_CASED:
            tid = single_token_in_context(self.tok, self.frame.tail_text, self.frame.tail_ids, sym)
            if tid is None:
                alone = list(self.tok.encode_user(sym))
                after = list(self.tok.encode_template(self.frame.tail_text + sym)[len(self.frame.tail_ids):])
                self._symbol_errors[sym] = (f"tokenizer {self.tok.name}: {sym!r} is not a single token after the answer "
                                            f"cue {self.frame.tail_text!r} (alone: ids {alone}; after the cue: ids "
                                            f"{after})")
            else:
                self._symbol_ids[sym] = tid
        if self.config.readout == "symbols":
            self.require_symbols(SYMBOLS + NOUL_WORDS)
        elif self.config.readout in ("auto", "label-token"):
            # both read a noul question as the words no/No and yes/Yes: a word that is not one token
            # would lose its probability silently, so the tokenizer is refused up front
            self.require_symbols(NOUL_WORDS + NOUL_CASED, readout=self.config.readout)
        self._branch_cache: dict = {}
        self._label_cache: dict[str, tuple[int, ...]] = {}
        self._frame_head: tuple[int, ...] | None = None
        self._static_cache: dict[str, tuple[int, ...]] = {}

    @property
    def layout(self) -> str:
        """The prompt layout this compiler writes (``state-first`` or ``schema-first``)."""
        return self.config.layout

    @property
    def prompt_version(self) -> str:
        """The prompt version of this compiler's wording and layout (recorded in run metadata,
        ``training.json`` and calibration files)."""
        return prompt_version(self.config.layout)

    # -- symbols ----------------------------------------------------------------------------
    def require_symbols(self, symbols, *, readout: str = "symbols") -> list[int]:
        """Token ids of ``symbols``; raises :class:`TokenizerError` naming the first bad one, the
        tokenizer and the ids it gives."""
        out = []
        for s in symbols:
            if s in self._symbol_errors:
                raise TokenizerError(self._symbol_errors[s] + f"; this tokenizer cannot use the {readout} readout")
            out.append(self._symbol_ids[s])
        if len(set(out)) != len(out):
            raise TokenizerError(f"tokenizer {self.tok.name}: symbols {list(symbols)} do not map to distinct tokens "
                                 f"(ids {out})")
        return out

    # -- mode choice ------------------------------------------------------------------------
    @staticmethod
    def label_variants(label: str) -> tuple[str, ...]:
        """Spellings credited to a candidate text: as given, and with its first letter upper-cased.

        Small chat models answer "Sports" for a label written "sports" (or "Today" for a level
        "today"); both spellings count as the same candidate (their probabilities are added).
        """
        return tuple(dict.fromkeys((label, label[:1].upper() + label[1:])))

    @classmethod
    def text_variants(cls, texts) -> list[tuple[str, ...]]:
        """Per candidate text, its spellings (:meth:`label_variants`) minus any spelling that is
        also another candidate's."""
        per = [cls.label_variants(text) for text in texts]
        counts: dict[str, int] = {}
        for variants in per:
            for v in variants:
                counts[v] = counts.get(v, 0) + 1
        originals = set(texts)
        return [tuple(v for v in variants if v == text or (counts[v] == 1 and v not in originals))
                for text, variants in zip(texts, per)]

    def question_variants(self, q: Question, mode: str) -> list[tuple[str, ...]]:
        """Per candidate, the spellings read under a label readout ``mode``: those of its text
        (:func:`~noulengine.compile.render.candidate_texts`: a choice label, a score level's
        description or digit), minus any spelling that is also another candidate's."""
        return self.text_variants(candidate_texts(q, mode))

    def _first_token_in_context(self, text: str) -> int | None:
        ids = self.tok.encode_user(text)
        if not ids:
            return None
        joined = self.tok.encode_template(self.frame.tail_text + text)
        if tuple(joined[: len(self.frame.tail_ids) + 1]) != tuple(self.frame.tail_ids) + (ids[0],):
            return None
        return ids[0]

    def _first_tokens(self, q: Question) -> list[tuple[int, ...]] | None:
        """Per candidate, the distinct first tokens of its label-token spellings (of its
        :func:`~noulengine.compile.render.candidate_texts`); None if any two candidates share a
        first token or a text has no clean first token at the answer position."""
        out, seen = [], set()
        for variants in self.question_variants(q, "label-token"):
            toks = []
            for variant in variants:
                tid = self._first_token_in_context(variant)
                if tid is None:
                    return None
                toks.append(tid)
            toks = tuple(dict.fromkeys(toks))
            if seen & set(toks):
                return None
            seen |= set(toks)
            out.append(toks)
        return out

    def choose_mode(self, q: Question, rid=None) -> str:
        """The readout mode for one question under the configured ``readout``.

        Raises:
            RecordError: the requested mode cannot read this question (names field and rule).
        """
        want = self.config.readout
        path = f"questions.{q.field}"
        if want == "auto":
            if q.type == "noul":
                return "label-token"
            if q.type == "score" and not reads_level_texts(q, "label-token"):
                return "symbols"  # digits: levels without their own texts
            return "label-token" if self._first_tokens(q) is not None else "label-sequence"
        if want == "symbols":
            limit = len(DIGITS) if q.type == "score" else len(SYMBOLS)
            if q.num_candidates > limit and self.config.symbols_fallback:
                return "label-sequence"
            if q.num_candidates > limit:
                raise RecordError(f"readout 'symbols' has {limit} symbols for a {q.type} question; this one has "
                                  f"{q.num_candidates} candidates (use label-sequence)", record_id=rid, field=path)
        if want == "label-token" and q.type != "noul" and self._first_tokens(q) is None:
            what = "level texts" if reads_level_texts(q, want) else "labels"
            raise RecordError(f"readout 'label-token' needs {what} whose first tokens are distinct single tokens at "
                              "the answer position; these collide (use label-sequence or auto)", record_id=rid,
                              field=path)
        return want

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes any vocabulary entry spells (an upper bound on the text one token
        covers: byte-level and byte-fallback pieces spell at least as many bytes as they stand for)."""
        return max(1, max(len(t.encode("utf-8")) for t in self.tok.hf.get_vocab()))

    @property
    def max_text_bytes(self) -> int:
        """Text (bytes) above which a request cannot fit ``max_positions`` tokens, with a 4x
        margin for normalisers that shrink text before tokenizing."""
        return 4 * self.max_token_bytes * self.config.max_positions

    # -- compile ----------------------------------------------------------------------------
    def compile(self, request: Request) -> CompiledRequest:
        """Compile one request into a packed token tree.

        Raises:
            RecordError: a question cannot be read with the configured readout.
            OverlengthError: the request needs more positions or packed tokens than allowed.
        """
        rid = request.id
        where = f"record {rid!r}: " if rid is not None else ""
        state_text = render_state(request.state)
        # Refuse what cannot fit before tokenizing it: tokenizing tens of MB takes a minute and
        # would stall every other request sharing this engine (measured on the HTTP worker).
        limit = self.max_text_bytes
        text_bytes = len(state_text.encode("utf-8")) + sum(_question_text_bytes(q) for q in request.questions)
        if text_bytes > limit:
            raise OverlengthError(f"{where}the request holds {text_bytes} bytes of text; at most {self.max_token_bytes} "
                                  f"bytes per token and {self.config.max_positions} positions allow at most "
                                  f"{limit} bytes. Nothing is truncated: shorten the state.")
        b = SequenceBuilder()
        views = [(q, self.choose_mode(q, rid), self._rotations(q)) for q in request.questions]
        vision = None
        if request.images:
            if self.vision is None:
                raise UnsupportedModalityError(
                    f"{where}field 'images': this model is text-only and cannot read images "
                    f"({len(request.images)} given); use a vision-language model or remove the images")
            vision = self.vision.encode(request.images, record_id=rid)
        branch_texts = [self._question_text(q, mode, r) for q, mode, rotations in views for r in rotations]
        if self.config.layout == "schema-first":
            static_text = render_schema([q for q, _, _ in views], [mode for _, mode, _ in views])
            state_text = render_evidence(request.state)
        else:
            static_text = ""
        prefix_ids, branches = self._tokenize_tree(state_text, branch_texts,
                                                   vision.image_ids if vision is not None else None,
                                                   static_text=static_text)
        root = b.add(prefix_ids, -1)
        it = iter(branches)
        plans = [self._compile_question(b, root, q, mode, rotations, [next(it) for _ in rotations])
                 for q, mode, rotations in views]
        compiled = CompiledRequest(b.token_ids, b.position_ids, b.segment_ids, b.parents, plans, request_id=rid,
                                   vision=vision)
        if vision is None:
            # image placeholders are the same ids whatever the pixels: no token-keyed cache may hold them
            compiled.static_tokens = common_prefix_length(prefix_ids, self.static_prefix_ids(static_text),
                                                          len(prefix_ids))
        cfg = self.config
        if compiled.max_position > cfg.max_positions:
            raise OverlengthError(f"{where}the request needs {compiled.max_position} positions "
                                  f"(prefix {len(prefix_ids)} + its longest branch); the limit is {cfg.max_positions} "
                                  "tokens. Nothing is truncated: shorten the state.")
        if compiled.input_tokens > cfg.max_packed_tokens:
            raise OverlengthError(f"{where}the request packs {compiled.input_tokens} tokens; the limit is "
                                  f"{cfg.max_packed_tokens} tokens per request. Nothing is truncated.")
        return compiled

    # States that differ from the first character on, with different first characters, so the
    # tokens they share are the frame's own, whatever the tokenizer merges at the state boundary.
    _HEAD_PROBE_STATES = ({"a": 1}, "z", [0], 7, " x", "\n\n", "\u00e9")
    _HEAD_PROBE_FIELDS = ("probe", "zeta", "q", "x1", "Alpha", "_n", "\u00e9t")

    def static_prefix_ids(self, static_text: str) -> tuple[int, ...]:
        """The tokens every text request with this layout's static text starts with, whatever its
        state: the chat-template head, and in the schema-first layout the questions (``static_text``,
        from :func:`~noulengine.compile.render.render_schema`) and the fixed text before the state.

        Computed once per static text as the longest common token prefix of prompts on the
        probe states (first characters that differ), so a tokenizer merge across the
        schema/state boundary never puts a state-dependent token in it. A request's own
        :attr:`CompiledRequest.static_tokens` is its common prefix with these ids (what the
        engine's prefix store may prefill once and share across requests).
        """
        ids = self._static_cache.get(static_text)
        if ids is None:
            f = self.frame
            render = render_evidence if self.config.layout == "schema-first" else render_state
            chunks = [f.head_join + static_text + render(s) + "x" + f.tail_join for s in self._HEAD_PROBE_STATES]
            runs = [f.head_fixed_ids + r for r in self.tok.encode_user_batch(chunks)]
            n = min(len(r) for r in runs)
            for r in runs[1:]:
                n = common_prefix_length(runs[0], r, n)
            ids = tuple(runs[0][:n])
            if len(self._static_cache) > 1024:
                self._static_cache.clear()
            self._static_cache[static_text] = ids
        return ids

    def frame_head_ids(self) -> tuple[int, ...]:
        """The token prefix every compiled request starts with: the chat-template head and the
        fixed frame text before the state (what cross-request prefix caching prefills once).

        Computed as the longest common token prefix of requests on probe states with different
        first characters; a request whose own tokenization differs there simply does not reuse it
        (:mod:`noulengine.engine.prefix_store` compares token ids, never text).
        """
        if self._frame_head is None:
            # the field and instructions vary too: the schema-first layout writes them before the state
            runs = [self.compile(Request(state=s, questions=(Question(
                field=f, type="noul", instructions=f"{f.title()} it?", labels=("no", "yes"), descriptions=(None, None)),))
                                 ).token_ids for s, f in zip(self._HEAD_PROBE_STATES, self._HEAD_PROBE_FIELDS)]
            n = min(len(r) for r in runs)
            for r in runs[1:]:
                n = common_prefix_length(runs[0], r, n)
            self._frame_head = tuple(runs[0][:n])
        return self._frame_head

    def _rotations(self, q: Question) -> tuple[int, ...]:
        if self.config.debias != "permute" or q.type != "choice":
            return (0,)
        k = q.num_candidates
        if k <= MAX_PERMUTE_VIEWS:
            return tuple(range(k))
        return tuple(sorted({(i * k) // MAX_PERMUTE_VIEWS for i in range(MAX_PERMUTE_VIEWS)}))

    def _question_text(self, q: Question, mode: str, rotation: int) -> str:
        """A branch's text: the whole question (state-first) or its cue (schema-first)."""
        key = (json.dumps(q.spec(), sort_keys=True, ensure_ascii=False), mode, rotation)
        text = self._branch_cache.get(key)
        if text is None:
            k = q.num_candidates
            order = [(slot + rotation) % k for slot in range(k)]
            render = render_cue if self.config.layout == "schema-first" else render_question
            text = render(q, mode, order, SYMBOLS)
            if len(self._branch_cache) > 4096:
                self._branch_cache.clear()
            self._branch_cache[key] = text
        return text

    def _tokenize_tree(self, state_text: str, branch_texts: list[str],
                       image_ids: tuple[int, ...] | None = None, *,
                       static_text: str = "") -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
        """Token ids of the shared prefix and of each branch, taken from whole-prompt tokenizations.

        Each branch's prompt ``HEAD + static + state + branch + TAIL`` is tokenized whole
        (``static``: the schema-first layout's questions, empty in the state-first layout; special tokens
        of the template stay hard boundaries, see :mod:`noulengine.compile.template`); the prefix
        is the longest token prefix all of them share, and each branch keeps at least its last
        token (the answer is read there). So ``prefix + branch`` is exactly the tokenizer's ids of
        the concatenated text for every branch, whatever the tokenizer merges across the
        state/question boundary.

        ``image_ids`` (the processor's image block) follow HEAD (and the static text) and precede
        the state; the text before them is then its own piece, as the special tokens opening the
        image block make it in a processor's tokenization of the whole text.
        """
        f = self.frame
        if image_ids:
            lead = f.head_fixed_ids + self.tok.encode_user(f.head_join + static_text) + tuple(image_ids)
            chunks = [state_text + text + f.tail_join for text in branch_texts]
        else:
            lead = f.head_fixed_ids
            chunks = [f.head_join + static_text + state_text + text + f.tail_join for text in branch_texts]
        full = [lead + ids + f.tail_fixed_ids for ids in self.tok.encode_user_batch(chunks)]
        shared = min(len(ids) for ids in full) - 1
        first = full[0]
        for ids in full[1:]:
            shared = common_prefix_length(first, ids, shared)
        return first[:shared], [ids[shared:] for ids in full]

    def spec_key(self, q: Question, mode: str) -> str:
        """Content hash of a question under a readout (keys the contextual prior cache)."""
        payload = json.dumps({"q": q.spec(), "mode": mode, "v": self.prompt_version}, sort_keys=True,
                             ensure_ascii=False)
        return hashlib.sha256(payload.encode()).hexdigest()[:24]

    def _compile_question(self, b: SequenceBuilder, root: int, q: Question, mode: str, rotations: tuple[int, ...],
                          branch_ids: list[tuple[int, ...]]) -> QuestionPlan:
        plan = QuestionPlan(q.field, q.type, q.labels, mode, rotations, spec_key=self.spec_key(q, mode))
        k = q.num_candidates
        for view, r in enumerate(rotations):
            seg = b.add(branch_ids[view], root)
            read_at = b.last_position(seg)
            if mode == "symbols":
                symbols = NOUL_WORDS if q.type == "noul" else (DIGITS if q.type == "score" else SYMBOLS)
                ids = self.require_symbols(symbols[:k])
                for cand in range(k):
                    plan.add_alternative(view, cand, [(read_at, ids[(cand - r) % k])])
            elif mode == "label-token":
                if q.type == "noul":
                    for cand, words in enumerate((("no", "No"), ("yes", "Yes"))):
                        for tid in dict.fromkeys(self.require_symbols(words, readout=mode)):
                            plan.add_alternative(view, cand, [(read_at, tid)])
                else:
                    firsts = self._first_tokens(q)
                    for cand in range(k):
                        for tid in firsts[cand]:
                            plan.add_alternative(view, cand, [(read_at, tid)])
            else:  # label-sequence: label tokens + end token, each candidate a child branch
                for cand, variants in enumerate(self.question_variants(q, mode)):
                    for variant in variants:
                        seq = self._label_sequence(variant)
                        start = b.num_tokens
                        b.add(seq[:-1], seg)  # the last token is read, never fed
                        positions = [read_at] + list(range(start, start + len(seq) - 1))
                        plan.add_alternative(view, cand, list(zip(positions, seq)))
        return plan

    def _label_sequence(self, label: str) -> tuple[int, ...]:
        """The candidate's text (a label, or a score level's text) followed by the end-of-answer
        token (so a text that is a prefix of another is not credited with the other's
        probability), tokenized together with the answer cue it follows (the text after TAIL's
        last special token), as a whole ``prompt + answer`` text would be.

        Raises:
            TokenizerError: the label's first token merges with the answer cue, so no tokenization
                of the prompt ends where the answer starts.
        """
        ids = self._label_cache.get(label)
        if ids is not None:
            return ids
        f = self.frame
        cue = self.tok.encode_user(f.answer_join)
        # END is a special token after a chat turn (a hard boundary), ordinary text otherwise.
        joined = (self.tok.encode_user(f.answer_join + label) + f.end_ids if f.chat
                  else self.tok.encode_user(f.answer_join + label + f.end_text))
        if joined[:len(cue)] != cue or len(joined) <= len(cue):
            raise TokenizerError(f"tokenizer {self.tok.name}: the answer {label!r} merges with the answer cue "
                                 f"{f.answer_join!r} ({list(joined)} does not start with the cue's ids {list(cue)}); "
                                 "the label-sequence readout cannot read it")
        ids = joined[len(cue):]
        if len(self._label_cache) > 65536:
            self._label_cache.clear()
        self._label_cache[label] = ids
        return ids


def _question_text_bytes(q: Question) -> int:
    """UTF-8 bytes of a question's own text (instructions, labels, descriptions)."""
    parts = [q.instructions if isinstance(q.instructions, str) else canonical_json(q.instructions), *q.labels,
             *(d for d in q.descriptions if d is not None)]
    return sum(len(str(p).encode("utf-8")) for p in parts)
