"""noulengine as an lm-evaluation-harness model: ``--model noulengine``.

:class:`NoulEngineLM` is a ``TemplateLM``: lm-eval's own code splits each request into context and
continuation tokens (``TemplateLM._encode_pair``: trailing spaces of the context move into the
continuation, the whole text is tokenised and split at the context's length; an empty context is
the prefix token). Tokenisation, the prefix token, ``max_length`` and left truncation are the
``hf`` backend's (``lm_eval.models.huggingface.HFLM``), through lm-eval's own helpers, so the same
weights give the same numbers. What differs is how they are computed: every distinct context runs
once with its continuations as branches of a token tree, several contexts per forward pass
(:mod:`noulengine.lmeval.loglikelihood`).

Model arguments (``--model_args key=value,...``):

* ``pretrained``: anything ``Engine.from_pretrained`` loads: omitted for the default decision model,
  a shipped decision model's name, ``base``, an embedded base's name (``SmolLM2-135M-Instruct``), a
  local model directory or a ``.gguf`` file. Nothing is downloaded.
* ``adapter``: ``NAME=PATH`` (or a folder / shipped name alone): a LoRA adapter served unmerged on
  the model; every request is scored with it.
* ``dtype``, ``device``: as ``noulengine decide --dtype/--device`` (``auto``: float32 on CPU,
  bfloat16 on CUDA); a CUDA device on a machine without one falls back to the CPU, as ``hf`` does.
* ``max_batch_size`` (contexts per pass), ``batch_tokens`` (padded tokens per pass).
* ``max_length``, ``add_bos_token``, ``prefix_token_id``: as the ``hf`` backend reads them.
* ``batch_size`` (lm-eval's ``--batch_size``) is accepted and not used: passes are planned by
  tokens. ``trust_remote_code`` is accepted and has no effect (no remote code is ever run).

Log-probabilities are computed in float32 over the full vocabulary whatever the model's dtype
(the ``hf`` backend computes ``log_softmax`` in the model's dtype unless given ``softmax_dtype``).
"""

from __future__ import annotations

import copy
import logging

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import DEFAULT_MAX_LENGTH, _add_special_kwargs, has_bos_prefix, resolve_max_length
from tqdm import tqdm

from noulengine.records.errors import NoulEngineError

log = logging.getLogger(__name__)

MODEL_NAME = "noulengine"
MODEL_ARGS = ("pretrained", "adapter", "dtype", "device", "max_batch_size", "batch_tokens", "max_length",
              "add_bos_token", "prefix_token_id", "batch_size", "trust_remote_code")


class ModelArgsError(ValueError):
    """A ``--model_args`` value noulengine cannot use; the message names the argument and the rule."""


class GenerationRefused(NoulEngineError, ValueError):
    """A request type noulengine does not serve (text generation); one line saying what to run instead."""


