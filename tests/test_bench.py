"""Tests of the benchmark suite: tasks, metrics, results files, the CLI end to end on tiny models."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_lesson.bench import tasks as T
from specdec_lesson.bench.__main__ import main
from specdec_lesson.bench.metrics import median, pooled_acceptance, prompt_table, task_table
from specdec_lesson.bench.runner import BenchSettings, check_code_reply, load_results, write_results


# ------------------------------------------------------------------------------------ math set
def _recompute(p: dict) -> int:
    """A third computation of each template's answer, written independently of tasks.py."""
    d, t = p["numbers"], p["template"]
    if t == "shopping":
        return d["bill"] - d["a"] * d["p"] - d["b"] * d["q"]
    if t == "boxes":
        return math.floor(d["per"] * d["trees"] / d["box"])
    if t == "trip":
        return d["v"] * d["h"] + d["w"] * d["g"]
    if t == "savings":
        return math.ceil((d["goal"] - d["b"]) / d["a"])
    if t == "ages":
        # x + 2*ben + 2*y = s
        ben = (d["s"] - d["x"] - 2 * d["y"]) / 2
        assert ben == int(ben)
        return int(ben)
    if t == "sale":
        return round(d["p"] * (1 - d["d"] / 100))
    if t == "fence":
        return (d["l"] + d["w"]) * 2 * d["c"]
    if t == "recipe":
        return round(d["k"] / d["c"] * d["e"])
    if t == "classroom":
        n = d["g"] * d["s"] - d["a"] + d["b"]
        assert n % d["t"] == 0
        return n // d["t"]
    if t == "wages":
        return round(d["r"] * (5 * d["h"] + 1.5 * d["k"]))
    if t == "tank":
        assert d["c"] % (d["f"] - d["l"]) == 0
        return d["c"] // (d["f"] - d["l"])
    if t == "reading":
        return next(n for n in range(1, 1000) if n * d["a"] + d["d"] * n * (n - 1) // 2 >= d["p"])
    raise AssertionError(f"unknown template {t}")


def test_math_problems_verified_unique_and_split():
    ev, tr = T.math_problems("eval"), T.math_problems("train")
    assert len(ev) >= 80 and len(tr) >= 80
    for p in ev + tr:
        assert isinstance(p["answer"], int) and p["answer"] > 0
        assert p["answer"] == _recompute(p), p
        for v in p["numbers"].values():
            if isinstance(v, int) and v > 0 and p["template"] != "ages":
                assert str(v) in p["question"], (v, p["question"])
    questions = [p["question"] for p in ev + tr]
    assert len(set(questions)) == len(questions)  # unique, and train/eval disjoint
    assert len({p["template"] for p in ev}) >= 10
    held = {p["template"] for p in ev if p["held_out"]}
    assert held and not held & {p["template"] for p in tr}
    assert T.math_problems() == ev and len(T.math_problems("all")) == len(ev) + len(tr)
    assert T.math_problems() == T.math_problems()  # deterministic


def test_math_task_prefixes_spread_over_templates():
    items = T.task_items("math", 8)
    assert len({it["template"] for it in items}) == 8
    assert sum(it["held_out"] for it in items) == 4  # --limit 8: 4 templates with a train split, 4 held out
    every = T.task_items("math")
    assert sorted(it["id"] for it in every) == sorted(p["id"] for p in T.math_problems("eval"))  # a permutation


def test_function_requests_are_fixed_distinct_and_free_form():
    from specdec_lesson.bench.requests import FUNCTION_IDEAS, function_requests

    reqs = function_requests()
    assert reqs == function_requests() and len(reqs) == len(FUNCTION_IDEAS) >= 40
    assert len({r["text"] for r in reqs}) == len(reqs) and len({r["name"] for r in reqs}) == len(reqs)
    assert all("Python" in r["text"] and r["name"] in r["text"] and "```" not in r["text"] for r in reqs)
    items = T.task_items("requests", 5)
    assert [it["id"] for it in items] == [r["id"] for r in reqs[:5]] and items[0]["text"] == reqs[0]["text"]


def test_code_problems_split_and_prompt_formats():
    ev, tr = T.code_problems("eval"), T.code_problems("train")
    assert [p["task_id"] for p in ev] == [f"HumanEval/{i}" for i in T.HUMANEVAL_EVAL_IDS]
    assert [p["task_id"] for p in tr] == [f"HumanEval/{i}" for i in T.HUMANEVAL_TRAIN_IDS]
    assert T.format_code_prompt({"prompt": "def f():\n"}) == (
        "Complete this Python function. Reply with the completed function in one Python code block.\n\n```python\ndef f():\n```")
    assert T.format_math_prompt({"question": "1+1?"}) == (
        "Solve this problem step by step. End with a line 'Answer: <number>'.\n\n1+1?")
    with pytest.raises(ValueError, match="split"):
        T.code_problems("test")


def test_chat_wraps_with_the_template():
    class Tok:
        chat_template = "x"

        def apply_chat_template(self, msgs, add_generation_prompt, tokenize):
            assert add_generation_prompt and not tokenize
            return f"<u>{msgs[0]['content']}</u><a>"

    assert T.chat(Tok(), "hi") == "<u>hi</u><a>"
    assert T.chat(None, "hi") == "hi"


@pytest.mark.parametrize("text, expected", [
    ("so 3 + 4 = 7\nAnswer: 7", 7.0), ("Answer: $1,234", 1234.0), ("answer = -2.5", -2.5),
    ("**Answer:** 42", 42.0), ("Answer: 5\nwait... Answer: 6", 6.0), ("it is \\boxed{12}", 12.0),
    ("the total is 12 apples", None), ("Answer: <number>", None),
])
def test_extract_answer(text, expected):
    assert T.extract_answer(text) == expected


def test_load_prompts_good_and_malformed(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "hello"}\n\n{"prompt": "world", "id": "w"}\n')
    assert T.load_prompts(good) == [{"id": "prompt-000", "prompt": "hello"}, {"id": "w", "prompt": "world"}]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"prompt": "oops"\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2: not valid JSON"):
        T.load_prompts(bad)
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"prompt": "ok"}\n{"text": "x"}\n')
    with pytest.raises(ValueError, match=r"nofield\.jsonl:2: expected a JSON object"):
        T.load_prompts(nofield)
    with pytest.raises(ValueError, match="does not exist"):
        T.load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="no prompts"):
        T.load_prompts(tmp_path / "empty.jsonl")


