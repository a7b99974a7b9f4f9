"""Experiment behind docs/performance.md#lm-evaluation-harness-model-noulengine-against-model-hf-issue-55 ("lm-evaluation-harness: --model noulengine against --model hf"); reproduce: `NOULENGINE_THREADS=2 python experiments/bench_lm_eval.py`.

lm-evaluation-harness throughput: ``--model noulengine`` against ``--model hf``, same tasks and weights.

Three local multiple-choice workloads built from AG News test articles (``../shared/data/agnews``;
``NOULENGINE_DATA`` overrides the data folder), written as lm-eval task YAMLs into a temporary folder:

* ``a_labels``: ``Article: ...\\nTopic:`` (~66 tokens) and four multi-token label choices (2-3 tokens);
* ``b_long``: eight articles (~500 tokens) and four short two-token choices about the last one;
* ``c_letters``: the article, the four topics as letters, and one-token letter choices (where the
  ``hf`` backend already runs each context once, through its one-token logits cache).

Both models load once (load time is not counted); then, for every repetition, each workload runs
through ``lm_eval.simple_evaluate`` with each backend, interleaved (the order alternates between
repetitions), timed end to end as a user sees it. Reported: median requests/s per backend, the
speed-up, acc and acc_norm of both (they must be identical) and the largest |Δ loglikelihood|.
Writes JSON (with the configuration, the git revision and torch's threads) and a Markdown table.

    NOULENGINE_THREADS=2 .venv/bin/python experiments/bench_lm_eval.py                  # the documented table
    NOULENGINE_THREADS=1 .venv/bin/python experiments/bench_lm_eval.py --rows 2 --long-rows 1 --reps 1  # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOPICS = ("world", "sports", "business", "sci_tech")
WORKLOADS = {
    "a_labels": {
        "what": "four multi-token choices after a ~60-token context",
        "doc_to_text": "Article: {{text}}\\nTopic:",
        "choices": ["world politics", "sports news", "business and finance", "science and technology"],
        "delimiter": " ",
    },
    "b_long": {
        "what": "a ~500-token context (8 articles) with short two-token choices",
        "doc_to_text": "{{text}}\\n\\nTopic of the last article:",
        "choices": ["world news", "sports news", "business news", "tech news"],
        "delimiter": " ",
    },
    "c_letters": {
        "what": "one-token letter choices",
        "doc_to_text": "Article: {{text}}\\nTopics: A) World B) Sports C) Business D) Science and technology\\nAnswer:",
        "choices": ["A", "B", "C", "D"],
        "delimiter": "",
    },
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="experiments/bench_lm_eval.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct",
                   help="a base model noulengine loads by name, folder or .gguf (hf gets its converted folder)")
    p.add_argument("--rows", type=int, default=60, help="documents of workloads a and c (AG News articles)")
    p.add_argument("--long-rows", type=int, default=20, help="documents of workload b (8 articles each)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions (median reported)")
    p.add_argument("--hf-batch-size", type=int, default=8, help="--batch_size of the hf backend")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help="comma-separated subset of " + ", ".join(WORKLOADS))
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0, help="article shuffle seed")
    p.add_argument("--output", default=str(REPO / "bench-results" / "lm_eval.json"),
                   help="JSON result path; a .md table is written beside it")
    args = p.parse_args(argv)
    unknown = sorted(set(args.workloads.split(",")) - set(WORKLOADS))
    if unknown:
        p.error(f"--workloads: unknown {', '.join(unknown)} (expected some of {', '.join(WORKLOADS)})")
    for name in ("rows", "long_rows", "reps", "hf_batch_size"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    return args


def build_tasks(folder: Path, rows: int, long_rows: int, seed: int, workloads: list[str]) -> dict[str, int]:
    """Write each workload's data (JSONL) and task YAML into ``folder``; returns documents per task."""
    data = Path(os.environ.get("NOULENGINE_DATA") or REPO.parent / "shared" / "data") / "agnews" / "test.jsonl"
    records = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    random.Random(seed).shuffle(records)
    arts = [{"text": r["state"]["text"], "label": TOPICS.index(r["targets"]["decision"]["label"])} for r in records]
    need = rows + 8 * long_rows
    if len(arts) < need:
        raise SystemExit(f"error: {data} has {len(arts)} articles, {need} are needed")
    docs = {"a_labels": arts[:rows], "c_letters": arts[:rows], "b_long": [
        {"text": "\n\n".join(f"Article {j + 1}: {a['text']}" for j, a in enumerate(group)), "label": group[-1]["label"]}
        for group in (arts[rows + 8 * k: rows + 8 * (k + 1)] for k in range(long_rows))]}
    counts = {}
    for name in workloads:
        spec = WORKLOADS[name]
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps(d) + "\n" for d in docs[name]), encoding="utf-8")
        (folder / f"{name}.yaml").write_text(
            f"task: bench_{name}\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {json.dumps(str(path))}\n"
            f"test_split: test\noutput_type: multiple_choice\ndoc_to_text: \"{spec['doc_to_text']}\"\n"
            f"doc_to_target: label\ndoc_to_choice: {json.dumps(spec['choices'])}\n"
            f"target_delimiter: {json.dumps(spec['delimiter'])}\nmetric_list:\n"
            "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
            "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\nmetadata:\n  version: 1\n",
            encoding="utf-8")
        counts[name] = len(docs[name])
    return counts


