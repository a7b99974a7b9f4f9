"""The ``noulengine`` command line: ``decide``, ``eval``, ``score``, ``compare``, ``calibrate``, ``serve``, ``bench``,
``train``, ``merge``, ``lm-eval``.

Engine flags are generated from :class:`noulengine.engine.engine.EngineConfig`, so the CLI, the
server and the Python API share one set of defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path


def _engine_config_cls():
    from noulengine.engine.config import EngineConfig  # no torch: --help stays fast

    return EngineConfig


def _engine_choices() -> dict[str, tuple[str, ...]]:
    """Valid values of the enumerated engine flags, checked by argparse before any model loads."""
    from noulengine.engine.config import DEBIAS_CHOICES, DTYPE_CHOICES, LAYOUT_CHOICES, READOUT_CHOICES

    return {"layout": ("auto",) + LAYOUT_CHOICES, "readout": ("auto",) + READOUT_CHOICES, "debias": DEBIAS_CHOICES, "dtype": ("auto",) + DTYPE_CHOICES,
            "attn_implementation": ("sdpa", "eager")}


def _tri_state(value: str) -> bool | None:
    table = {"true": True, "false": False, "auto": None}
    if value.lower() not in table:
        raise argparse.ArgumentTypeError(f"invalid value {value!r} (choose from true, false, auto)")
    return table[value.lower()]


def _bool_arg(value: str) -> bool:
    table = {"true": True, "false": False}
    if value.lower() not in table:
        raise argparse.ArgumentTypeError(f"invalid value {value!r} (choose from true, false)")
    return table[value.lower()]


def device_arg(value: str) -> str:
    """``cpu``, ``cuda``, ``cuda:N`` or ``mps``: checked when the flag is parsed, before any model loads.

    Raises:
        argparse.ArgumentTypeError: any other value, or a CUDA device on a machine without CUDA.
    """
    import torch

    try:
        dev = torch.device(value)
    except (RuntimeError, ValueError):
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda", "mps"):
        raise argparse.ArgumentTypeError(f"invalid device {value!r} (choose from cpu, cuda, cuda:N, mps)")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"device {value!r}: CUDA is not available on this machine (torch "
                                         f"{torch.__version__}); use cpu")
    return value


# Help text of the engine flags, written for a command line (the EngineConfig docstring is
# written for Python: None, ``markup``). A field missing here falls back to its docstring line.
ENGINE_FLAG_HELP = {
    "model": "the model: omitted = the embedded default decision model; a shipped decision model by name "
             "(noul-smollm2-135m-v2); base = the default's untrained base; an embedded "
             "base by name (SmolLM2-135M-Instruct, gemma-3-270m: installed from the package index); a local "
             "directory (a noulengine train output too) or a .gguf file",
    "device": "cpu, cuda, cuda:N or mps (default: CUDA when available, else CPU)",
    "dtype": "compute dtype; auto = bfloat16 on CUDA, float32 on CPU; int8 = dynamic int8 linear layers on CPU (head in float32)",
    "readout": "how candidates are read: symbols (A, B, ... and 0, 1, ...), label-token, label-sequence; auto = "
               "a trained model's own readout, else label-token where every label is one token, else label-sequence",
    "debias": "none; permute (average over rotations of the options); contextual (divide by a content-free prior)",
    "batch_tokens": "padded tokens per forward pass (rows x width)",
    "max_batch_size": "requests per forward pass at most",
    "max_positions": "context window in tokens (default: the model's max_position_embeddings)",
    "calibration": "a calibration JSON (temperatures); default: the one a trained model ships with when fitted "
                   "for the same readout and debias; 'none' applies no temperature",
    "use_chat_template": "wrap prompts in the model's chat template; auto = when the model has one",
    "symbols_fallback": "with --readout symbols, read questions with more options than symbols by label-sequence; "
                        "auto = only for a trained model read with its own readout",
    "attn_implementation": "attention kernel",
    "layout": "prompt layout: state-first (state, then each question) or schema-first (the questions first, then "
              "the state: requests asking the same questions share that prefix in the prefix cache); auto = the "
              "layout a trained model was trained with, else state-first",
}


def _plain_help(text: str) -> str:
    """A docstring line as help text: no reST markup (``x`` -> x)."""
    return text.replace("``", "")


def field_help(doc: str, name: str) -> str:
    """The ``name: ...`` entry of a dataclass docstring's Attributes, continuation lines joined,
    as plain help text ("" when absent)."""
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(name + ":"):
            indent = len(line) - len(line.lstrip())
            parts = [stripped[len(name) + 1:].strip()]
            for more in lines[i + 1:]:
                if not more.strip() or len(more) - len(more.lstrip()) <= indent:
                    break
                parts.append(more.strip())
            return _plain_help(" ".join(parts))
    return ""


def add_engine_args(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = ()) -> None:
    """Add one ``--flag`` per :class:`EngineConfig` field (``batch_tokens`` -> ``--batch-tokens``).

    Enumerated fields get argparse ``choices`` (a typo such as ``--debias permutte`` exits 2 with the
    valid values before anything loads); ``--device`` is checked by :func:`device_arg`.
    """
    cls = _engine_config_cls()
    doc = cls.__doc__ or ""
    choices = _engine_choices()
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default
        kind = {int: int, "int": int, "int | None": int}.get(f.type, None)
        help_line = ENGINE_FLAG_HELP.get(f.name) or field_help(doc, f.name)
        is_bool = f.type in ("bool | None", bool | None, "bool", bool)
        if default is not None and f.name not in choices and not is_bool:
            help_line += f" (default {default})"
        if f.type in ("bool | None", bool | None):
            parser.add_argument(flag, type=_tri_state, default=default, metavar="{true,false,auto}",
                                help=f"{help_line} (default auto)" if default is None else help_line)
        elif f.type in ("bool", bool):  # a plain bool: true or false ("false" must never read as a truthy string)
            parser.add_argument(flag, type=_bool_arg, default=default, metavar="{true,false}",
                                help=f"{help_line} (default {str(default).lower()})")
        elif f.name in choices:
            shown = default if default is not None else "auto"
            parser.add_argument(flag, choices=choices[f.name], default=default,
                                help=f"{help_line} (default {shown})")
        elif f.name == "device":
            parser.add_argument(flag, type=device_arg, default=default, help=help_line)
        else:
            parser.add_argument(flag, type=kind or str, default=default, help=help_line)


def _engine_kwargs(args: argparse.Namespace) -> tuple[str | None, dict]:
    """``(model, other EngineConfig fields)`` from parsed engine flags (for a local engine or Ray actors)."""
    kwargs = {f.name: getattr(args, f.name) for f in dataclasses.fields(_engine_config_cls()) if hasattr(args, f.name)}
    return kwargs.pop("model", None), kwargs


def engine_from_args(args: argparse.Namespace, *, adapters: dict[str, str] | None = None,
                     unmerged: bool | None = None):
    """Build an :class:`~noulengine.Engine` from parsed engine flags, with ``--adapter`` folders
    (``adapters``, from :func:`adapter_specs`) served unmerged beside it.

    A trained ``--model`` (the default included) is loaded unmerged when adapters are named or
    ``unmerged`` is set, so they join its base (:meth:`Engine.from_pretrained`). A ``--model`` that
    names nothing loadable, or an adapter that cannot join it (checked before the model loads where
    its folder tells), ends the command with exit status 2 and a one-line error (no traceback).
    """
    from noulengine.engine.engine import Engine
    from noulengine.engine.lora import AdapterError
    from noulengine.models.loading import ModelNotFoundError

    model, kwargs = _engine_kwargs(args)
    try:
        return Engine.from_pretrained(model, adapters=adapters or None, unmerged=unmerged, **kwargs)
    except ModelNotFoundError as exc:
        print(f"error: --model: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except AdapterError as exc:
        print(f"error: --adapter: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def add_adapter_arg(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--adapter NAME=PATH`` (repeatable): LoRA adapters served unmerged on the model (docs/adapters.md);
    PATH is a folder or a shipped decision model's name."""
    parser.add_argument("--adapter", action="append", metavar="NAME=PATH", default=None, help=help_text)