# ------------------------------------------------------------------------------------- metrics
def _run(task, pid, label, repeat, wall, tokens, stats=None, **extra):
    return dict(task=task, prompt_id=pid, label=label, method=label.split("-k")[0], k=None, repeat=repeat, wall_s=wall,
                new_tokens=tokens, stats=stats, **extra)


def test_metrics_hand_computed():
    s1 = dict(accepted=6, proposed=8, emitted=8, row_steps=2, accept_hist=[0, 0, 1, 0, 1], target_forwards=3)
    s2 = dict(accepted=2, proposed=8, emitted=4, row_steps=2, accept_hist=[1, 0, 0, 1, 0], target_forwards=3)
    runs = [
        # prompt a: ar 10 tokens in 1.0 / 2.0 / 1.5 s -> median tok/s 10/1.5; chain 10 tokens in 0.5 / 0.4 / 0.6 s
        _run("math", "a", "ar", 0, 1.0, 10, equal_ar=True, correct=True), _run("math", "a", "ar", 1, 2.0, 10),
        _run("math", "a", "ar", 2, 1.5, 10),
        _run("math", "a", "chain-k4", 0, 0.5, 10, s1, equal_ar=True, correct=False),
        _run("math", "a", "chain-k4", 1, 0.4, 10, s1), _run("math", "a", "chain-k4", 2, 0.6, 10, s1),
        # prompt b: ar 20 tokens in 2 s; chain 20 tokens in 4 s (one repeat)
        _run("math", "b", "ar", 0, 2.0, 20, equal_ar=True, correct=True),
        _run("math", "b", "chain-k4", 0, 4.0, 20, s2, equal_ar=False, correct=True),
    ]
    rows = {(r["prompt_id"], r["label"]): r for r in prompt_table(runs)}
    a_ar, a_ch = rows[("a", "ar")], rows[("a", "chain-k4")]
    assert a_ar["wall_s"] == 1.5 and a_ar["tokens_per_s"] == pytest.approx(10 / 1.5)
    # paired: repeat r of chain over repeat r of ar -> 2.0, 5.0, 2.5; the prompt's speedup is their median
    assert a_ch["tokens_per_s"] == pytest.approx(20.0) and a_ch["speedup"] == pytest.approx(2.5)
    # alpha = accepted / (accepted + rejections); these records have no "rejections" counter, so the steps with
    # n < k = 4 accepted in accept_hist count (one per s1 record); utilisation = accepted / proposed
    assert a_ch["alpha"] == pytest.approx(18 / 21) and a_ch["utilisation"] == pytest.approx(18 / 24)
    assert a_ch["tau"] == pytest.approx(24 / 6)
    assert a_ch["accept_hist"] == [0, 0, 3, 0, 3] and a_ch["target_forwards_per_token"] == pytest.approx(9 / 30)
    assert rows[("b", "chain-k4")]["speedup"] == pytest.approx(0.5)
    tt = {r["label"]: r for r in task_table(runs)}
    # task, per repeat (tokens with their own seconds, summed over the prompts measured in that repeat):
    # ar 30/3.0, 10/2.0, 10/1.5 tok/s; chain 30/4.5, 10/0.4, 10/0.6; paired ratios 2/3, 5, 2.5 -> median 2.5
    assert tt["ar"]["tokens_per_s"] == pytest.approx(10 / 1.5) and tt["ar"]["speedup"] == pytest.approx(1.0)
    assert tt["chain-k4"]["speedup_repeats"] == pytest.approx([2 / 3, 5.0, 2.5])
    assert tt["chain-k4"]["speedup"] == pytest.approx(2.5)
    assert tt["chain-k4"]["speedup_median"] == pytest.approx(0.5 * (2.5 + 0.5))
    assert tt["chain-k4"]["prompts"] == 2 and tt["chain-k4"]["repeats"] == 3
    assert tt["chain-k4"]["alpha"] == pytest.approx(20 / 25) and tt["chain-k4"]["utilisation"] == pytest.approx(20 / 32)
    assert tt["chain-k4"]["tau"] == pytest.approx(28 / 8)
    assert tt["chain-k4"]["accept_hist"] == [1, 0, 3, 1, 3]
    assert tt["chain-k4"]["target_forwards_per_token"] == pytest.approx(12 / 50)
    assert tt["chain-k4"]["accuracy"] == 0.5 and tt["chain-k4"]["equal_ar_rate"] == 0.5 and tt["ar"]["accuracy"] == 1.0
    assert tt["ar"]["alpha"] is None and tt["chain-k4"]["pass_at_1"] is None


