"""benchmarks/gpu_suite.py --dry-run: the GPU suite's code paths on the CPU, tiny shapes (seconds)."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

SUITE = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_suite.py"


def _suite():
    spec = importlib.util.spec_from_file_location("gpu_suite", SUITE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dry_run_writes_json_and_csv(tmp_path):
    import specdec_lesson.kernels as K  # sets TRITON_INTERPRET=1 without CUDA: before anything imports triton

    if not K.triton_importable():
        pytest.skip("triton is not importable")
    suite = _suite()
    rc = suite.main(["--dry-run", "--out", str(tmp_path)])
    jfiles, cfiles = list(tmp_path.glob("gpu_suite_dryrun_*.json")), list(tmp_path.glob("gpu_suite_dryrun_*.csv"))
    assert len(jfiles) == 1 and len(cfiles) == 1
    res = json.loads(jfiles[0].read_text())
    assert rc == 0, {k: v.get("error") for k, v in res["sections"].items()}
    m = res["machine"]
    assert res["dry_run"] is True and m["date"] and m["torch"] and m["transformers"] and "gpu" in m
    secs = res["sections"]
    assert set(secs) == {"copy", "bitexact", "verify_grid", "kernels", "tree_attention", "verify_curve"}
    assert secs["bitexact"]["all_correct"] and secs["bitexact"]["rows_checked"] > 0 and secs["verify_grid"]["all_correct"]
    assert all("error" not in s and "skipped" not in s for s in secs.values())
    assert secs["copy"]["copy_gbps"] > 0
    assert {r["name"] for r in secs["kernels"]["rows"]} == {"verify_chain", "tree_attention", "compact_kv"}
    assert secs["kernels"]["all_correct"] and secs["tree_attention"]["all_correct"]
    assert len({r["shape"] for r in secs["tree_attention"]["rows"]}) == 2
    curve = secs["verify_curve"]
    assert {(r["batch"], r["n"]) for r in curve["rows"]} == {(b, n) for b in (1, 2) for n in (1, 2, 3, 4)}
    assert all(r["ratio_to_n1"] == 1.0 for r in curve["rows"] if r["n"] == 1)
    assert all(r["ms"] > 0 and r["enqueue_ms"] > 0 for r in curve["rows"])
    rows = list(csv.DictReader(cfiles[0].open()))
    assert {r["section"] for r in rows} == set(secs)
    assert all(r["date"] == m["date"] and r["torch"] == m["torch"] for r in rows)


def test_llama3_8b_shape():
    """The GPU model is Llama-3-8B-shaped (8.0B parameters), checked on the meta device (no memory)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    suite = _suite()
    with torch.device("meta"):
        model = LlamaForCausalLM(LlamaConfig(**suite.LLAMA3_8B))
    n = sum(p.numel() for p in model.parameters())
    assert 8.0e9 <= n <= 8.1e9, n
    plan = suite.GPU_PLAN["curve"]
    assert plan["ns"] == list(range(1, 65)) and plan["batches"] == [1, 16, 64] and plan["dtype"] == torch.bfloat16


def test_section_failure_is_recorded_not_fatal(tmp_path):
    suite = _suite()
    res = suite.run(True, 60.0, ["copy", "nonsense"])
    assert "error" in res["sections"]["nonsense"] and "copy_gbps" in res["sections"]["copy"]
    res = suite.run(True, 0.0, ["copy"])
    assert "skipped" in res["sections"]["copy"]