def adapter_specs(values: list[str] | None) -> dict[str, str]:
    """``["NAME=PATH", ...]`` -> ``{name: path}``.

    Raises:
        SystemExit(2): a value without ``=``, an empty side, or a name given twice (one line).
    """
    out: dict[str, str] = {}
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            print(f"error: --adapter {value!r}: give NAME=PATH (a folder written by noulengine train or a PEFT LoRA "
                  "folder)", file=sys.stderr)
            raise SystemExit(2)
        if name in out:
            print(f"error: --adapter {name!r} is given twice", file=sys.stderr)
            raise SystemExit(2)
        out[name] = path
    return out


def add_ray_args(parser: argparse.ArgumentParser) -> None:
    """The Ray Data flags shared by ``eval`` and ``decide`` (docs/evaluation.md#ray-data)."""
    g = parser.add_argument_group("Ray Data (the ray extra: pip install -e '.[ray]')")
    g.add_argument("--ray", action="store_true", help="run inference on Ray Data actors (one engine per actor)")
    g.add_argument("--ray-address", metavar="ADDR", help="an existing Ray cluster (auto, ray://host:10001); default: "
                   "start a local one")
    g.add_argument("--actors", type=int, default=1, metavar="N", help="engine actors, each with one model copy "
                   "(default 1)")
    g.add_argument("--gpus-per-actor", type=float, default=0, metavar="G", help="GPUs per actor (default 0)")
    g.add_argument("--cpus-per-actor", type=float, default=1, metavar="C", help="CPUs per actor; on CPU also its "
                   "torch threads (default 1)")
    g.add_argument("--ray-batch-size", type=int, default=16, metavar="B", help="requests per actor call; the engine "
                   "packs them into forward passes (default 16)")


