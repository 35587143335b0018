"""``--engine vllm``: the same prompts through vLLM's own speculative decoding (GPU only).

vLLM's current API (docs.vllm.ai, features/speculative_decoding): ``LLM(model=target,
speculative_config={"method": "draft_model", "model": draft, "num_speculative_tokens": K})`` for
a draft model and ``{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": n}``
for prompt lookup; no ``speculative_config`` is the plain baseline.  Each configuration is its own
engine owning the GPU memory, so here the runs are grouped per method (not interleaved like the
native runner), with the same prompts, token ids, max_new_tokens, sampling settings and seeds.
Acceptance counters are not collected (vLLM exposes them through its metrics, not per request).
Untested on the CPU development machines (no vLLM, no GPU there).
"""

from __future__ import annotations

import gc
import sys
import time
from datetime import UTC

from . import tasks as T
from .metrics import prompt_table, task_table
from .runner import PAIRS, RESULTS_FORMAT, BenchSettings, _git_revision, machine_info

__all__ = ["run_vllm", "VLLM_METHODS"]

VLLM_METHODS = ("ar", "chain", "prompt-lookup")


def _require_vllm():
    import torch

    try:
        import vllm
    except ImportError:
        raise ValueError("--engine vllm needs the 'vllm' package (pip install vllm) and a CUDA GPU; "
                         "vllm is not installed") from None
    if not torch.cuda.is_available():
        raise ValueError("--engine vllm needs a CUDA GPU, and none is available")
    return vllm


def run_vllm(s: BenchSettings, *, pair: str | None, target: str | None, draft: str | None, progress: bool = True) -> dict:
    s.validate()
    bad = [m for m in s.methods if m not in VLLM_METHODS]
    if bad:
        raise ValueError(f"--engine vllm runs only {', '.join(VLLM_METHODS)}; not {', '.join(bad)}")
    if target or draft:
        tname, dname = target, draft
    elif pair in PAIRS and PAIRS[pair]:
        tname, dname = PAIRS[pair]
    elif pair == "default":
        from ..models import default_target_cache_dir

        tname, dname = str(default_target_cache_dir()), None
    else:
        raise ValueError(f"--engine vllm needs a hub pair ({', '.join(k for k, v in PAIRS.items() if v)}) or --target/--draft")
    if "chain" in s.methods and not dname:
        raise ValueError("method 'chain' under vLLM needs a draft model path (--draft)")
    vllm = _require_vllm()
    from tqdm.auto import tqdm
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tname)
    items = {t: T.task_items(t, s.limit, s.prompts_file) for t in s.tasks}
    enc = {t: [tok(T.chat(tok, it["text"]), add_special_tokens=False)["input_ids"] for it in its] for t, its in items.items()}
    labels = s.labels()
    runs = []
    first_tokens: dict[tuple, list[int]] = {}
    bar = tqdm(total=sum(len(v) for v in items.values()) * s.repeats * len(labels), desc="vllm", disable=not progress,
               file=sys.stderr)
    for label, method, k in labels:
        spec = None
        if method == "chain":
            spec = {"method": "draft_model", "model": dname, "num_speculative_tokens": k}
        elif method == "prompt-lookup":
            spec = {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": s.prompt_lookup_ngram,
                    "prompt_lookup_min": 1}
        llm = vllm.LLM(model=tname, speculative_config=spec, seed=s.seed)

        def params(seed: int):
            kw = dict(temperature=s.temperature, max_tokens=s.max_new_tokens, seed=seed)
            if s.top_p is not None:
                kw["top_p"] = s.top_p
            if s.top_k is not None:
                kw["top_k"] = s.top_k
            return vllm.SamplingParams(**kw)

        first = next(t for t in s.tasks if enc[t])
        for _ in range(s.warmup):
            llm.generate([{"prompt_token_ids": enc[first][0]}], params(s.seed), use_tqdm=False)
        for ti, task in enumerate(s.tasks):
            for pi, (item, ids) in enumerate(zip(items[task], enc[task])):
                for r in range(s.repeats):
                    seed = s.seed * 10_000_000 + ti * 1_000_000 + pi * 100 + r
                    t0 = time.perf_counter()
                    out = llm.generate([{"prompt_token_ids": ids}], params(seed), use_tqdm=False)[0].outputs[0]
                    wall = time.perf_counter() - t0
                    toks = list(out.token_ids)
                    rec = {"task": task, "prompt_id": item["id"], "label": label, "method": method, "k": k, "repeat": r,
                           "seed": seed, "prompt_tokens": len(ids), "wall_s": wall, "new_tokens": len(toks), "stats": None}
                    if r == 0:
                        rec["text"] = out.text
                        first_tokens[(task, item["id"], label)] = toks
                        if task == "math":
                            rec["correct"] = T.answer_matches(out.text, item["answer"])
                    runs.append(rec)
                    bar.update(1)
        del llm
        gc.collect()
    bar.close()
    for rec in runs:
        if rec["repeat"] == 0:
            ar = first_tokens.get((rec["task"], rec["prompt_id"], "ar"))
            mine = first_tokens[(rec["task"], rec["prompt_id"], rec["label"])]
            rec["equal_ar"] = (mine == ar) if s.temperature == 0 and ar is not None else None
    from dataclasses import asdict
    from datetime import datetime

    return {
        "format": RESULTS_FORMAT, "complete": True, "engine": f"vllm {vllm.__version__}",
        "created": datetime.now(UTC).isoformat(timespec="seconds"), "machine": machine_info(), "git": _git_revision(),
        "pair": {"pair": pair if not target else "custom", "target": tname, "draft": dname}, "device": "cuda",
        "settings": asdict(s), "labels": [{"label": a, "method": m, "k": k} for a, m, k in labels],
        "definitions": "as the native engine; vLLM runs are grouped per method; alpha/tau not collected",
        "notes": ["vLLM engine: runs grouped per method (one engine at a time), not interleaved"],
        "runs": runs, "per_prompt": prompt_table(runs), "per_task": task_table(runs),
    }
