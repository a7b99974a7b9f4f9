"""Command line: ``python -m noulengine.eval.suites {list,status,prepare,verify,refresh-manifest} [SUITE ...]``.

Without suite names, commands act on the accuracy-v1 default task list; ``--all`` means every
registered suite. ``--source DIR`` overrides the raw data root.
"""

from __future__ import annotations

import argparse
import json
import sys

from noulengine.eval.suites.errors import SuiteError
from noulengine.eval.suites.refresh import refresh_manifest
from noulengine.eval.suites.registry import expand_tasks, get_suite, list_suites


def main(argv: list[str] | None = None) -> int:
    """Run the suites CLI; returns the exit status (1 when any suite failed)."""
    ap = argparse.ArgumentParser(prog="python -m noulengine.eval.suites", description=__doc__)
    ap.add_argument("command", choices=["list", "status", "prepare", "verify", "refresh-manifest"])
    ap.add_argument("suites", nargs="*", help="suite or group names (default: the accuracy-v1 task list)")
    ap.add_argument("--all", action="store_true", help="every registered suite")
    ap.add_argument("--source", help="raw data root (default: $NOULENGINE_DATA, else <repo>/../shared/data)")
    ap.add_argument("--force", action="store_true", help="prepare: rebuild even if already prepared")
    args = ap.parse_args(argv)
    if args.command == "list":
        for name in list_suites():
            print(name)
        return 0
    try:
        names = list_suites() if args.all else expand_tasks(args.suites or None)
    except SuiteError as exc:
        print(exc, file=sys.stderr)
        return 2
    failed = 0
    for name in names:
        suite = get_suite(name)
        try:
            if args.command == "status":
                print(json.dumps(suite.available(args.source).to_dict()))
                continue
            if args.command == "prepare":
                path = suite.prepare(args.source, force=args.force)
            elif args.command == "verify":
                path = suite.verify()
            else:
                refresh_manifest(suite, args.source)
                path = suite.prepared_path
            print(f"{name}: ok {path}")
        except SuiteError as exc:
            failed += 1
            print(f"{name}: {exc}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