def _positive_int(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelArgsError(f"--model_args {name}: expected a positive integer, got {value!r}")
    return value


def _optional_bool(name: str, value) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise ModelArgsError(f"--model_args {name}: expected true or false, got {value!r}")


def parse_adapter(value) -> dict[str, str]:
    """``{name: path}`` from ``adapter=NAME=PATH`` (or ``adapter=PATH``: named after its folder).

    Raises:
        ModelArgsError: not a non-empty string, or an empty name or path.
    """
    if value is None:
        return {}
    if not isinstance(value, str) or not value.strip():
        raise ModelArgsError(f"--model_args adapter: expected NAME=PATH, got {value!r}")
    name, sep, path = value.partition("=")
    if not sep:
        from pathlib import Path

        name, path = Path(value.rstrip("/")).name, value
    if not name.strip() or not path.strip():
        raise ModelArgsError(f"--model_args adapter: expected NAME=PATH with both parts non-empty, got {value!r}")
    return {name.strip(): path.strip()}


def _dtype(value) -> str | None:
    """``value`` checked against the engine's dtype names (None for ``auto``)."""
    from noulengine.engine.config import DTYPE_CHOICES

    if value in (None, "auto"):
        return None
    if value not in DTYPE_CHOICES:
        raise ModelArgsError(f"--model_args dtype: expected auto or one of {', '.join(DTYPE_CHOICES)}, got {value!r}")
    return str(value)


def _adapter_settings(adapters: dict[str, str]) -> dict:
    """The readout and layout the adapter was trained with (its ``training.json``): the engine
    refuses an adapter read otherwise. lm-eval's scores do not depend on them."""
    from pathlib import Path

    from noulengine.models.loading import read_training, shipped_model_dir

    for path in adapters.values():
        folder = shipped_model_dir(path) or Path(path).expanduser()
        training = (read_training(folder) if folder.is_dir() else None) or {}
        return {k: training[k] for k in ("readout", "layout") if training.get(k)}
    return {}


def _device(value) -> str | None:
    """The device to load on: ``value``, or the CPU when it names CUDA and none is available
    (lm-eval's command line defaults ``--device`` to ``cuda:0``; its ``hf`` backend falls back too)."""
    if value is None:
        return None
    import torch

    if str(value).startswith("cuda") and not torch.cuda.is_available():
        log.info("device %r: CUDA is not available, using the CPU", value)
        return "cpu"
    return str(value)


@register_model(MODEL_NAME)
class NoulEngineLM(TemplateLM):
    """An lm-eval ``LM`` over a noulengine :class:`~noulengine.engine.engine.Engine`.

    ``loglikelihood`` and ``loglikelihood_rolling`` are scored with the engine's model;
    ``generate_until`` is refused (:class:`GenerationRefused`). See the module docstring for the
    model arguments.

    Raises:
        ModelArgsError: an unknown or malformed model argument.
        noulengine.models.loading.ModelNotFoundError, noulengine.engine.lora.AdapterError: the model
            or adapter cannot be loaded.
    """

    backend = "causal"

    def __init__(self, pretrained: str | None = None, adapter: str | None = None, dtype: str | None = None,
                 device: str | None = None, max_batch_size: int | None = None, batch_tokens: int | None = None,
                 max_length: int | None = None, add_bos_token: bool | None = None, prefix_token_id: int | None = None,
                 batch_size=None, trust_remote_code: bool | None = None, **unknown):
        super().__init__()
        if unknown:
            raise ModelArgsError(f"--model_args: unknown argument(s) {', '.join(sorted(unknown))} for --model "
                                 f"{MODEL_NAME} (accepted: {', '.join(MODEL_ARGS)})")
        from noulengine.engine.engine import Engine
        from noulengine.lmeval.loglikelihood import ScoringConfig

        adapters = parse_adapter(adapter)
        if pretrained is not None and not isinstance(pretrained, str):
            pretrained = str(pretrained)  # a folder name lm-eval parsed as a number
        kwargs = _adapter_settings(adapters)
        if _positive_int("max_batch_size", max_batch_size):
            kwargs["max_batch_size"] = max_batch_size
        if _positive_int("batch_tokens", batch_tokens):
            kwargs["batch_tokens"] = batch_tokens
        _positive_int("max_length", max_length)
        self.add_bos_token = _optional_bool("add_bos_token", add_bos_token)
        if prefix_token_id is not None and (isinstance(prefix_token_id, bool) or not isinstance(prefix_token_id, int)
                                            or prefix_token_id < 0):
            raise ModelArgsError(f"--model_args prefix_token_id: expected a token id (an integer >= 0), got "
                                 f"{prefix_token_id!r}")
        self.engine = Engine.from_pretrained(pretrained, device=_device(device), dtype=_dtype(dtype),
                                             adapters=adapters or None, calibration="none", **kwargs)
        self.adapter = next(iter(adapters), None)
        self.slot = self.engine.adapters.slot(self.adapter)
        tokenizer = self.engine.tokenizer
        if self.add_bos_token is not None:  # what hf's AutoTokenizer.from_pretrained(add_bos_token=...) gives
            tokenizer = copy.deepcopy(tokenizer)
            tokenizer.add_bos_token = self.add_bos_token
        self.tokenizer = tokenizer
        self.custom_prefix_token_id = prefix_token_id
        model_config = self.engine.runner.model.config
        self._max_length = max_length or resolve_max_length(model_config, tokenizer, default=DEFAULT_MAX_LENGTH)
        cfg = self.engine.config
        self.scoring = ScoringConfig(max_length=self._max_length, batch_tokens=cfg.batch_tokens,
                                     max_batch_size=cfg.max_batch_size,
                                     prefix_cache_min_tokens=cfg.prefix_cache_min_tokens
                                     if cfg.prefix_cache else 10**12, pad_id=self.engine.pad_id)
        self.batch_size = batch_size
        self._device = self.engine.runner.device

    # -- what lm-eval reads ---------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """The token an empty context becomes: ``prefix_token_id``, else BOS, else EOS (as ``hf``)."""
        if self.custom_prefix_token_id is not None:
            return self.custom_prefix_token_id
        if self.tokenizer.bos_token_id is not None:
            return self.tokenizer.bos_token_id
        return self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self):
        return self._device

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def get_model_info(self) -> dict:
        """What lm-eval records in its results' ``config``: the model's identity and settings."""
        identity = self.engine.identity
        runner = self.engine.runner
        return {"model_num_parameters": sum(p.numel() for p in runner.model.parameters()),
                "model_dtype": str(runner.dtype), "model_sha": identity.sha256 if identity else "",
                "noulengine": {"model": identity.to_dict() if identity else None, "adapter": self.adapter,
                               "device": str(runner.device), "max_length": self._max_length,
                               "batch_tokens": self.scoring.batch_tokens,
                               "max_batch_size": self.scoring.max_batch_size}}

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None,
                   **kwargs) -> list[int]:
        """Token ids of ``string``, exactly as the ``hf`` backend encodes it (a string that already
        starts with the prefix token's text gets no special tokens added)."""
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        ids = self.tokenizer.encode(string, **special)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens, skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The model's chat template over ``chat_history`` (``--apply_chat_template``), as ``hf`` applies it."""
        return self.tokenizer.apply_chat_template(chat_history, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt,
                                                  continue_final_message=not add_generation_prompt)

    # -- scoring ----------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(log-likelihood, is_greedy)`` per ``((context, continuation) or None, context ids,
        continuation ids)`` request, in order; each answer also goes to lm-eval's request cache."""
        from noulengine.lmeval.loglikelihood import score_requests

        bar = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="Running loglikelihood requests")
        routing = self.engine.adapters.routing if self.engine.adapters.slots else None
        try:
            answers = score_requests(self.engine.runner, [(ctx, cont) for _, ctx, cont in requests], self.scoring,
                                     slot=self.slot, routing=routing, progress=bar.update)
        finally:
            bar.close()
        for (key, _, _), answer in zip(requests, answers):
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, answer)
        return answers

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole texts (perplexity tasks), in the ``hf`` backend's windows: the
        text's tokens after the prefix token, cut into disjoint windows of ``max_length`` scored
        tokens, each with as much preceding context as fits; all windows of all texts are scored
        together (one branch each)."""
        windows, owner = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(i)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for i, (logp, _) in zip(owner, scores):
            totals[i] += logp
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Refused: noulengine scores given continuations and does not generate text."""
        tasks = sorted({getattr(r, "task_name", None) or "?" for r in requests})
        raise GenerationRefused(f"generate_until (task {', '.join(tasks)}): noulengine scores continuations and does "
                                "not generate text; run generative tasks with --model hf")
