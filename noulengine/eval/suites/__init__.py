"""Benchmark suites: deterministic preparation from shared raw data, hash-pinned manifests,
verification before inference, and loading as ``(row_index, Record)`` pairs.

Typical use::

    from noulengine.eval.suites import get_suite, default_tasks, sample_rows

    for name in default_tasks():              # accuracy-v1 task list
        suite = get_suite(name)
        status = suite.available()            # report "unavailable" suites, never score them 0
        if not status:
            print(status.reason); continue
        suite.prepare()                       # builds benchmarks/accuracy-v1/<dir>/prepared/ if missing
        rows = suite.load()                   # verifies sha256 first; [(row_index, Record), ...]
        rows = sample_rows(rows, 200, seed=0)
"""

from noulengine.eval.suites.errors import (HashMismatchError, PreparedFileChangedError, SourceFileChangedError,
                                           SuiteError, SuiteUnavailableError, UnknownSuiteError)
from noulengine.eval.suites.hashing import sha256_file
from noulengine.eval.suites.jevbench import canonical_from_jevbench, parse_jevbench
from noulengine.eval.suites.paths import benchmarks_root, resolve_data_dir
from noulengine.eval.suites.registry import (collection_manifest, default_tasks, expand_tasks, get_suite,
                                             list_suites, register_suite, resolve_suites)
from noulengine.eval.suites.sampling import limit_rows, sample_rows, select_rows
from noulengine.eval.suites.suite import Suite, SuiteStatus

__all__ = ["HashMismatchError", "PreparedFileChangedError", "SourceFileChangedError", "Suite", "SuiteError",
           "SuiteStatus", "SuiteUnavailableError", "UnknownSuiteError", "benchmarks_root", "canonical_from_jevbench",
           "collection_manifest", "default_tasks", "expand_tasks", "get_suite", "limit_rows", "list_suites",
           "parse_jevbench", "register_suite", "resolve_data_dir", "resolve_suites", "sample_rows", "select_rows",
           "sha256_file"]
