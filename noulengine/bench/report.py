"""The bench's Markdown table (written beside the JSON result and printed)."""

from __future__ import annotations

from noulengine.bench.peer import PEER


def markdown(result: dict) -> str:
    lines = ["| workload | variant | decisions/s | requests/s | tokens/s | p50 s | p95 s | peak MB | "
             "% matmul peak | accuracy | vs naive | vs batched |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in result["workloads"]:
        for v, m in w["variants"].items():
            ratio_n = m["decisions_per_s"] / w["variants"]["naive"]["decisions_per_s"]
            ratio_b = m["decisions_per_s"] / w["variants"]["batched"]["decisions_per_s"]
            acc = "—" if m.get("accuracy") is None else f"{100 * m['accuracy']:.1f}%"
            lines.append(f"| {w['name']} | {v} | {m['decisions_per_s']:.2f} | {m['requests_per_s']:.3f} | "
                         f"{m['tokens_per_s']:.0f} | {m['latency_p50_s']:.2f} | {m['latency_p95_s']:.2f} | "
                         f"{m['peak_memory_bytes'] / 2**20:.0f} | {100 * m['share_of_matmul_peak']:.1f} | {acc} | "
                         f"{ratio_n:.2f}x | {ratio_b:.2f}x |")
    lines.append("")
    lines.append("| workload | max prob diff | engine padding share | engine vs engine_tree | prefix cache hit rate |")
    lines.append("|---|---|---|---|---|")
    for w in result["workloads"]:
        hit = w.get("prefix_cache_hit_rate")
        lines.append(f"| {w['name']} | {w['max_prob_diff']:.2e} | {w['padding_share']:.3f} | "
                     f"{w['ratio_vs_tree_path']:.2f}x | {'—' if hit is None else f'{100 * hit:.1f}%'} |")
    for w in result["workloads"]:
        if "ratio_vs_peer" in w:
            e, p = w["variants"]["engine"], w["variants"]["peer"]
            lines += ["", f"peer ({PEER} {w.get('peer_version')}, same weights, its own prompts) on {w['name']}: "
                          f"engine {w['ratio_vs_peer']:.2f}x the peer's decisions/s ({e['decisions_per_s']:.2f} vs "
                          f"{p['decisions_per_s']:.2f}); tokens per decision {e['tokens'] / w['decisions']:.0f} vs "
                          f"{p['tokens'] / w['decisions']:.0f}; tokens/s {e['tokens_per_s']:.0f} vs "
                          f"{p['tokens_per_s']:.0f}; accuracy {100 * e['accuracy']:.1f}% vs {100 * p['accuracy']:.1f}% "
                          f"(chance {100 * w['chance']:.1f}%, majority {100 * w['gold_majority']:.1f}%). "
                          "What each reads: the engine, each option by its own label (the readout the default "
                          "model was trained on); the peer, the letters A, B, ... before the options (its "
                          "training-free readout), which a model trained on label readouts was never taught: "
                          "the accuracy gap says which readout the weights suit, the speed ratio compares "
                          "the two executions on equal weights"]
    probed = [w for w in result["workloads"] if w.get("order_probe")]
    if probed:
        lines += ["", "| workload | choice answers | changed by reversal | share | accuracy in order | reversed |",
                  "|---|---|---|---|---|---|"]
        for w in probed:
            p = w["order_probe"]
            share = "—" if p["change_share"] is None else f"{p['change_share']:.3f}"
            acc = ["—" if p[k] is None else f"{100 * p[k]:.1f}%" for k in ("accuracy_in_order", "accuracy_reversed")]
            lines.append(f"| {w['name']} | {p['items']} | {p['changed']} | {share} | {acc[0]} | {acc[1]} |")
    if result.get("peer_skipped"):
        lines += ["", result["peer_skipped"]]
    c = result["cost_by_questions"]
    lines += ["", "| questions on one state (engine, one request) | seconds | tokens | time vs 1q | tokens vs 1q |",
              "|---|---|---|---|---|"]
    for n, m in c["counts"].items():
        lines.append(f"| {n} | {m['seconds']:.3f} | {m['tokens']} | {m['time_ratio']:.2f}x | {m['token_ratio']:.2f}x |")
    if c.get("marginal_seconds_per_question") is not None:
        lines.append(f"one more question beyond 16: {1000 * c['marginal_seconds_per_question']:.1f} ms")
    lines.append(f"matmul peak: {result['matmul_peak_flops'] / 1e9:.1f} GFLOP/s ({result['dtype']}, "
                 f"{result['device']}, {result['threads']} threads); non-embedding params: "
                 f"{result['non_embedding_params'] / 1e6:.1f}M; weights: {result['weights']}")
    return "\n".join(lines)