def run_once(lm, task: str, task_manager, device: str) -> tuple[float, dict, dict]:
    """One timed ``simple_evaluate``: ``(seconds, metrics, {(doc, k): loglikelihood})``."""
    import lm_eval
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = lm_eval.simple_evaluate(model=lm, tasks=[task], task_manager=task_manager, log_samples=True,
                                  verbosity="ERROR")
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    metrics = {k.split(",")[0]: v for k, v in out["results"][task].items() if k.split(",")[0] in ("acc", "acc_norm")}
    values = {(s["doc_id"], k): r[0][0] for s in out["samples"][task] for k, r in enumerate(s["resps"])}
    return seconds, metrics, values


def git_revision() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.path.insert(0, str(REPO))
    from noulengine.threads import cli_threads

    threads = cli_threads()
    import torch
    import transformers
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    import lm_eval
    import noulengine.lmeval  # noqa: F401 - registers --model noulengine
    from noulengine.lmeval.model import NoulEngineLM
    from noulengine.models.loading import resolve_model

    workloads = args.workloads.split(",")
    directory, identity = resolve_model(args.model)
    with tempfile.TemporaryDirectory(prefix="bench-lm-eval-") as tmp:
        counts = build_tasks(Path(tmp), args.rows, args.long_rows, args.seed, workloads)
        task_manager = TaskManager(include_path=tmp, include_defaults=False)
        t0 = time.perf_counter()
        backends = {"hf": HFLM(pretrained=str(directory), dtype="float32", device=args.device,
                               batch_size=args.hf_batch_size),
                    "noulengine": NoulEngineLM(pretrained=args.model, dtype="float32", device=args.device)}
        print(f"loaded both models in {time.perf_counter() - t0:.1f} s; {threads['threads']} torch threads",
              file=sys.stderr)
        for name, lm in backends.items():  # warm-up: lazy imports, dataset preparation, first-call costs
            lm_eval.simple_evaluate(model=lm, tasks=[f"bench_{workloads[0]}"], task_manager=task_manager, limit=1,
                                    verbosity="ERROR")
        runs: dict = {w: {b: [] for b in backends} for w in workloads}
        metrics: dict = {w: {} for w in workloads}
        values: dict = {w: {} for w in workloads}
        for rep in range(args.reps):
            for w in workloads:
                order = list(backends) if rep % 2 == 0 else list(reversed(backends))
                for name in order:
                    seconds, m, v = run_once(backends[name], f"bench_{w}", task_manager, args.device)
                    runs[w][name].append(seconds)
                    metrics[w][name], values[w][name] = m, v
                    print(f"rep {rep + 1}/{args.reps} {w} {name}: {len(v)} requests in {seconds:.2f} s",
                          file=sys.stderr)
    rows = []
    for w in workloads:
        n = len(values[w]["hf"])
        rate = {b: n / statistics.median(runs[w][b]) for b in backends}
        delta = max(abs(values[w]["hf"][k] - values[w]["noulengine"][k]) for k in values[w]["hf"])
        rows.append({"workload": w, "what": WORKLOADS[w]["what"], "documents": counts[w], "requests": n,
                     "hf_requests_per_s": rate["hf"], "noulengine_requests_per_s": rate["noulengine"],
                     "speedup": rate["noulengine"] / rate["hf"], "hf_seconds": runs[w]["hf"],
                     "noulengine_seconds": runs[w]["noulengine"], "acc_hf": metrics[w]["hf"],
                     "acc_noulengine": metrics[w]["noulengine"],
                     "acc_identical": metrics[w]["hf"] == metrics[w]["noulengine"],
                     "max_abs_delta_loglikelihood": delta})
    result = {"config": {"model": identity.to_dict(), "hf_pretrained": str(directory), "device": args.device,
                         "dtype": "float32", "hf_batch_size": args.hf_batch_size, "reps": args.reps, "rows": args.rows,
                         "long_rows": args.long_rows, "seed": args.seed, "threads": threads,
                         "git_revision": git_revision(), "torch": torch.__version__,
                         "transformers": transformers.__version__, "lm_eval": lm_eval.__version__},
              "rows": rows}
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = markdown(result)
    out.with_suffix(".md").write_text(table, encoding="utf-8")
    print(table)
    return 0 if all(r["acc_identical"] for r in rows) else 1


def markdown(result: dict) -> str:
    cfg = result["config"]
    lines = [f"{cfg['model']['name']}, {cfg['device']}, float32, {cfg['threads']['threads']} torch threads, hf "
             f"--batch_size {cfg['hf_batch_size']}, median of {cfg['reps']}, lm-eval {cfg['lm_eval']}, git "
             f"{(cfg['git_revision'] or '?')[:7]}", "",
             "| workload | requests | hf requests/s | noulengine requests/s | speed-up | acc / acc_norm (both) "
             "| max abs Δ loglik |",
             "|---|---:|---:|---:|---:|---|---:|"]
    for r in result["rows"]:
        acc = r["acc_noulengine"]
        same = "identical" if r["acc_identical"] else f"DIFFER (hf {r['acc_hf']})"
        lines.append(f"| ({r['workload'][0]}) {r['what']} | {r['requests']} | {r['hf_requests_per_s']:.2f} | "
                     f"{r['noulengine_requests_per_s']:.2f} | {r['speedup']:.2f}x | "
                     f"{acc.get('acc', float('nan')):.3f} / {acc.get('acc_norm', float('nan')):.3f} ({same}) | "
                     f"{r['max_abs_delta_loglikelihood']:.1e} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
