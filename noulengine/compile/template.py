"""The model's prompt frame: chat-template pieces around user text, and the answer position.

A request is laid out as one shared prefix and one branch per question::

    prefix  = HEAD + render(state)                 (HEAD: chat-template text before user content)
    branch  = render(question) + TAIL              (TAIL: end of user turn + assistant header)
    answer  = read at the last token of the branch

User text is always tokenized with special tokens disabled, so it can never forge a template
delimiter; only HEAD, TAIL and END (template text) may contain special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

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
    """

    head_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]
    end_ids: tuple[int, ...]
    chat: bool
    tail_text: str


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

    def encode_template(self, text: str) -> tuple[int, ...]:
        """Token ids of trusted template text (special tokens parsed)."""
        return tuple(self.hf(text, add_special_tokens=False)["input_ids"])

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
        return PromptFrame(tok.encode_template(head), tok.encode_template(tail), tuple(end_ids), True, tail)
    # Plain language model: the tokenizer's own leading special tokens (e.g. <bos>), no template.
    with_special = hf("x", add_special_tokens=True)["input_ids"]
    without = hf("x", add_special_tokens=False)["input_ids"]
    n_lead = len(with_special) - len(without)
    lead = tuple(with_special[:n_lead]) if n_lead > 0 and with_special[n_lead:n_lead + len(without)] == without else ()
    return PromptFrame(lead, tok.encode_template(_PLAIN_TAIL), tok.encode_template("\n")[:1], False, _PLAIN_TAIL)
