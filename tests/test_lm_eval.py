"""``--model noulengine`` in lm-evaluation-harness against lm-eval's own ``hf`` backend (issue #55).

The reference is lm-eval's ``HFLM`` on the same weights: every loglikelihood request's value within
1e-4 in float32, ``is_greedy`` identical, acc and acc_norm identical, on the local tasks in
``tests/fixtures/lm_eval`` (one-token choices, multi-token choices of different lengths, a long
shared context, a context ending in a space with choices that begin without one, left truncation,
perplexity windows). Tiny seeded models (Llama, Qwen2, Gemma 3 with a sliding window and a logit
soft-cap) run in CI; the real SmolLM2-135M base and a shipped decision model are marked
``default_model`` and ``slow``. The tree scoring's three routes (causal, dense tree mask, prefix KV
cache) are also checked against a plain transformers forward pass of each ``context + continuation``.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("lm_eval")

from tests.conftest import REPO  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "lm_eval"
MC_TASKS = ["noul_agnews_letters", "noul_agnews_labels", "noul_agnews_spaced", "noul_agnews_long"]
TOL = 1e-4


@pytest.fixture(autouse=True)
def _offline_from_repo_root(monkeypatch):
    monkeypatch.chdir(REPO)  # the task YAMLs name their data files relative to the repository root
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def task_manager():
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(FIXTURES), include_defaults=False)  # indexing lm-eval's own tasks takes ~10 s


def _saved(model, tokenizer, tmp_path_factory, name):
    d = tmp_path_factory.mktemp(name)
    model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture(scope="module")
def tiny_dirs(tiny_llama_dir, tiny_qwen2, tiny_gemma3, tiny_tokenizer, tmp_path_factory):
    return {"llama": tiny_llama_dir, "qwen2": _saved(tiny_qwen2, tiny_tokenizer, tmp_path_factory, "tiny-qwen2"),
            "gemma3": _saved(tiny_gemma3, tiny_tokenizer, tmp_path_factory, "tiny-gemma3")}


def hf_lm(directory, **extra):
    from lm_eval.models.huggingface import HFLM

    return HFLM(pretrained=str(directory), dtype="float32", device="cpu", batch_size=4, **extra)


def noul_lm(pretrained, **extra):
    from noulengine.lmeval.model import NoulEngineLM

    return NoulEngineLM(pretrained=str(pretrained), dtype="float32", device="cpu", **extra)


def evaluate(lm, tasks, task_manager, limit=None) -> dict:
    import lm_eval

    return lm_eval.simple_evaluate(model=lm, tasks=list(tasks), task_manager=task_manager, log_samples=True,
                                   limit=limit, verbosity="WARNING")


def responses(result: dict) -> dict:
    """(task, doc_id, request index) -> the request's raw response: (loglikelihood, is_greedy) or a float."""
    out = {}
    for task, samples in result["samples"].items():
        for s in samples:
            for k, resp in enumerate(s["resps"]):
                out[(task, s["doc_id"], k)] = resp[0]
    return out


def assert_same_as_hf(ref: dict, got: dict, *, rel: float = 0.0) -> float:
    """Every request within ``TOL`` (+ ``rel`` x |value|), is_greedy identical, every metric identical;
    returns the largest |Δ loglikelihood|."""
    a, b = responses(ref), responses(got)
    assert a.keys() == b.keys() and a
    worst = 0.0
    for key in a:
        ra, rb = a[key], b[key]
        va, vb = (ra[0], rb[0]) if isinstance(ra, (list, tuple)) else (ra, rb)
        assert math.isfinite(vb), key
        assert abs(va - vb) <= TOL + rel * abs(va), (key, va, vb)
        worst = max(worst, abs(va - vb))
        if isinstance(ra, (list, tuple)):
            assert bool(ra[1]) == bool(rb[1]), (key, ra, rb)
    for task, metrics in ref["results"].items():
        for name, value in metrics.items():
            if name.split(",")[0] in ("acc", "acc_norm", "word_perplexity", "byte_perplexity", "bits_per_byte"):
                other = got["results"][task][name]
                assert other == pytest.approx(value, rel=1e-6 if "perplexity" in name or "bits" in name else 0), \
                    (task, name)
    return worst