def test_median_and_pooling_edge_cases():
    assert median([3, 1, 2]) == 2 and median([4, 1, 2, 3]) == 2.5 and math.isnan(median([]))
    assert pooled_acceptance([None, None])["alpha"] is None


# ------------------------------------------------------------------------------- results files
def _minimal(**extra) -> dict:
    """The smallest complete results file that ``report`` can read."""
    return {"format": "specdec-bench/1", "complete": True, "per_task": [], "labels": [], "pair": {}, "machine": {},
            "settings": {"max_new_tokens": 1, "temperature": 0.0, "repeats": 1}, **extra}


def test_write_results_is_atomic_and_strict(tmp_path):
    path = tmp_path / "r.json"
    write_results(_minimal(x=float("nan")), path)
    assert json.loads(path.read_text())["x"] is None and load_results(path)["complete"] is True
    with pytest.raises(TypeError):
        write_results(_minimal(bad=object()), path)
    assert load_results(path)["x"] is None  # the failed write left the old file whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]  # and no temporary file behind
    write_results({"format": "specdec-bench/1", "complete": False}, tmp_path / "p.json")
    with pytest.raises(ValueError, match="interrupted"):
        load_results(tmp_path / "p.json")


def test_check_code_reply_runs_humaneval_tests():
    prob = T.code_problems("eval")[0]
    good = f"```python\n{prob['prompt']}{prob['canonical_solution']}```"
    assert check_code_reply(prob, good)
    assert not check_code_reply(prob, f"```python\ndef {prob['entry_point']}(s):\n    return 'x'\n```")
    assert not check_code_reply(prob, f"```python\ndef {prob['entry_point']}(s):\n    while True: pass\n```", timeout=2)


def test_settings_labels_put_ar_first_and_sweep_k():
    s = BenchSettings(methods=["chain", "hf"], ks=[1, 4])
    assert [lab for lab, _, _ in s.labels()] == ["ar", "chain-k1", "chain-k4", "hf"]