def ray_config_from_args(args: argparse.Namespace):
    """A :class:`~noulengine.distributed.RayConfig` from the Ray and engine flags (exit 2 on a bad
    value or a missing ``ray`` extra, before anything starts)."""
    from noulengine.distributed.ray_data import RayConfig, _require_ray

    from noulengine.models.loading import is_base_name, shipped_model_dir

    for name in ("actors", "ray_batch_size"):
        if getattr(args, name) < 1:
            print(f"error: --{name.replace('_', '-')} must be at least 1", file=sys.stderr)
            raise SystemExit(2)
    if not args.cpus_per_actor > 0 or args.gpus_per_actor < 0:
        print("error: --cpus-per-actor must be > 0 and --gpus-per-actor >= 0", file=sys.stderr)
        raise SystemExit(2)
    model = getattr(args, "model", None)
    if (model is not None and not is_base_name(model) and shipped_model_dir(model) is None
            and not Path(model).expanduser().exists()):
        # checked here: a model the actors cannot load would surface as an actor traceback after start-up
        print(f"error: --model: {model!r} not found (a local directory, a .gguf file, a shipped "
              "decision model's or a base model's name)",
              file=sys.stderr)
        raise SystemExit(2)
    try:
        _require_ray()
    except ImportError as exc:
        print(f"error: --ray: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    model, kwargs = _engine_kwargs(args)
    return RayConfig(address=args.ray_address, actors=args.actors, num_cpus=args.cpus_per_actor,
                     num_gpus=args.gpus_per_actor, batch_size=args.ray_batch_size, model=model, engine_kwargs=kwargs)


def _read_json_arg(value: str):
    """A JSON value given inline or as a path to a JSON file."""
    from noulengine.records.loader import _no_duplicate_keys, _reject_constant

    strict = {"parse_constant": _reject_constant, "object_pairs_hook": _no_duplicate_keys}  # as JSONL lines
    path = Path(value)
    looks_inline = value.lstrip().startswith(("{", "[", '"'))
    if not looks_inline and path.is_file():
        return json.loads(path.read_text(encoding="utf-8"), **strict)
    try:
        return json.loads(value, **strict)
    except ValueError as exc:
        if looks_inline:
            raise
        raise ValueError(f"{exc} (and there is no file named {value!r})") from None


def cmd_decide(args: argparse.Namespace) -> int:
    """Answer one request (``--state`` + ``--questions``) or a JSONL file (``--input``)."""
    from tqdm import tqdm

    from noulengine.records.errors import RecordError
    from noulengine.records.loader import duplicate_id_error, iter_jsonl_lines, parse_json_line

    if args.input and (args.questions or args.state is not None):
        print("error: give either --input FILE or --state/--questions, not both", file=sys.stderr)
        return 2
    if not args.input and not args.questions:
        print("error: --questions is missing (the questions object: inline JSON or a JSON file)"
              if args.state is not None else "error: give either --input FILE or --state/--questions", file=sys.stderr)
        return 2
    if args.images and args.input:
        print("error: --images goes with --state/--questions; records in --input name their own images", file=sys.stderr)
        return 2
    if args.chunk < 1:
        print(f"error: --chunk must be at least 1, got {args.chunk}", file=sys.stderr)
        return 2
    # Read and check the input before the model loads: a typo costs no load time and no traceback.
    if args.questions:
        try:
            state = _read_json_arg(args.state) if args.state is not None else ""
        except (OSError, ValueError) as exc:
            print(f"error: --state is not valid JSON (inline or a file): {exc}", file=sys.stderr)
            return 2
        try:
            questions = _read_json_arg(args.questions)
        except (OSError, ValueError) as exc:
            print(f"error: --questions is not valid JSON (inline or a file): {exc}", file=sys.stderr)
            return 2
    else:
        try:
            lines = list(iter_jsonl_lines(args.input))
        except OSError as exc:
            print(f"error: cannot read --input {args.input}: {exc}", file=sys.stderr)
            return 2
    if args.output:
        out_path = Path(args.output)
        if args.input and out_path.resolve() == Path(args.input).resolve():
            print("error: --output is the --input file; it would be overwritten", file=sys.stderr)
            return 2
        if not out_path.parent.is_dir():
            print(f"error: cannot write --output {args.output}: folder {out_path.parent} does not exist", file=sys.stderr)
            return 2
    from noulengine.escalate.args import config_from_args

    try:
        escalate = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if escalate is not None and getattr(args, "ray", False):
        print("error: --escalate-url runs with the local engine, not --ray", file=sys.stderr)
        return 2
    from noulengine import envs

    if args.input and not args.media_root and envs.media_root() is None:
        args.media_root = str(Path(args.input).resolve().parent)  # relative image paths: beside the input file
    ray_config = ray_config_from_args(args) if getattr(args, "ray", False) else None
    if ray_config is not None and args.questions:
        print("error: --ray takes --input FILE (a single request runs locally)", file=sys.stderr)
        return 2
    if ray_config is None:
        from noulengine.threads import cli_threads

        cli_threads()  # NOULENGINE_THREADS, else the usable physical cores
    if ray_config is not None:
        from noulengine.distributed.ray_data import decide_requests

        decide = lambda items: decide_requests(items, ray_config)  # noqa: E731
        chunk_size = max(1, len(lines))  # one Ray Dataset: the actors load the model once
    else:
        engine = engine_from_args(args, adapters=adapter_specs(args.adapter))
        decide = lambda items: [d.to_dict() for d in engine.decide_batch(items, progress=None,  # noqa: E731
                                                                         escalate=escalate)]
        chunk_size = args.chunk
    if args.questions:
        request = {"state": state, "questions": questions}
        if args.use_adapter:
            request["adapter"] = args.use_adapter
        if args.images:
            request["images"] = list(args.images)  # local paths (relative: --media-root, MEDIA_ROOT or here)
        decision = engine.decide_batch([request], escalate=escalate)[0]
        print(json.dumps(decision.to_dict(), ensure_ascii=False, indent=2, allow_nan=False))
        return 0 if decision.ok else 1
    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    n_err = n_ok = 0
    error_rows: list[str] = []  # "line N (id X): message", named on stderr at the end
    first_line_of_id: dict = {}  # a repeated id would make the output rows ambiguous to join on
    bar = tqdm(total=len(lines), unit="req", file=sys.stderr, disable=args.no_progress)
    try:
        for start in range(0, len(lines), chunk_size):
            chunk = lines[start:start + chunk_size]
            items, rows = [], []
            for n, text in chunk:
                if isinstance(text, RecordError):  # not UTF-8
                    rows.append((n, text.to_dict()))
                    continue
                try:
                    item = parse_json_line(text, file=args.input, line=n)
                except RecordError as exc:
                    rows.append((n, exc.to_dict()))
                    continue
                rid = item.get("id") if isinstance(item, dict) else None
                if isinstance(rid, (str, int)) and not isinstance(rid, bool):
                    dup = duplicate_id_error(first_line_of_id, rid, file=args.input, line=n)
                    if dup is not None:
                        rows.append((n, dup.to_dict()))
                        continue
                items.append(item)
                rows.append((n, None))
            decisions = iter(decide(items))
            for n, err in rows:
                row = {"line": n, "id": err.get("record_id"), "answers": {}, "usage": {"input_tokens": 0},
                       "latency_s": 0.0, "error": err} if err else {"line": n, **next(decisions)}
                if row["error"]:
                    n_err += 1
                    if row["error"].get("line") is None:
                        row["error"]["line"] = n
                    if row["error"].get("file") is None:
                        row["error"]["file"] = str(args.input)
                    error_rows.append(_error_row_line(n, row))
                else:
                    n_ok += 1
                out.write(json.dumps(row, ensure_ascii=False, allow_nan=False) + "\n")  # never NaN/Infinity
            out.flush()
            bar.update(len(chunk))
    finally:
        bar.close()
        if out is not sys.stdout:
            out.close()
    print(f"{n_ok} answered, {n_err} error rows", file=sys.stderr)
    for text in error_rows[:MAX_ERROR_ROWS_SHOWN]:
        print(f"  {text}", file=sys.stderr)
    if len(error_rows) > MAX_ERROR_ROWS_SHOWN:
        print(f"  ... and {len(error_rows) - MAX_ERROR_ROWS_SHOWN} more (every error row is in the output)",
              file=sys.stderr)
    return 0 if n_err == 0 else 1


MAX_ERROR_ROWS_SHOWN = 20


def _error_row_line(line: int, row: dict) -> str:
    """``line 3 (id 'r1'): RecordError: message`` for the stderr list of error rows."""
    err = row["error"]
    rid = row.get("id") if row.get("id") is not None else err.get("record_id")
    message = " ".join(str(err.get("message") or err.get("rule") or "").split())
    if len(message) > 160:
        message = message[:157] + "..."
    who = f"id {rid!r}" if rid is not None else "no id"
    return f"line {line} ({who}): {err.get('error_type') or 'error'}: {message}"


def _delegate(module: str, name: str):
    def run(args: argparse.Namespace, rest: list[str]) -> int:
        import importlib
        import inspect

        main = importlib.import_module(module).main
        if "prog" in inspect.signature(main).parameters:  # help and messages name the command as typed
            return main(rest, prog=f"noulengine {name}")
        return main(rest)

    return run


SUBCOMMANDS = {  # verbs whose parsers live with their modules
    "eval": ("noulengine.eval.__main__", "evaluate a model on benchmark suites"),
    "score": ("noulengine.eval.score", "score predictions from any system against a suite"),
    "compare": ("noulengine.eval.compare", "compare runs on the same records, with paired bootstrap intervals"),
    "calibrate": ("noulengine.calibrate.__main__", "fit temperatures on a validation file"),
    "serve": ("noulengine.serve.__main__", "run the HTTP service"),
    "bench": ("noulengine.bench.cli", "measure speed against naive baselines"),
    "train": ("noulengine.train.__main__", "fine-tune a model into a decision model"),
    "merge": ("noulengine.models.merge", "merge LoRA adapters of one base into one (linear, ties, dare_ties, svd)"),
    "lm-eval": ("noulengine.lmeval.cli", "run lm-evaluation-harness with --model noulengine (multiple-choice tasks)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in SUBCOMMANDS:
        return _delegate(SUBCOMMANDS[argv[0]][0], argv[0])(None, argv[1:])
    parser = argparse.ArgumentParser(prog="noulengine", description="Decision probabilities from a language model.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("decide", help="answer requests", description=(
        "Answer one request (--state and --questions) or a JSONL file of requests (--input), every question "
        "with probabilities over its candidates. Exit status: 0 all answered, 1 when any row is an error row "
        "(all rows are still written, in input order), 2 for bad arguments."))
    p.add_argument("--state", help="the state: inline JSON or a JSON file (with --questions)")
    p.add_argument("--questions", help="the questions object: inline JSON or a JSON file")
    p.add_argument("--images", nargs="+", metavar="PATH", help="image files for the --state/--questions request, "
                   "in order (a vision-language model reads them)")
    p.add_argument("--input", help="a JSONL file of requests/records")
    p.add_argument("--output", help="where to write answers (JSONL; default stdout)")
    p.add_argument("--chunk", type=int, default=256, help="requests handed to the engine at a time")
    add_adapter_arg(p, "a LoRA adapter served unmerged beside the model, repeatable; a request picks it with "
                       "\"adapter\": NAME (docs/adapters.md)")
    p.add_argument("--use-adapter", metavar="NAME", help="with --state/--questions: answer with this --adapter")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    add_engine_args(p)
    add_ray_args(p)
    from noulengine.escalate.args import add_escalation_args

    add_escalation_args(p)
    p.set_defaults(func=cmd_decide)
    for name, (_module, help_text) in SUBCOMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
