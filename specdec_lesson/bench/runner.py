"""Benchmark runner: load a model pair, run every method on the same prompts, write a results file.

Fairness rules: every method sees the same chat-formatted prompts, ``max_new_tokens``, sampling
settings and seeds (seed per prompt and repeat, shared by the methods); runs are interleaved
(for each prompt and repeat, every method once, in an order rotated from one call to the next,
so slow drift of the machine spreads over all methods); warm-up calls are made and discarded;
per-prompt figures are medians over repeats (see ``metrics``).  Batch size is 1 (one prompt
per call), the setting of Spec-Bench and of HF assisted generation.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import torch

from . import tasks as T
from .loading import PAIRS, CharTokenizer, Loaded, load_models
from .methods import REGISTRY, check_methods, k_methods, largest_step, runs_on
from .metrics import AR_LABEL, prompt_table, task_table
from .paired import repeat_spread
from .results import RESULTS_FORMAT, _git_revision, load_results, machine_info, write_results
from .sandbox import check_code_reply, missing_protections_note

__all__ = ["METHODS", "K_METHODS", "PAIRS", "RESULTS_FORMAT", "BenchSettings", "Loaded", "load_models", "run_benchmark",
           "write_results", "load_results", "check_code_reply", "CharTokenizer", "machine_info"]

# the method names and those that take K, as the table (methods.REGISTRY) holds them at import; the checks below
# read the table itself, so a method registered later counts too
METHODS = tuple(REGISTRY)
K_METHODS = k_methods()


@dataclass
class BenchSettings:
    tasks: list[str] = field(default_factory=lambda: ["code", "math"])
    methods: list[str] = field(default_factory=lambda: ["ar", "adaptive", "chain", "prompt-lookup", "hf", "hf-assisted",
                                                        "hf-prompt-lookup"])
    ks: list[int] = field(default_factory=lambda: [4])
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    repeats: int = 3
    warmup: int = 1
    limit: int | None = None
    seed: int = 0
    prompts_file: str | None = None
    check_code: bool = False
    prompt_lookup_ngram: int = 3
    hf_assistant_layers: int = 8
    hybrid_lookup_k: int = 8  # hybrid: proposals per step when prompt lookup drafts (hybrid.HybridDrafter)
    auto_k: bool = False  # K chosen at the start by the simulator's cost model from a probe (sim.calibrate.tune_k)

    def validate(self) -> None:
        for name in ("tasks", "methods", "ks"):
            items = list(getattr(self, name))
            if not items:
                raise ValueError(f"{name} is empty: give at least one")
            dup = [x for i, x in enumerate(items) if x in items[:i]]
            if dup:
                raise ValueError(f"{name} lists {dup[0]!r} more than once: give each once (repeats would be pooled into one row)")
        for t in self.tasks:
            if t not in T.TASKS:
                raise ValueError(f"unknown task {t!r}; choose from {', '.join(T.TASKS)}")
        for m in self.methods:
            if m not in REGISTRY:
                raise ValueError(f"unknown method {m!r}; choose from {', '.join(REGISTRY)}")
        if not self.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"every K must be an integer >= 1, got {self.ks}")
        for name in ("max_new_tokens", "repeats", "hybrid_lookup_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"warmup must be >= 0, got {self.warmup}")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit must be >= 1 (or not given: every prompt), got {self.limit}")
        from ..sampling import check_sampling_args

        check_sampling_args(self.temperature, self.top_k, self.top_p)

    def labels(self) -> list[tuple[str, str, int | None]]:
        """(label, method, k) for every method and K; ``ar`` first (every speedup needs it)."""
        methods = ["ar"] + [m for m in self.methods if m != "ar"]
        out = []
        for m in methods:
            if m in REGISTRY and REGISTRY[m].takes_k:
                out += [(f"{m}-k{k}", m, k) for k in self.ks]
            else:
                out.append((m, m, None))
        return out


# ----------------------------------------------------------------------------------- methods
def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _run_one(loaded: Loaded, method: str, k: int | None, ids: list[int], s: BenchSettings,
             seed: int) -> tuple[list[int], dict | None]:
    """One generation of ``method`` (its entry in ``methods.REGISTRY``): (new token ids, stats dict or None)."""
    return REGISTRY[method].run(loaded, k, ids, s, seed)


# ------------------------------------------------------------------------------------- run
def _seed(s: BenchSettings, task_index: int, prompt_index: int, repeat: int) -> int:
    return s.seed * 10_000_000 + task_index * 1_000_000 + prompt_index * 100 + repeat


def _check_methods(loaded: Loaded, labels) -> None:
    check_methods(loaded, {m for _, m, _ in labels})  # what each method needs from this pair (methods.REGISTRY)


def _check_fits(loaded: Loaded, items: dict, encoded: dict, s: BenchSettings, labels) -> None:
    """Every prompt + ``max_new_tokens`` + one step's drafts must fit the target's context: say so before the
    warm-up (naming the longest prompt and the largest budget that fits), not at the prompt that overflows."""
    check_fits(context_limit(getattr(loaded.target, "config", None)), items, encoded, s, labels)


def context_limit(cfg) -> int | None:
    """The target's context (``max_position_embeddings``) from its config, or None where it has none."""
    cfg = cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg
    limit = getattr(cfg, "max_position_embeddings", None)
    return limit if isinstance(limit, int) else None