# ---------------------------------------------------------------------------------------- CLI
def test_cli_end_to_end_tiny(tmp_path, capsys):
    """FAST: 2 tasks x 1 prompt x 2 repeats x 10 method/K labels, 4 new tokens, tiny random models."""
    out = tmp_path / "bench_tiny.json"
    rc = main(["--pair", "tiny", "--task", "code,math", "--limit", "1", "--max-new-tokens", "4", "--repeats", "2",
               "--warmup", "1", "--k", "1,2", "--method", "ar,chain,prompt-lookup,hf,hf-assisted,hf-prompt-lookup",
               "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    res = load_results(out)
    assert res["complete"] and res["pair"]["pair"] == "tiny" and res["machine"]["torch"]
    assert res["git"]["revision"] is None or len(res["git"]["revision"]) == 40
    assert len(res["labels"]) == 10 and len(res["runs"]) == 2 * 2 * 10
    first = [r["label"] for r in res["runs"][:20]]
    assert first[:10] != first[10:20] and sorted(first[:10]) == sorted(first[10:20])  # interleaved, rotated order
    seeds = {(r["task"], r["prompt_id"], r["repeat"]): set() for r in res["runs"]}
    for r in res["runs"]:
        seeds[(r["task"], r["prompt_id"], r["repeat"])].add(r["seed"])
    assert all(len(v) == 1 for v in seeds.values())  # every method got the same seed
    tt = {(r["task"], r["label"]): r for r in res["per_task"]}
    assert tt[("math", "ar")]["speedup"] == pytest.approx(1.0)
    assert 0 <= tt[("math", "chain-k2")]["alpha"] <= 1 and len(tt[("math", "chain-k2")]["accept_hist"]) == 3
    assert tt[("math", "chain-k2")]["equal_ar_rate"] is not None and tt[("math", "hf")]["accuracy"] is not None
    assert all(r["new_tokens"] == 4 for r in res["runs"])
    html = tmp_path / "report.html"
    assert main(["--report", str(out), "--html", str(html)]) == 0
    assert html.stat().st_size < 200_000 and "plotly" in html.read_text()


def test_cli_k_auto_chooses_one_k_and_says_why(tmp_path, capsys):
    """--k auto: the simulator's cost model picks K from a probe of this machine; the run uses it and notes why."""
    out = tmp_path / "bench_auto.json"
    rc = main(["--pair", "tiny", "--task", "code", "--limit", "1", "--max-new-tokens", "4", "--repeats", "1",
               "--warmup", "0", "--k", "auto", "--method", "ar,chain", "--out", str(out), "--no-progress"])
    assert rc == 0, capsys.readouterr().err
    res = load_results(out)
    (k,) = res["settings"]["ks"]
    assert res["settings"]["auto_k"] and [lab["label"] for lab in res["labels"]] == ["ar", f"chain-k{k}"]
    assert any(f"K = {k} for every drafting method" in n and "predicted" in n for n in res["notes"]), res["notes"]


def _expect_error(capsys, argv, fragment):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec-bench: error:") and fragment in lines[0], err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv, fragment", [
    (["--task", "poetry"], "unknown task 'poetry'"),
    (["--method", "ar,magic"], "unknown method 'magic'"),
    (["--k", "0"], "--k values must be >= 1"),
    (["--k", "two"], "--k takes integers"),
    (["--k", "auto,2"], "--k takes integers"),
    (["--prompts", "/nonexistent/p.jsonl"], "does not exist"),
    (["--task", "prompts"], "needs --prompts"),
    (["--pair", "gpt5"], "unknown pair 'gpt5'"),
    (["--device", "cuda:0"], "cuda"),
    (["--temperature", "-1"], "temperature"),
    (["--report", "/nonexistent/r.json"], "does not exist"),
    (["--bogus-flag"], "unrecognized arguments"),
    (["--method", "ar,hybrid"], "cannot commit tokens it did not propose"),
    (["--hybrid-lookup-k", "0"], "hybrid_lookup_k must be >= 1"),
])
def test_cli_bad_input_one_line(capsys, argv, fragment):
    import torch

    if argv[:1] == ["--device"] and torch.cuda.is_available():
        pytest.skip("--device cuda is valid on this CUDA machine: this case checks the error on a machine without CUDA")
    _expect_error(capsys, ["--pair", "tiny", "--no-progress", *argv] if argv[0] != "--pair" else argv, fragment)


def test_cli_malformed_prompts_file_names_the_line(tmp_path, capsys):
    p = tmp_path / "mine.jsonl"
    p.write_text('{"prompt": "a"}\nnot json\n')
    _expect_error(capsys, ["--pair", "tiny", "--prompts", str(p)], "mine.jsonl:2")


def _save_tiny(folder: Path, vocab: int, tokens: int, seed: int) -> str:
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from specdec_lesson.models import tiny_llama

    tiny_llama(vocab_size=vocab, seed=seed, dtype=__import__("torch").float32).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(tokens)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0").save_pretrained(folder)
    return str(folder)


def test_cli_pair_with_different_vocabularies(tmp_path, capsys):
    a = _save_tiny(tmp_path / "a", vocab=64, tokens=64, seed=0)
    b = _save_tiny(tmp_path / "b", vocab=64, tokens=60, seed=1)  # other tokenizer
    c = _save_tiny(tmp_path / "c", vocab=80, tokens=64, seed=2)  # same tokenizer, larger head than the target
    capsys.readouterr()
    _expect_error(capsys, ["--target", a, "--draft", b, "--method", "ar,chain"], "tokenizers differ")
    _expect_error(capsys, ["--target", a, "--draft", c, "--method", "ar,chain"], "vocabularies differ in size")


def test_cli_draft_vocab_padding_is_noted(tmp_path):
    from specdec_lesson.bench.runner import load_models

    t = _save_tiny(tmp_path / "t", vocab=80, tokens=64, seed=0)
    d = _save_tiny(tmp_path / "d", vocab=64, tokens=64, seed=1)
    loaded = load_models(None, t, d)
    assert loaded.draft.get_output_embeddings().weight.shape[0] == 80
    assert any("padded from 64 to 80" in n for n in loaded.notes)


def test_module_entry_point_error_has_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "specdec_lesson.bench", "--k", "-3"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["specdec-bench: error: --k values must be >= 1, got '-3'"]


def test_hf_assisted_falls_back_to_a_self_draft_and_says_so():
    import torch

    from specdec_lesson.bench.runner import load_models
    from specdec_lesson.drafters import PromptLookupDrafter

    loaded = load_models("tiny")
    loaded.draft = PromptLookupDrafter()  # not a HF model, like a feature-level draft
    sd = loaded.hf_assistant(1)
    assert len(sd.model.layers) == 1 and sd.model.layers[0] is loaded.target.model.layers[0]  # shared, not copied
    assert any("self-draft of the target's first 1 layers" in n for n in loaded.notes)
    cfg = sd.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule, cfg.assistant_confidence_threshold = 3, "constant", 0.0
    x = torch.tensor([[1, 2, 3, 4, 5, 6]])
    plain = loaded.target.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0)
    assisted = loaded.target.generate(x, max_new_tokens=6, do_sample=False, pad_token_id=0, assistant_model=sd)
    assert torch.equal(plain, assisted)


