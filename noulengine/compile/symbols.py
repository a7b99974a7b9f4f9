"""The 62 single-token answer symbols and their verification against a tokenizer.

Symbol-trained decision models answer a choice question with a symbol: labels map in criteria
order to A, B, ..., Z, a, ..., z, 0, ..., 9; score levels to "0", "1", ...; noul to no/yes.
"""

from __future__ import annotations

import string

from noulengine.records.errors import TokenizerError

SYMBOLS: tuple[str, ...] = tuple(string.ascii_uppercase + string.ascii_lowercase + string.digits)
DIGITS: tuple[str, ...] = tuple(string.digits)
NOUL_WORDS: tuple[str, ...] = ("no", "yes")
# The label-token readout also credits the capitalised words (small chat models answer "Yes").
NOUL_CASED: tuple[str, ...] = ("No", "Yes")


def single_token_in_context(tok, context_text: str, context_ids, text: str) -> int | None:
    """The token id of ``text`` read right after ``context_text``, if it is exactly one token.

    Checks both that ``text`` alone is one token and that tokenizing ``context + text`` together
    yields the context's own tokens followed by that same token (no merge across the boundary).
    """
    alone = tok.encode_user(text)
    if len(alone) != 1:
        return None
    joined = tok.encode_template(context_text + text)
    if tuple(joined) != tuple(context_ids) + tuple(alone):
        return None
    return alone[0]


def verify_symbols(tok, frame) -> dict[str, int]:
    """Map every symbol and noul word to its token id, as read at the answer position.

    Raises:
        TokenizerError: naming the first symbol that is not exactly one token in context, or two
            symbols that share a token.
    """
    ids: dict[str, int] = {}
    for sym in SYMBOLS + NOUL_WORDS:
        tid = single_token_in_context(tok, frame.tail_text, frame.tail_ids, sym)
        if tid is None:
            alone = list(tok.encode_user(sym))
            raise TokenizerError(f"symbol {sym!r} is not a single token after the answer cue {frame.tail_text!r} "
                                 f"(alone: ids {alone}); this tokenizer cannot use the symbols readout")
        ids[sym] = tid
    seen: dict[int, str] = {}
    for sym, tid in ids.items():
        if tid in seen:
            raise TokenizerError(f"symbols {seen[tid]!r} and {sym!r} share token id {tid}")
        seen[tid] = sym
    return ids