def check_fits(limit: int | None, items: dict, encoded: dict, s: BenchSettings, labels) -> None:
    """``_check_fits`` from the context ``limit`` alone: the command line runs it before loading the models, from
    the tokenizer and the config (``bench.__main__``); labels with K None (``--k auto``) count one draft."""
    if limit is None or not any(encoded.values()):
        return
    step = largest_step(s, labels)  # one step's largest proposal (each method's max_step)
    task, i = max(((t, j) for t in encoded for j in range(len(encoded[t]))), key=lambda tj: len(encoded[tj[0]][tj[1]]))
    longest = len(encoded[task][i])
    if longest + s.max_new_tokens + step > limit:
        fits = limit - longest - step
        fix = f"use --max-new-tokens <= {fits}" if fits >= 1 else "shorten that prompt"
        raise ValueError(f"prompt {items[task][i]['id']!r} ({task}) has {longest} tokens: with max_new_tokens "
                         f"{s.max_new_tokens} and up to {step} drafts per step it exceeds the target's context of "
                         f"{limit} positions; {fix}")


def run_benchmark(loaded: Loaded, s: BenchSettings, *, progress: bool = True, journal=None) -> dict:
    """Run every (task, prompt, repeat, method); return the results dict (see ``write_results``).

    ``journal`` (a ``bench.journal.RunJournal``, or None): gets the header before the warm-up and every run
    record as soon as it is measured (on disk before the next run starts), so a killed process keeps them.
    Ctrl-C (or SIGTERM turned into one by the command line) returns the runs so far, marked incomplete."""
    from tqdm.auto import tqdm

    s.validate()
    labels = s.labels()
    _check_methods(loaded, labels)
    items = {t: T.task_items(t, s.limit, s.prompts_file) for t in s.tasks}
    encoded = {t: [loaded.encode(it["text"]) for it in its] for t, its in items.items()}
    if s.check_code and (note := missing_protections_note()):  # the layers of the sandbox this machine refused
        loaded.notes.append(note)
    if s.auto_k:  # the prompts must fit with one draft per step before the probe spends time choosing K
        _check_fits(loaded, items, encoded, s, [(lab, m, None) for lab, m, _ in labels])
    if s.auto_k and loaded.draft is not None:  # one K for every K method, from a probe on the first prompt
        from ..sim.calibrate import tune_k

        k, why = tune_k(loaded.target, loaded.draft, encoded[next(t for t in s.tasks if items[t])][0])
        s.ks = [k]
        loaded.notes.append(f"K = {k} for every drafting method, chosen by the simulator's cost model from a probe "
                            f"of this machine with the draft alone (sim.calibrate.tune_k): {why}")
        labels = s.labels()
    _check_fits(loaded, items, encoded, s, labels)
    if runs_on("vllm", (m for _, m, _ in labels)):
        from .vllm_engine import prepare

        prepare(loaded, labels, s)  # starts the vLLM workers now: a venv or engine problem fails before the warm-up
    runs: list[dict] = []
    results = _header(loaded, s, labels)
    if journal is not None:
        journal.start(results)
    first = next(t for t in s.tasks if items[t])
    for _ in range(s.warmup):  # excluded from the results
        for _label, method, k in labels:
            _run_one(loaded, method, k, encoded[first][0], s, seed=s.seed)
    total = sum(len(v) for v in items.values()) * s.repeats * len(labels)
    bar = tqdm(total=total, desc="bench", disable=not progress, file=sys.stderr)
    try:
        for ti, task in enumerate(s.tasks):
            for pi, (item, ids) in enumerate(zip(items[task], encoded[task])):
                ar_tokens = None
                for r in range(s.repeats):
                    shift = (pi * s.repeats + r) % len(labels)
                    order = labels[shift:] + labels[:shift]
                    for label, method, k in order:
                        seed = _seed(s, ti, pi, r)
                        _sync()
                        t0 = time.perf_counter()
                        toks, stats = _run_one(loaded, method, k, ids, s, seed)
                        _sync()
                        wall = time.perf_counter() - t0
                        rec = {"task": task, "prompt_id": item["id"], "label": label, "method": method, "k": k, "repeat": r,
                               "seed": seed, "prompt_tokens": len(ids), "wall_s": wall, "new_tokens": len(toks), "stats": stats}
                        if r == 0:
                            rec["tokens"] = toks
                            rec["text"] = loaded.tokenizer.decode(toks, skip_special_tokens=True)
                            if task == "math":
                                rec["correct"] = T.answer_matches(rec["text"], item["answer"])
                            if task == "code" and s.check_code:
                                rec["passed"] = check_code_reply(item["problem"], rec["text"])
                        runs.append(rec)
                        if journal is not None:
                            journal.add(rec)
                        bar.update(1)
                    if r == 0:
                        ar_tokens = next(x["tokens"] for x in runs[-len(labels):] if x["label"] == AR_LABEL)
                        for x in runs[-len(labels):]:
                            x["equal_ar"] = (x["tokens"] == ar_tokens) if s.temperature == 0 else None
                            del x["tokens"]
    except KeyboardInterrupt:
        results["runs"] = runs
        results["interrupted"] = True
        return results
    finally:
        bar.close()
    results["runs"] = runs
    results["per_prompt"] = prompt_table(runs)
    results["per_task"] = task_table(runs)
    results["repeat_spread"] = repeat_spread(runs)  # the run-to-run noise of identical work, quoted once per file
    results["complete"] = True
    if runs_on("vllm", (m for _, m, _ in labels)):
        from .vllm_engine import add_vllm_speedups

        add_vllm_speedups(results)
    return results


def _header(loaded: Loaded, s: BenchSettings, labels) -> dict:
    return {
        "format": RESULTS_FORMAT, "complete": False, "engine": "native",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine_info(), "git": _git_revision(), "pair": loaded.info, "device": str(loaded.device),
        "settings": asdict(s), "labels": [{"label": a, "method": m, "k": k} for a, m, k in labels],
        "definitions": "see specdec_lesson/bench/metrics.py: per-prompt medians over repeats; task speedup = "
                       "task tokens/s over ar's (throughput ratio); alpha, tau pooled",
        "notes": loaded.notes,
    }