def check_cases(lm, result: dict) -> None:
    """The fixture tasks test what they claim, in this tokenizer: one-token letter continuations,
    multi-token label continuations of different lengths, a context that ends in a space, a long context."""
    for task, samples in result["samples"].items():
        pairs = [lm._encode_pair(*args) for s in samples for args in s["arguments"]]
        cont_lens = {len(cont) for _, cont in pairs}
        if task == "noul_agnews_letters":
            assert cont_lens == {1}
        elif task == "noul_agnews_labels":
            assert len(cont_lens) >= 2 and max(cont_lens) >= 2
        elif task == "noul_agnews_spaced":
            args = [a for s in samples for a in s["arguments"]]
            assert all(ctx.endswith(" ") and not cont.startswith(" ") for ctx, cont in args)
        elif task == "noul_agnews_long":
            assert min(len(ctx) for ctx, _ in pairs) >= 400


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_multiple_choice_equals_hf_backend_on_tiny_models(family, tiny_dirs, task_manager):
    directory = tiny_dirs[family]
    ref = evaluate(hf_lm(directory), MC_TASKS, task_manager)
    lm = noul_lm(directory)
    got = evaluate(lm, MC_TASKS, task_manager)
    check_cases(lm, got)
    assert assert_same_as_hf(ref, got) <= TOL


def test_left_truncation_equals_hf_backend(tiny_llama_dir, task_manager):
    # max_length 48: every long context and most article contexts lose tokens from the left, and a
    # longer continuation loses more (its requests no longer share the context)
    tasks = ["noul_agnews_labels", "noul_agnews_long"]
    ref = evaluate(hf_lm(tiny_llama_dir, max_length=48), tasks, task_manager, limit=6)
    got = evaluate(noul_lm(tiny_llama_dir, max_length=48), tasks, task_manager, limit=6)
    assert assert_same_as_hf(ref, got) <= TOL


def test_rolling_loglikelihood_equals_hf_backend(tiny_llama_dir, task_manager):
    # windows of 64 tokens: every article spans several; totals are sums of hundreds of float32 terms
    ref = evaluate(hf_lm(tiny_llama_dir, max_length=64), ["noul_text_rolling"], task_manager, limit=6)
    got = evaluate(noul_lm(tiny_llama_dir, max_length=64), ["noul_text_rolling"], task_manager, limit=6)
    assert_same_as_hf(ref, got, rel=1e-6)


