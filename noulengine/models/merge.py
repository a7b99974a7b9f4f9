"""Merge LoRA adapters of one base into one adapter: ``noulengine merge``.

Averaging fine-tuned weights often keeps the skills of each source at no training cost (model
soups, Wortsman et al. 2022; task arithmetic, Ilharco et al. 2023; TIES, Yadav et al. 2023; DARE,
Yu et al. 2024). The combinations are PEFT's ``LoraModel.add_weighted_adapter``; this module picks
the sources, checks that they can be merged, and writes a model folder that loads like any
``noulengine train`` output (by path, with ``--adapter``, installed by the recipe).

Methods (``ΔW_i = s_i · B_i A_i``, ``s_i`` = alpha_i / r_i, the source's LoRA scale):

* ``linear``: exactly ``Σ w_i ΔW_i`` as one adapter of rank ``Σ r_i`` (PEFT's ``cat``: ``A`` the
  sources' ``A`` stacked, ``B`` their ``w_i s_i B_i`` side by side; alpha = rank, so scale 1).
  PEFT's own ``linear`` mixes ``A`` and ``B`` separately (``(Σ √w_i A_i)`` times ``(Σ √w_i B_i)``),
  which is not the weighted sum of the deltas and is not offered.
* ``ties``: TIES-merging (trim each ``w_i ΔW_i`` to its top ``density`` magnitudes, elect a sign
  per entry by total mass, average the agreeing entries) on the full deltas, then an SVD back to
  rank ``svd_rank`` (PEFT's ``ties_svd``). PEFT's ``ties`` would trim and elect on ``A`` and ``B``
  separately, which assumes the sources' low-rank bases are aligned (adapters trained apart are
  not), so it is not offered either.
* ``dare_ties``: DARE (drop entries of each delta at random with probability ``1 - density``,
  rescale the rest by ``1/density``) then the TIES sign election, on full deltas, then the SVD
  (PEFT's ``dare_ties_svd``; random: ``seed`` fixes it).
* ``svd``: ``Σ w_i ΔW_i`` truncated by SVD to rank ``svd_rank`` (PEFT's ``svd``).

Sources must share the base (by sha256), the readout, the prompt layout and version and the
tokenizer probe: an adapter learnt on another base or read another way means something else, and
the refusal names both sources. Each source's ``calibration.json`` is dropped: temperatures were
fitted on that source's logits, so the merged model is calibrated anew (``noulengine calibrate``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from noulengine.engine.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, AdapterError, read_adapter

METHODS = {"linear": "cat", "ties": "ties_svd", "dare_ties": "dare_ties_svd", "svd": "svd"}
# TIES keeps the top 20% of each task vector's entries by magnitude (Yadav et al. 2023, sec. 5.1,
# "k = 20"); DARE's density is the share kept, the same default here.
DEFAULT_DENSITY = 0.2
MERGE_FORMAT = "noulengine-merge"
# training.json fields that must agree between sources (what the compiler and readout use)
_MUST_AGREE = ("readout", "layout", "prompt_version", "loss")


class MergeError(AdapterError):
    """Sources that cannot be merged, or bad merge arguments: the message names the source and the rule."""


@dataclass
class MergeSource:
    """One adapter to merge: what the user named, its folder, its weight and its record.

    Attributes:
        spec: as given (a shipped model's name or a folder).
        folder: the adapter folder (a shipped name resolved to its installed folder).
        weight: its weight ``w_i`` (any real number; negative subtracts a delta, as task arithmetic does).
        training: its ``training.json`` (None for a plain PEFT folder).
        adapter_sha256: sha256 of its ``adapter_model.safetensors``.
        rank: its LoRA rank ``r`` (one rank over all its modules).
    """

    spec: str
    folder: Path
    weight: float
    training: dict | None = None
    adapter_sha256: str = ""
    rank: int = 0
    modules: list[str] = field(default_factory=list)


def parse_source(text: str) -> tuple[str, float]:
    """``"SOURCE:WEIGHT"`` -> ``(source, weight)``; a bare ``SOURCE`` has weight 1.

    The weight is after the last ``:``, so a folder may hold colons.

    Raises:
        MergeError: the weight is not a finite number.
    """
    spec, sep, weight = text.rpartition(":")
    if not sep:
        return text, 1.0
    try:
        w = float(weight)
    except ValueError:
        raise MergeError(f"merge: source {text!r}: the weight after ':' must be a number, got {weight!r}") from None
    if w != w or w in (float("inf"), float("-inf")):
        raise MergeError(f"merge: source {text!r}: the weight must be finite, got {weight!r}")
    if not spec:
        raise MergeError(f"merge: source {text!r}: give SOURCE:WEIGHT (a shipped model's name or a folder)")
    return spec, w


def resolve_sources(pairs: list[tuple[str, float]]) -> list[MergeSource]:
    """Read and check every source (``(spec, weight)`` pairs), in order.

    Raises:
        MergeError: no source, a source that is not a LoRA adapter folder (the reason from
            :func:`noulengine.engine.lora.read_adapter`), a shipped folder that fails its pin, a
            source with several ranks, or two sources on other bases, readouts, layouts, prompt
            versions or tokenizers (naming both).
    """
    from noulengine.models.loading import ModelNotFoundError, check_shipped_pin, sha256_file, shipped_model_dir

    if not pairs:
        raise MergeError("merge: give at least one SOURCE:WEIGHT")
    sources = []
    for spec, weight in pairs:
        folder = shipped_model_dir(spec) or Path(spec).expanduser()
        try:
            if folder.is_dir():
                check_shipped_pin(folder)
            adapter = read_adapter(spec, folder)
        except (AdapterError, ModelNotFoundError) as exc:
            raise MergeError(f"merge: source {spec!r}: {exc}") from None
        ranks = adapter.ranks
        if len(ranks) != 1:
            raise MergeError(f"merge: source {spec!r} ({folder}) has ranks {sorted(ranks)} across its modules; "
                             "only single-rank adapters are merged")
        sources.append(MergeSource(spec, folder, weight, adapter.training, sha256_file(folder / ADAPTER_WEIGHTS),
                                   next(iter(ranks)), sorted(adapter.modules)))
    first = sources[0]
    for other in sources[1:]:
        _check_pair(first, other)
    return sources


def _base_of(source: MergeSource) -> tuple[str | None, str | None]:
    """(sha256, name) of the base a source was trained on (PEFT's base path for a plain folder)."""
    base = (source.training or {}).get("base_model") or {}
    if base:
        return base.get("sha256"), base.get("spec") or base.get("name")
    config = json.loads((source.folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    return None, config.get("base_model_name_or_path")


def _check_pair(a: MergeSource, b: MergeSource) -> None:
    """Refuse two sources that do not adapt one model read one way (naming both and the field)."""
    (sha_a, name_a), (sha_b, name_b) = _base_of(a), _base_of(b)
    who = f"sources {a.spec!r} and {b.spec!r}"
    if (sha_a or sha_b) and sha_a != sha_b:
        raise MergeError(f"merge: {who} were trained on other bases ({name_a!r} sha256 {str(sha_a)[:12]}…, "
                         f"{name_b!r} sha256 {str(sha_b)[:12]}…); an adapter does not transfer between bases")
    if not (sha_a or sha_b) and name_a != name_b:
        raise MergeError(f"merge: {who} name other bases ({name_a!r}, {name_b!r})")
    ta, tb = a.training or {}, b.training or {}
    for key in _MUST_AGREE:
        if ta.get(key) != tb.get(key):
            raise MergeError(f"merge: {who} differ in {key} ({ta.get(key)!r}, {tb.get(key)!r}): an adapter is "
                             "served the way it was trained, so both must be read alike")
    pa, pb = ta.get("tokenizer_probe"), tb.get("tokenizer_probe")
    if pa and pb and pa.get("ids") != pb.get("ids"):
        raise MergeError(f"merge: {who} record other tokenizer probes (other tokenizers)")


def merge_adapters(pairs: list[tuple[str, float]], output: str | os.PathLike, *, method: str = "linear",
                   density: float | None = None, svd_rank: int | None = None, seed: int = 0,
                   name: str | None = None, overwrite: bool = False, base=None) -> Path:
    """Merge the adapters ``pairs`` (``[(source, weight), ...]``) into one model folder ``output``.

    Args:
        pairs: each source a shipped decision model's name or an adapter folder (``noulengine
            train`` output or PEFT LoRA folder), with its weight.
        output: the folder to write: ``adapter_config.json``, ``adapter_model.safetensors`` and
            ``training.json`` (the sources' record plus ``merge``: each source's spec, name,
            adapter sha256 and weight, the method, PEFT's combination, density, rank and seed). No
            ``calibration.json``: fit one with ``noulengine calibrate``.
        method: ``linear`` (exact ``Σ w_i ΔW_i``), ``ties``, ``dare_ties`` or ``svd`` (module docstring).
        density: share of each delta's entries kept by ``ties`` and ``dare_ties`` (0 < density ≤ 1;
            default :data:`DEFAULT_DENSITY`); refused for the others.
        svd_rank: rank of the ``ties``, ``dare_ties`` and ``svd`` results (default: the sum of the
            sources' ranks, so ``svd`` of ``linear`` weights loses nothing); refused for ``linear``.
        seed: seeds torch's RNG for DARE's random drop (recorded; the other methods are deterministic).
        name: the merged model's name in ``training.json`` (default: the output folder's name).
        overwrite: replace an existing ``output``; otherwise an existing non-empty folder is refused.
        base: a transformers causal LM to attach the sources to instead of loading the base they
            name (tests, or a base already in memory). PEFT wraps it in place: pass a copy to keep
            yours unchanged.

    Returns:
        ``output`` as a :class:`~pathlib.Path`.

    Raises:
        MergeError: bad sources (:func:`resolve_sources`), an unknown method, a density or rank
            that does not apply or is out of range, an existing output folder.
    """
    if method not in METHODS:
        raise MergeError(f"merge: method {method!r} is not one of {', '.join(METHODS)}")
    if density is not None and method not in ("ties", "dare_ties"):
        raise MergeError(f"merge: --density applies to ties and dare_ties, not {method}")
    if svd_rank is not None and method == "linear":
        raise MergeError("merge: --svd-rank applies to ties, dare_ties and svd; linear is exact at the summed rank")
    if method in ("ties", "dare_ties"):
        density = DEFAULT_DENSITY if density is None else density
        if not 0 < density <= 1:
            raise MergeError(f"merge: --density must be in (0, 1], got {density}")
    output = Path(output).expanduser()
    if output.exists() and any(output.iterdir()) and not overwrite:
        raise MergeError(f"merge: output {output} exists and is not empty (pass --overwrite to replace it)")
    sources = resolve_sources(pairs)
    out_resolved = output.resolve()
    for src in sources:
        folder = src.folder.resolve()
        if out_resolved == folder or out_resolved in folder.parents:
            raise MergeError(f"merge: output {output} is source {src.spec!r} or holds it ({folder}); writing there "
                             "would destroy the source: choose another --output")
    total_rank = sum(s.rank for s in sources)
    if method != "linear":
        svd_rank = total_rank if svd_rank is None else svd_rank
        if svd_rank < 1:
            raise MergeError(f"merge: --svd-rank must be at least 1, got {svd_rank}")
        if method == "svd" and svd_rank > total_rank:
            raise MergeError(f"merge: --svd-rank {svd_rank} is above the sources' summed rank {total_rank}: their "
                             f"weighted sum has rank at most {total_rank} (use --method linear for it exactly)")
    rank = total_rank if method == "linear" else svd_rank
    try:
        model = _merged_peft_model(sources, method, density, svd_rank, seed, base)
    except MergeError:
        raise
    except Exception as exc:  # PEFT's own checks of a source's config (a non-integer r, unknown modules, ...)
        names = ", ".join(repr(x.spec) for x in sources)
        raise MergeError(f"merge: PEFT could not load or combine the sources {names} ({type(exc).__name__}: "
                         f"{exc})") from None
    with tempfile.TemporaryDirectory(dir=output.parent if output.parent.is_dir() else None) as tmp:
        model.save_pretrained(tmp, selected_adapters=["merged"])
        saved = Path(tmp) / "merged"  # PEFT writes a non-default adapter into a folder of its name
        saved = saved if saved.is_dir() else Path(tmp)
        staging = Path(tmp) / "out"
        staging.mkdir()
        for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            shutil.copy2(saved / f, staging / f)
        _check_finite(staging / ADAPTER_WEIGHTS, sources)
        config = json.loads((staging / ADAPTER_CONFIG).read_text(encoding="utf-8"))
        config["base_model_name_or_path"] = _base_of(sources[0])[1]
        rank = int(config.get("r", rank))  # what PEFT wrote (an SVD rank is capped by the matrices' size)
        (staging / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        record = _training_record(sources, method, density, rank, seed, name or output.name, staging)
        (staging / "training.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        for f in staging.iterdir():
            os.chmod(f, 0o644)
        if output.exists():
            shutil.rmtree(output)
        output.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staging), str(output))
    return output


def _merged_peft_model(sources: list[MergeSource], method: str, density: float | None, svd_rank: int | None,
                       seed: int, base_model=None):
    """The base model with every source loaded as a PEFT adapter and ``merged`` added by
    ``add_weighted_adapter`` (the base's weights are needed only for PEFT's module tree)."""
    import torch
    from peft import PeftModel

    from noulengine.models.loading import load_model
    from noulengine.models.peft_compat import quiet_peft_checkpointing_warning

    if base_model is None:
        base_spec = _base_spec(sources[0])
        try:
            base_model = load_model(base_spec, dtype=torch.float32).model
        except Exception as exc:  # ModelNotFoundError and friends: name the source whose base it is
            raise MergeError(f"merge: the base {base_spec!r} of source {sources[0].spec!r} cannot be loaded "
                             f"({exc})") from None
    names = [f"source{i}" for i in range(len(sources))]
    with quiet_peft_checkpointing_warning():
        model = PeftModel.from_pretrained(base_model, str(sources[0].folder), adapter_name=names[0], is_trainable=False)
        for adapter_name, source in zip(names[1:], sources[1:]):
            model.load_adapter(str(source.folder), adapter_name=adapter_name, is_trainable=False)
    kwargs = {"combination_type": METHODS[method]}
    if density is not None:
        kwargs["density"] = density
    if svd_rank is not None:
        kwargs["svd_rank"] = svd_rank
    torch.manual_seed(seed)  # DARE's random drop
    with torch.no_grad():
        model.add_weighted_adapter(names, [s.weight for s in sources], adapter_name="merged", **kwargs)
    return model


def _check_finite(weights: Path, sources: list[MergeSource]) -> None:
    """Refuse merged factors with an inf or NaN (a weight too large for float32, say) before they
    are written where a model would load them.

    Raises:
        MergeError: naming the first such tensor and the sources' weights.
    """
    import torch
    from safetensors.torch import load_file

    for key, t in load_file(str(weights)).items():
        if not torch.isfinite(t).all():
            shown = ", ".join(f"{s.spec}:{s.weight:g}" for s in sources)
            raise MergeError(f"merge: the merged factor {key!r} holds non-finite values (weights {shown}: too large "
                             "for float32?); nothing was written")


def _base_spec(source: MergeSource) -> str:
    """What ``load_model`` takes for a source's base (``training.json``'s spec, else PEFT's path)."""
    base = (source.training or {}).get("base_model") or {}
    spec = base.get("spec") or base.get("name") or _base_of(source)[1]
    if not spec:
        raise MergeError(f"merge: source {source.spec!r} names no base model (no training.json, no "
                         "base_model_name_or_path)")
    return spec


def _training_record(sources: list[MergeSource], method: str, density: float | None, rank: int, seed: int,
                     name: str, folder: Path) -> dict:
    """The merged folder's ``training.json``: the first source's record (base, readout, layout,
    prompt version, tokenizer probe: checked equal across sources) with the merge recorded, and
    the per-run fields that describe one source's training (data, hyperparameters) removed."""
    from noulengine.models.loading import sha256_file

    first = dict(sources[0].training or {})
    record = {"format": "noulengine-training", "version": 1, "name": name}
    for key in ("base_model", "readout", "loss", "prompt_version", "layout", "tokenizer_probe"):
        if key in first:
            record[key] = first[key]
    record["method"] = "merge"
    record["merge"] = {
        "format": MERGE_FORMAT, "method": method, "peft_combination": METHODS[method], "density": density,
        "rank": rank, "seed": seed,
        "sources": [{"spec": s.spec, "name": (s.training or {}).get("name") or s.folder.name,
                     "adapter_sha256": s.adapter_sha256, "weight": s.weight, "rank": s.rank} for s in sources],
        "adapter_sha256": sha256_file(folder / ADAPTER_WEIGHTS),
        "peft_version": _peft_version(),
    }
    return record


def _peft_version() -> str:
    import peft

    return peft.__version__


def delta_weights(folder: str | os.PathLike) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """Every module's ``ΔW = scale · B A`` (float32 ``(out, in)``) of the adapter in ``folder``: the
    reference a merge is checked against (``tests/test_merge.py``)."""
    adapter = read_adapter("delta", folder)
    return {module: (b @ a) * s for module, (a, b, s) in adapter.modules.items()}


def build_parser(prog: str = "noulengine merge") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(
        "Merge LoRA adapters of one base into one adapter folder (PEFT's add_weighted_adapter). SOURCE is a "
        "shipped decision model's name (noul-smollm2-135m-v2) or an adapter folder (noulengine train output or a "
        "PEFT LoRA folder); WEIGHT defaults to 1. The output loads by path (--model DIR), as an adapter "
        "(--adapter NAME=DIR) and installs with the recipe; calibrate it anew with noulengine calibrate. Exit "
        "status: 0 written, 2 bad arguments or sources that cannot be merged (one line naming them)."))
    p.add_argument("sources", nargs="+", metavar="SOURCE:WEIGHT")
    p.add_argument("--method", default="linear", choices=list(METHODS), help="linear: exactly sum w_i * B_i A_i "
                   "(rank = the sum of ranks); ties / dare_ties: TIES or DARE+TIES on the full deltas, then SVD to "
                   "--svd-rank; svd: the weighted sum truncated to --svd-rank (default linear)")
    p.add_argument("--density", type=float, default=None, help=f"ties, dare_ties: share of each delta's entries "
                   f"kept (default {DEFAULT_DENSITY}, TIES' k = 20%%)")
    p.add_argument("--svd-rank", type=int, default=None, help="ties, dare_ties, svd: the merged rank (default: "
                   "the sum of the sources' ranks)")
    p.add_argument("--seed", type=int, default=0, help="RNG seed for dare_ties' random drop (default 0)")
    p.add_argument("--name", default=None, help="the merged model's name in training.json (default: the output "
                   "folder's name)")
    p.add_argument("--output", required=True, help="the model folder to write")
    p.add_argument("--overwrite", action="store_true", help="replace an existing output folder")
    return p


def main(argv: list[str] | None = None, prog: str = "noulengine merge") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        pairs = [parse_source(s) for s in args.sources]
        out = merge_adapters(pairs, args.output, method=args.method, density=args.density, svd_rank=args.svd_rank,
                             seed=args.seed, name=args.name, overwrite=args.overwrite)
    except MergeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = json.loads((out / "training.json").read_text(encoding="utf-8"))["merge"]
    parts = " + ".join(f"{s['weight']:g}·{s['spec']}" + (f" ({s['name']})" if s["name"] != s["spec"] else "")
                       for s in record["sources"])
    print(f"merged {parts} ({args.method}, rank {record['rank']}) into {out} (adapter sha256 "
          f"{record['adapter_sha256'][:12]}…); calibrate it: noulengine calibrate --model {out} ...")
    return 0


if __name__ == "__main__":
    sys.exit(main())
