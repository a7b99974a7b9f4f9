"""``noulengine lm-eval ARGS...``: lm-eval's own command line with the ``noulengine`` model registered.

Every lm-eval flag (``--tasks``, ``--include_path``, ``--limit``, ``--log_samples``,
``--output_path``, ...) behaves as lm-eval documents it; ``--model`` defaults to ``noulengine``
here (lm-eval's own default is ``hf``). A refusal (``generate_until``), a bad ``--model_args``
value or a model that cannot load ends the command with one line on stderr and exit status 2.
"""

from __future__ import annotations

import sys

INSTALL = "pip install 'noulengine[lm-eval]'"
PASS_THROUGH = ("ls", "validate")  # lm-eval subcommands that load no model


def with_default_model(argv: list[str]) -> list[str]:
    """``argv`` with ``--model noulengine`` added to an evaluation run that names no model (nor a
    ``--config`` file, which may name one); ``ls``, ``validate`` and help are left as they are."""
    if not argv or argv[0] in PASS_THROUGH or argv[0] in ("-h", "--help"):
        return argv
    named = any(a in ("--model", "-M", "--config", "-C") or a.startswith(("--model=", "--config=")) for a in argv)
    if named:
        return argv
    head = [argv[0]] if argv[0] == "run" else []
    return head + ["--model", "noulengine"] + argv[len(head):]


def main(argv: list[str] | None = None, prog: str = "noulengine lm-eval") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        from lm_eval._cli import HarnessCLI
        from lm_eval.utils import setup_logging
    except ImportError:
        print(f"error: lm-eval is not installed: {INSTALL}", file=sys.stderr)
        return 2
    from noulengine.lmeval import register

    register()
    argv = with_default_model(argv)
    runs = bool(argv) and argv[0] not in PASS_THROUGH and not any(a in ("-h", "--help") for a in argv)
    if runs:
        from noulengine.threads import cli_threads

        cli_threads()
    setup_logging()
    saved = sys.argv
    sys.argv = [prog, *argv]  # lm-eval's parser reads sys.argv itself (to insert `run`)
    try:
        parser = HarnessCLI()
        _name_as_typed(parser, prog)
        parser.execute(parser.parse_args())
    except Exception as exc:  # noqa: BLE001 - only noulengine's own refusals end in one line
        if not _one_line(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


def _name_as_typed(cli, prog: str) -> None:
    """Help and usage lines name the command as typed (``noulengine lm-eval run``), where lm-eval's
    parser exposes its argparse parsers (it names itself ``lm-eval`` otherwise)."""
    top = getattr(cli, "_parser", None)
    subs = getattr(getattr(cli, "_subparsers", None), "choices", {}) or {}
    for parser in [top, *subs.values()]:
        if parser is not None and isinstance(getattr(parser, "prog", None), str):
            parser.prog = parser.prog.replace("lm-eval", prog, 1)


def _one_line(exc: Exception) -> bool:
    """Whether ``exc`` is a refusal or a model/argument error of noulengine's (no traceback)."""
    from noulengine.records.errors import NoulEngineError

    if isinstance(exc, (NoulEngineError, FileNotFoundError)) and type(exc).__module__.startswith("noulengine"):
        return True
    from noulengine.lmeval.model import GenerationRefused, ModelArgsError
    from noulengine.lmeval.tree import LoglikelihoodRequestError

    return isinstance(exc, (GenerationRefused, ModelArgsError, LoglikelihoodRequestError))


if __name__ == "__main__":
    sys.exit(main())