def test_greedy_continuations_are_greedy_in_both(tiny_llama_dir, tiny_llama, tiny_tokenizer):
    """Continuations decoded greedily by the model itself: is_greedy True in both backends (and a
    changed last token False in both), with an empty context (the prefix token) among them."""
    from lm_eval.api.instance import Instance

    hf, noul = hf_lm(tiny_llama_dir), noul_lm(tiny_llama_dir)
    contexts = ["Read the evidence, then answer", "Question: is it risk", "the world of sports and"]
    args = []
    for ctx in contexts:
        ids = torch.tensor([tiny_tokenizer.encode(ctx)])
        out = tiny_llama.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
        cont = tiny_tokenizer.decode(out[0, ids.shape[1]:])
        args += [(ctx, cont), (ctx, cont[:-1] + ("x" if cont[-1:] != "x" else "y"))]
    args.append(("", "Read the evidence"))
    reqs = [Instance(request_type="loglikelihood", doc={}, arguments=a, idx=i) for i, a in enumerate(args)]
    want, got = hf.loglikelihood(reqs, disable_tqdm=True), noul.loglikelihood(reqs, disable_tqdm=True)
    assert [g for _, g in got] == [g for _, g in want]
    assert any(g for _, g in got) and not all(g for _, g in got)
    for (va, _), (vb, _) in zip(want, got):
        assert abs(va - vb) <= TOL


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma3"])
def test_every_route_equals_a_plain_forward_pass(family, tiny_dirs):
    """score_requests on the causal, tree-mask and prefix-cache routes against log_softmax of a
    plain transformers forward of each context + continuation (independent of lm-eval)."""
    from transformers import AutoModelForCausalLM

    from noulengine.engine.model_runner import ModelRunner
    from noulengine.lmeval.loglikelihood import ScoringConfig, route, score_requests
    from noulengine.lmeval.tree import build_trees

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dirs[family]), dtype=torch.float32).eval()
    runner = ModelRunner(model)
    g = torch.Generator().manual_seed(1)
    ctx = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 37, 60)]
    conts = [[7], [9], [7, 11, 12], [7, 11, 13, 14], [20, 21], [22]]
    pairs = [(c, k) for c in ctx for k in conts] + [(ctx[0][:3], [5, 6])]  # + a context with one continuation
    want = []
    with torch.inference_mode():
        for c, k in pairs:
            logits = model(torch.tensor([c + k])).logits[0, len(c) - 1:-1].float()
            lp = torch.log_softmax(logits, -1)
            want.append((float(lp[torch.arange(len(k)), torch.tensor(k)].sum()),
                         bool((logits.argmax(-1) == torch.tensor(k)).all())))
    cached = None if family == "gemma3" else 0  # sliding-window layers keep the tree path (no prefix cache)
    for min_tokens in (10**9, cached):
        if min_tokens is None:
            continue
        cfg = ScoringConfig(max_length=2048, prefix_cache_min_tokens=min_tokens, batch_tokens=160)
        kinds = {route(t, family != "gemma3", cfg) for t in build_trees(pairs, max_length=2048)}
        assert kinds == ({"causal", "tree"} if min_tokens else {"causal", "cached"})
        got = score_requests(runner, pairs, cfg)
        for (va, ga), (vb, gb) in zip(want, got):
            assert abs(va - vb) <= 1e-4 and ga == gb


def test_readout_is_log_softmax_and_first_argmax_whatever_the_chunks():
    from noulengine.engine.model_runner import HeadInfo
    from noulengine.lmeval.readout import token_logprobs

    g = torch.Generator().manual_seed(0)
    h, w, bias = torch.randn(5, 8, generator=g), torch.randn(50, 8, generator=g), torch.randn(50, generator=g)
    w[7], w[31], bias[31] = 5.0, 5.0, bias[7]  # the same largest logit at 7 and 31 (other chunks): argmax is 7
    h[0] = 1.0
    read = torch.tensor([0, 0, 1, 2, 3, 4, 4])
    tok = torch.tensor([7, 31, 3, 49, 0, 16, 17])
    for cap in (None, 5.0):
        logits = h @ w.T + bias
        logits = torch.tanh(logits / cap) * cap if cap else logits
        want = torch.log_softmax(logits, -1)[read, tok]
        want_greedy = logits.argmax(-1)[read] == tok
        assert want_greedy[0] and not want_greedy[1]
        for chunk in (7, 16, 50, None):
            logp, greedy = token_logprobs(h, HeadInfo(w, bias, cap), read, tok, vocab_chunk=chunk)
            assert logp.dtype == torch.float32 and torch.allclose(logp, want, atol=1e-5)
            assert torch.equal(greedy, want_greedy)