def test_methods_needing_a_draft_fail_clearly_without_one():
    from specdec_lesson.bench.runner import _check_methods, load_models

    loaded = load_models("tiny")
    loaded.draft = None
    with pytest.raises(ValueError, match=r"\['chain'\] need a draft model"):
        _check_methods(loaded, BenchSettings(methods=["ar", "chain"]).labels())


def test_hybrid_tree_method_needs_the_default_pair():
    from specdec_lesson.bench.runner import _check_methods, load_models

    with pytest.raises(ValueError, match="adaptive-tree search .* use them with --pair default"):
        _check_methods(load_models("tiny"), BenchSettings(methods=["ar", "hybrid-tree"]).labels())


def test_tree_method_runs():
    from specdec_lesson.bench.runner import load_models, run_benchmark

    s = BenchSettings(tasks=["math"], methods=["ar", "tree"], max_new_tokens=4, repeats=1, warmup=0, limit=1)
    res = run_benchmark(load_models("tiny"), s, progress=False)
    row = next(r for r in res["per_task"] if r["label"] == "tree")
    assert res["complete"] and row["new_tokens"] == 4 and row["tau"] >= 1 and row["equal_ar_rate"] is not None


def test_results_record_the_cpu_and_find_only_real_gpu_suite_runs(tmp_path):
    import json

    from specdec_lesson.bench.results import cpu_model, latest_gpu_suite, machine_info

    info = machine_info()
    assert set(cpu_model()) <= set(info) and all(isinstance(x, str) for x in info.get("isa", []))
    assert latest_gpu_suite(tmp_path) is None  # nothing measured: the notebooks say "not measured yet"
    (tmp_path / "gpu_suite_dryrun_cpu_1.json").write_text(json.dumps({"suite": "specdec gpu_suite/1", "dry_run": True}))
    (tmp_path / "gpu_suite_broken.json").write_text("{not json")
    assert latest_gpu_suite(tmp_path) is None  # dry runs and unreadable files never pass for a GPU measurement
    for date in ("2026-12-01", "2026-12-02"):
        (tmp_path / f"gpu_suite_h200_{date}.json").write_text(json.dumps(
            {"suite": "specdec gpu_suite/1", "dry_run": False, "machine": {"date": date, "gpu": "NVIDIA H200"}}))
    got = latest_gpu_suite(tmp_path)
    assert got["machine"]["date"] == "2026-12-02" and got["path"].endswith("gpu_suite_h200_2026-12-02.json")
