"""A pinned tokenizer probe: a fixed text and the token ids a model's tokenizer must give for it.

A model is more than its weights: a tokenizer that splits "yes" into two tokens, or merges the
prompt differently, reads a different protocol than the one the model was trained on, and no
weight hash notices. A trained model records the probe's ids in ``training.json``
(``tokenizer_probe``) and the embedded default base pins them beside its sha256; loading refuses a
tokenizer that does not reproduce them.
"""

from __future__ import annotations

from noulengine.records.errors import TokenizerError

# Covers what the protocol depends on: the prompt frame's words and blank lines, the noul words in
# both cases, letter and digit symbols, JSON punctuation, and non-ASCII text.
PROBE_TEXT = ("Read the evidence, then answer the question about it.\n\nEvidence:\n{\"ticket\":\"Où est mon colis? 😀\","
              "\"n\":42}\n\nQuestion: Is it?\nyes: the statement holds\nno: it does not hold\nAnswer yes or no.\n"
              "yes no Yes No A B C Z a b z 0 1 9\nOptions:\nA. world: World news.\nAnswer with the option's symbol only.")


def probe_ids(tokenizer) -> list[int]:
    """Token ids of :data:`PROBE_TEXT` (no special tokens added or parsed)."""
    hf = getattr(tokenizer, "hf", tokenizer)
    return list(hf(PROBE_TEXT, add_special_tokens=False, split_special_tokens=True)["input_ids"])


def probe_record(tokenizer) -> dict:
    """The ``tokenizer_probe`` entry a trained model's ``training.json`` stores."""
    return {"text": PROBE_TEXT, "ids": probe_ids(tokenizer)}


def check_probe(tokenizer, expected: list[int], *, text: str = PROBE_TEXT, where: str = "") -> None:
    """Refuse a tokenizer whose ids for the probe differ from the pinned ones.

    Args:
        tokenizer: a Hugging Face tokenizer (or :class:`~noulengine.compile.template.TextTokenizer`).
        expected: the pinned ids.
        text: the pinned probe text (a model records the text it was pinned with).
        where: what the pin belongs to (named in the error).

    Raises:
        TokenizerError: naming the tokenizer, the first differing position and the ids there.
    """
    hf = getattr(tokenizer, "hf", tokenizer)
    got = list(hf(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
    if got == list(expected):
        return
    at = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
    name = getattr(hf, "name_or_path", "") or type(hf).__name__
    def show(ids):
        window = ids[at:at + 4]
        return f"{window} {[hf.convert_ids_to_tokens(int(i)) for i in window]}"
    raise TokenizerError(
        f"tokenizer {name} does not reproduce the tokenizer probe pinned {where or 'for this model'}: "
        f"{len(got)} ids instead of {len(expected)}, first difference at position {at}: expected "
        f"{show(list(expected))}, got {show(got)}. The model was trained with another tokenizer; "
        "reinstall the model or retrain on this tokenizer")
