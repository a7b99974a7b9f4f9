"""The model's prompt frame: chat-template pieces around user text, and the answer position.

A request's prompt for one question is the text::

    HEAD + render(state) + render(question) + TAIL      (HEAD: chat-template text before user
                                                         content; TAIL: end of user turn +
                                                         assistant header)

and the answer is read at its last token. The tokens are those of that whole text, never of
pieces tokenized apart: BPE merges across a piece boundary (``"\n\n" + "Question"`` is
``[198, 198, 17872]`` whole but ``[1116, 17872]`` in pieces on SmolLM2), so the compiler
tokenizes each question's whole prompt and shares the longest common token prefix
(:mod:`noulengine.compile.compiler`).

Only special tokens are hard boundaries: Hugging Face tokenizers split the text at added special
tokens before pre-tokenizing, so the ordinary text between two special tokens is tokenized as one
chunk. The frame therefore splits HEAD after its last special token and TAIL before its first
(``head_fixed_ids + encode(head_join + user text + tail_join) + tail_fixed_ids``).

User text is always tokenized with special tokens disabled, so it can never forge a template
delimiter; only HEAD, TAIL and END (template text) may contain special tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from noulengine.records.errors import TokenizerError

_SENTINEL = "\u2063NOULENGINE_CONTENT\u2063"
_PLAIN_TAIL = "\nAnswer:\n"


@dataclass(frozen=True)
class PromptFrame:
    """Template pieces as token ids.

    Attributes:
        head_ids: tokens before the user content (BOS / system prompt / user header).
        tail_ids: tokens after the user content, ending where the answer is read.
        end_ids: what follows a complete answer (turn end or newline); terminates label sequences.
        chat: whether the model's chat template is used.
        tail_text: TAIL as text (used to check symbols in the context where they are read).
        head_fixed_ids: HEAD's tokens up to and including its last special token.
        head_join: HEAD's text after its last special token (tokenized together with user text).
        tail_join: TAIL's text before its first special token (tokenized together with user text).
        tail_fixed_ids: TAIL's tokens from its first special token on.
        answer_join: TAIL's text after its last special token: what a label-sequence answer is
            tokenized together with (all of TAIL when it holds no special token).
        end_text: END as text.
    """

    head_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    chat: bool
    tail_text: str
    head_fixed_ids: tuple[int, ...] = ()
    head_join: str = ""
    tail_join: str = ""
    tail_fixed_ids: tuple[int, ...] = ()
    answer_join: str = ""
    end_text: str = ""


class TextTokenizer:
    """Wraps a Hugging Face tokenizer: user text never yields special tokens.

    ``encode_user`` splits special-token strings into ordinary pieces (``split_special_tokens``);
    ``encode_template`` parses them (template text is trusted). Neither adds BOS/EOS.
    """

    def __init__(self, tokenizer):
        self.hf = tokenizer
        self._user = lru_cache(maxsize=65536)(self._encode_user)

    def _encode_user(self, text: str) -> tuple[int, ...]:
        return tuple(self.hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def encode_user(self, text: str) -> tuple[int, ...]:
        """Token ids of untrusted text (special-token strings are split, never parsed)."""
        return self._user(text)

    def encode_user_batch(self, texts: list[str]) -> list[tuple[int, ...]]:
        """``encode_user`` of many texts in one call (the Rust tokenizer runs them in parallel);
        not cached: whole prompts are rarely repeated and would fill the cache with long keys."""
        if not texts:
            return []
        out = self.hf(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return [tuple(ids) for ids in out]

    def encode_template(self, text: str) -> tuple[int, ...]:
        """Token ids of trusted template text (special tokens parsed)."""
        return tuple(self.hf(text, add_special_tokens=False)["input_ids"])

    @property
    def name(self) -> str:
        """The tokenizer's name or path, for error messages."""
        return str(getattr(self.hf, "name_or_path", "") or type(self.hf).__name__)

    def special_spans(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character spans of the special-token strings in trusted ``text``."""
        specials = {str(t) for t in getattr(self.hf, "all_special_tokens", ())}
        for tok in getattr(self.hf, "added_tokens_decoder", {}).values():
            if getattr(tok, "special", False):
                specials.add(str(tok.content))
        specials.discard("")
        if not specials:
            return []
        pattern = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
        return [m.span() for m in pattern.finditer(text)]

    def decode(self, ids) -> str:
        return self.hf.decode(list(ids))


def build_frame(tok: TextTokenizer, *, use_chat_template: bool | None = None) -> PromptFrame:
    """Derive the frame from the tokenizer's chat template, or a plain frame without one.

    Args:
        use_chat_template: None uses the chat template when the tokenizer has one.
    """
    hf = tok.hf
    has_template = bool(getattr(hf, "chat_template", None))
    chat = has_template if use_chat_template is None else (use_chat_template and has_template)
    if chat:
        text = hf.apply_chat_template([{"role": "user", "content": _SENTINEL}], tokenize=False,
                                      add_generation_prompt=True)
        head, tail = text.split(_SENTINEL)
        full = hf.apply_chat_template([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}],
                                      tokenize=False)
        after = full.split(_SENTINEL, 1)[1]
        end_ids = tok.encode_template(after)[:1] or tok.encode_template("\n")
        end_text = tok.decode(end_ids)
        return _joined_frame(tok, head, tok.encode_template(head), tail, tuple(end_ids), end_text, chat=True)
    # Plain language model: the tokenizer's own leading special tokens (e.g. <bos>), no template.
    with_special = hf("x", add_special_tokens=True)["input_ids"]
    without = hf("x", add_special_tokens=False)["input_ids"]
    n_lead = len(with_special) - len(without)
    lead = tuple(with_special[:n_lead]) if n_lead > 0 and with_special[n_lead:n_lead + len(without)] == without else ()
    return _joined_frame(tok, "", lead, _PLAIN_TAIL, tok.encode_template("\n")[:1], "\n", chat=False)


def _joined_frame(tok: TextTokenizer, head: str, head_ids, tail: str, end_ids, end_text: str, *,
                  chat: bool) -> PromptFrame:
    """Split HEAD and TAIL at their outermost special tokens and check the split is exact.

    Raises:
        TokenizerError: tokenizing a template piece in two parts at a special token does not give
            its whole tokenization (a tokenizer that does not treat special tokens as boundaries).
    """
    head_spans = tok.special_spans(head)
    cut = head_spans[-1][1] if head_spans else 0
    head_fixed = tok.encode_template(head[:cut]) if head else tuple(head_ids)
    head_join = head[cut:]
    tail_spans = tok.special_spans(tail)
    first = tail_spans[0][0] if tail_spans else len(tail)
    tail_join, tail_fixed = tail[:first], tok.encode_template(tail[first:])
    answer_join = tail[tail_spans[-1][1]:] if tail_spans else tail
    if head and head_fixed + tok.encode_user(head_join) != tuple(head_ids):
        raise TokenizerError(f"tokenizer {tok.name}: the chat-template head {head!r} does not split at its last special "
                             "token; noulengine needs special tokens to be tokenization boundaries")
    tail_ids = tok.encode_template(tail)
    if tok.encode_user(tail_join) + tail_fixed != tail_ids:
        raise TokenizerError(f"tokenizer {tok.name}: the answer cue {tail!r} does not split at its first special "
                             "token; noulengine needs special tokens to be tokenization boundaries")
    return PromptFrame(tuple(head_ids), tail_ids, tuple(end_ids), chat, tail, head_fixed_ids=tuple(head_fixed),
                       head_join=head_join, tail_join=tail_join, tail_fixed_ids=tail_fixed, answer_join=answer_join,
                       end_text=end_text)