def test_trees_share_contexts_and_continuation_prefixes():
    from noulengine.lmeval.tree import build_trees

    pairs = [([1, 2, 3], [4]), ([1, 2, 3], [5, 6, 7]), ([1, 2, 3], [5, 6, 8]), ([1, 2, 3], [9]), ([1, 2], [3, 4]),
             ([1, 2, 3], [10, 11])]
    trees = build_trees(pairs, max_length=100)
    assert len(trees) == 2 and trees[0].requests == [0, 1, 2, 3, 5] and trees[1].requests == [4]
    t = trees[0]
    # the context once, then the trie of continuations minus their last token: [5, 6] once (7 and 8
    # are read, not fed), [10] a branch of its own beside it (same position as 5)
    assert t.compiled.token_ids == [1, 2, 3, 5, 6, 10] and t.compiled.position_ids == [0, 1, 2, 3, 4, 3]
    assert t.compiled.parents == [-1, 0, 0] and not t.compiled.is_linear
    assert list(zip(t.term_req, t.term_pos, t.term_tok)) == [
        (0, 2, 4), (1, 2, 5), (1, 3, 6), (1, 4, 7), (2, 2, 5), (2, 3, 6), (2, 4, 8), (3, 2, 9), (5, 2, 10), (5, 5, 11)]
    # one continuation (or one-token ones only): a linear request, run on the causal path
    assert trees[1].compiled.is_linear and trees[1].compiled.token_ids == [1, 2, 3]
    assert build_trees(pairs[:4], max_length=100)[0].compiled.is_linear
    # truncation as the hf backend: (context + continuation)[-(max_length + 1):], so a longer
    # continuation keeps less context and gets a tree of its own
    short = build_trees([([1, 2, 3, 4, 5], [6]), ([1, 2, 3, 4, 5], [6, 7, 8])], max_length=4)
    assert [t.compiled.token_ids for t in short] == [[1, 2, 3, 4, 5][-4:], [4, 5, 6, 7]]


def test_bad_requests_name_the_rule():
    from noulengine.lmeval.tree import LoglikelihoodRequestError, build_trees

    with pytest.raises(LoglikelihoodRequestError, match="request 1: the continuation has no tokens"):
        build_trees([([1], [2]), ([1], [])], max_length=8)
    with pytest.raises(LoglikelihoodRequestError, match="more than max_length 2"):
        build_trees([([1], [2, 3, 4])], max_length=2)


def test_model_args_are_checked_before_any_model_loads():
    from noulengine.lmeval.model import ModelArgsError, NoulEngineLM, parse_adapter

    with pytest.raises(ModelArgsError, match="unknown argument.*foo.*accepted: pretrained"):
        NoulEngineLM(pretrained="/nonexistent", foo=1)
    with pytest.raises(ModelArgsError, match="dtype: expected auto or one of"):
        NoulEngineLM(pretrained="/nonexistent", dtype="float33")
    with pytest.raises(ModelArgsError, match="max_batch_size: expected a positive integer, got 0"):
        NoulEngineLM(pretrained="/nonexistent", max_batch_size=0)
    with pytest.raises(ModelArgsError, match="adapter: expected NAME=PATH"):
        parse_adapter("=/x")
    assert parse_adapter("v2=noul-smollm2-135m-v2") == {"v2": "noul-smollm2-135m-v2"}
    assert parse_adapter("/runs/my-model/") == {"my-model": "/runs/my-model/"}


def test_registered_beside_lm_evals_own_models():
    import noulengine.lmeval  # noqa: F401
    from lm_eval.api.registry import get_model

    from noulengine.lmeval.model import NoulEngineLM

    assert get_model("noulengine") is NoulEngineLM
    assert get_model("hf").__name__ == "HFLM"


def test_cli_defaults_to_noulengine_and_passes_lm_eval_verbs_through():
    from noulengine.lmeval.cli import with_default_model

    assert with_default_model(["--tasks", "x"]) == ["--model", "noulengine", "--tasks", "x"]
    assert with_default_model(["run", "--tasks", "x"]) == ["run", "--model", "noulengine", "--tasks", "x"]
    assert with_default_model(["--model", "hf", "--tasks", "x"]) == ["--model", "hf", "--tasks", "x"]
    assert with_default_model(["ls", "tasks"]) == ["ls", "tasks"]


def test_cli_help_is_lm_evals_and_loads_no_torch():
    import json
    import subprocess
    import sys

    probe = ("import contextlib, io, json, sys\nfrom noulengine.cli import main\nbuf = io.StringIO()\n"
             "with contextlib.redirect_stdout(buf):\n    try:\n        main(['lm-eval', '--help'])\n"
             "    except SystemExit:\n        pass\n"
             "print(json.dumps({'help': buf.getvalue(), 'torch': 'torch' in sys.modules}))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO, timeout=120)
    got = json.loads(proc.stdout)
    assert got["help"].startswith("usage: noulengine lm-eval") and "run" in got["help"] and not got["torch"]


def test_cli_refuses_generation_in_one_line(tiny_llama_dir, capsys):
    from noulengine.cli import main

    rc = main(["lm-eval", "--model_args", f"pretrained={tiny_llama_dir}", "--device", "cpu", "--tasks", "noul_generate",
               "--include_path", str(FIXTURES), "--limit", "2"])
    err = capsys.readouterr().err
    assert rc == 2
    line = [x for x in err.splitlines() if x.startswith("error:")]
    assert line == ["error: generate_until (task noul_generate): noulengine scores continuations and does not "
                    "generate text; run generative tasks with --model hf"]
    assert "Traceback" not in err


def test_cli_runs_a_task_with_lm_eval_flags(tiny_llama_dir, tmp_path, capsys):
    import json

    from noulengine.cli import main

    rc = main(["lm-eval", "--model_args", f"pretrained={tiny_llama_dir},dtype=float32", "--device", "cpu",
               "--tasks", "noul_agnews_letters", "--include_path", str(FIXTURES), "--limit", "3",
               "--log_samples", "--output_path", str(tmp_path)])
    assert rc == 0
    assert "noul_agnews_letters" in capsys.readouterr().out
    written = list(tmp_path.rglob("samples_noul_agnews_letters_*.jsonl"))
    assert len(written) == 1 and len(written[0].read_text().splitlines()) == 3
    results = json.loads(next(tmp_path.rglob("results_*.json")).read_text())
    assert results["config"]["model"] == "noulengine"


# -- the real 135M base and a shipped decision model ---------------------------------------------

@pytest.mark.default_model
@pytest.mark.slow
def test_smollm2_base_equals_hf_backend(smollm2_dir, task_manager):
    """SmolLM2-135M by noulengine's own name against hf on its converted folder: 48 requests
    (4 docs of the letter and label tasks, 2 of the spaced and long ones)."""
    limits = {"noul_agnews_letters": 4, "noul_agnews_labels": 4, "noul_agnews_spaced": 2, "noul_agnews_long": 2}
    hf = hf_lm(smollm2_dir)
    noul = noul_lm("SmolLM2-135M-Instruct")
    worst = 0.0
    for task, limit in limits.items():
        ref = evaluate(hf, [task], task_manager, limit=limit)
        got = evaluate(noul, [task], task_manager, limit=limit)
        check_cases(noul, got)
        worst = max(worst, assert_same_as_hf(ref, got))
    print(f"largest |Δ loglikelihood| vs hf (SmolLM2-135M, float32): {worst:.2e}")


@pytest.mark.default_model
@pytest.mark.slow
def test_shipped_decision_model_and_adapter_arg_equal_hf_with_peft(smollm2_dir, task_manager):
    """A shipped decision model by name (merged) and the same adapter served unmerged with
    ``adapter=NAME=PATH`` on ``base``, against hf with ``peft=`` the shipped folder."""
    from noulengine.models.loading import shipped_model_dir

    folder = shipped_model_dir("noul-smollm2-135m-v2")
    if folder is None:
        pytest.skip("noul-smollm2-135m-v2 is not shipped in this checkout")
    tasks = ["noul_agnews_letters", "noul_agnews_labels"]
    from noulengine.models.peft_compat import quiet_peft_checkpointing_warning

    with quiet_peft_checkpointing_warning():  # peft (inside hf) reads a property transformers 5 deprecated
        hf = hf_lm(smollm2_dir, peft=str(folder))
    ref = evaluate(hf, tasks, task_manager, limit=2)
    assert assert_same_as_hf(ref, evaluate(noul_lm("noul-smollm2-135m-v2"), tasks, task_manager, limit=2)) <= TOL
    unmerged = noul_lm("base", adapter="v2=noul-smollm2-135m-v2")
    assert assert_same_as_hf(ref, evaluate(unmerged, tasks, task_manager, limit=2)) <= TOL

