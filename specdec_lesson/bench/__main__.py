"""``python -m specdec_lesson.bench`` / ``specdec-bench``: run the benchmark or turn results into a report.

Examples::

    python -m specdec_lesson.bench --pair default --task code,math --k 1,2,4 --repeats 3
    python -m specdec_lesson.bench --pair tiny --limit 2 --max-new-tokens 8 --repeats 1 --out results.json
    python -m specdec_lesson.bench --prompts mine.jsonl --method ar,prompt-lookup,hf-prompt-lookup
    python -m specdec_lesson.bench --report benchmarks/results/bench_default_....json

Bad input prints one ``specdec-bench: error: ...`` line on stderr and exits with status 2, before any
model is loaded where it can be known then (flags, the prompts file, the ``--out`` path); Ctrl-C prints
one line too (exit 130), keeping the runs measured so far in a ``.partial.json`` file.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ..cli_args import UsageError, check_output_file, check_seed, check_threads

__all__ = ["main", "build_parser"]

DEFAULT_METHODS = "ar,chain,prompt-lookup,hf,hf-assisted,hf-prompt-lookup"


_UsageError = UsageError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, no usage dump
        raise _UsageError(message)


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _once(flag: str, items: list, text: str) -> list:
    """``items`` unless empty or with a repeat (a repeated method or K would be pooled into one row)."""
    if not items:
        raise _UsageError(f"{flag} needs at least one value, got {text!r}")
    dup = [x for i, x in enumerate(items) if x in items[:i]]
    if dup:
        raise _UsageError(f"{flag} lists {dup[0]!r} more than once ({text!r}); give each value once")
    return items


def _ks(text: str) -> list[int]:
    if text.strip().lower() == "auto":
        return [4]  # a placeholder until the probe (BenchSettings.auto_k) chooses
    try:
        ks = [int(x) for x in _csv(text)]
    except ValueError:
        raise _UsageError(f"--k takes integers >= 1 separated by commas (e.g. 4 or 1,2,4,8) or auto, got {text!r}") from None
    if not ks or any(k < 1 for k in ks):
        raise _UsageError(f"--k values must be >= 1, got {text!r}")
    return _once("--k", ks, text)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="specdec-bench", description="Speculative decoding benchmark: code (HumanEval) and math tasks.")
    g = p.add_argument_group("what to run")
    g.add_argument("--task", default=None, help="comma list of code, math, requests (free-form function requests), prompts "
                   "(default code,math; prompts with --prompts)")
    g.add_argument("--prompts", default=None, help="JSONL file, one {\"prompt\": ...} object per line")
    g.add_argument("--method", default=DEFAULT_METHODS,
                   help=f"comma list (default {DEFAULT_METHODS}; also hybrid, hybrid-suffix, suffix, tree, hybrid-tree)")
    g.add_argument("--k", default="4", help="drafts per step: one value, a sweep like 1,2,4,8, or auto (chosen by the "
                   "simulator's cost model from a probe of this machine)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--repeats", type=int, default=3)
    g.add_argument("--warmup", type=int, default=1, help="discarded calls of every method before timing")
    g.add_argument("--limit", type=int, default=None, help="at most this many prompts per task")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--check-code", action="store_true", help="run HumanEval tests on the replies (executes model code)")
    g.add_argument("--hybrid-lookup-k", type=int, default=8, help="hybrid: drafts per step when prompt lookup drafts")
    g = p.add_argument_group("models and devices")
    g.add_argument("--pair", default="default", help="default, tiny, llama3-8b-70b, qwen2.5-0.5b-7b")
    g.add_argument("--target", default=None, help="target model path or hub name (with --draft)")
    g.add_argument("--draft", default=None, help="draft model path or hub name (with --target)")
    g.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    g.add_argument("--draft-device", default=None, help="device of the draft (default: --device)")
    g.add_argument("--target-device-map", default=None, help="e.g. auto: shard the target with accelerate")
    g.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    g.add_argument("--engine", default="native", choices=["native", "vllm"])
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="results JSON (default benchmarks/results/bench_<pair>_<time>.json)")
    g.add_argument("--report", default=None, metavar="RESULTS.json", help="make the HTML report of a results file, run nothing")
    g.add_argument("--html", default=None, help="report path (default: the results path with .html)")
    g.add_argument("--no-progress", action="store_true")
    return p


def _check_device(name: str | None) -> None:
    import torch

    if name is None or name == "cpu":
        return
    if not (name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
        raise _UsageError(f"unknown device {name!r}; use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise _UsageError(f"device {name!r} asked for, but no CUDA device is available")
    if ":" in name and int(name[5:]) >= torch.cuda.device_count():
        raise _UsageError(f"device {name!r} does not exist ({torch.cuda.device_count()} CUDA devices)")


def _settings(a):
    from .runner import BenchSettings

    tasks = _once("--task", _csv(a.task), a.task) if a.task is not None else (["prompts"] if a.prompts else ["code", "math"])
    if a.prompts and "prompts" not in tasks:
        tasks.append("prompts")
    if "prompts" in tasks and not a.prompts:
        raise _UsageError("task 'prompts' needs --prompts FILE.jsonl")
    methods = _once("--method", _csv(a.method), a.method)
    check_seed(a.seed, "--seed")
    check_threads(a.threads, "--threads")
    if a.html and not a.report:
        raise _UsageError("--html goes with --report (a run writes no HTML page); make one afterwards with "
                          "--report RESULTS.json --html PAGE.html")
    s = BenchSettings(tasks=tasks, methods=methods, ks=_ks(a.k), auto_k=a.k.strip().lower() == "auto",
                      max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                      repeats=a.repeats, warmup=a.warmup, limit=a.limit, seed=a.seed, prompts_file=a.prompts,
                      check_code=a.check_code, hybrid_lookup_k=a.hybrid_lookup_k)
    s.validate()
    if a.prompts:
        from .tasks import load_prompts

        load_prompts(a.prompts)  # fail before loading any model
    return s


def _run(a) -> int:
    from . import report
    from .runner import load_models, load_results, run_benchmark

    if a.report:
        res = load_results(a.report)
        html = Path(a.html) if a.html else Path(a.report).with_suffix(".html")
        check_output_file(html, "--html")
        report.write_html(res, html)
        print(report.format_table(res))
        print(f"report written to {html}")
        return 0
    settings = _settings(a)
    _check_device(a.device)
    _check_device(a.draft_device)
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    if a.out:
        out = check_output_file(a.out, "--out")  # now, not after the run: a bad path must not cost the results
    else:
        out = Path("benchmarks/results") / f"bench_{a.pair if not a.target else 'custom'}_{stamp}.json"
        check_output_file(out, "the default results path (choose one with --out)", make_parent=True)
    if a.engine == "vllm":  # ours + their vLLM peers (vllm_engine.peer_methods); the venv is checked before loading
        from .vllm_engine import check_available, close_all, peer_methods

        settings.methods = peer_methods(settings.methods, a.method != DEFAULT_METHODS)
        settings.validate()
        check_available()
    loaded = load_models(a.pair, a.target, a.draft, device=a.device, draft_device=a.draft_device, dtype=a.dtype,
                         target_device_map=a.target_device_map)
    try:
        res = run_benchmark(loaded, settings, progress=not a.no_progress)
    finally:
        if a.engine == "vllm":
            close_all()
    if not res.get("complete"):
        partial = _save(res, out.with_name(out.stem + ".partial.json"))
        print(f"specdec-bench: interrupted; {len(res['runs'])} runs kept in {partial} (marked incomplete)", file=sys.stderr)
        return 130
    out = _save(res, out)
    print(report.format_table(res))
    for note in res.get("notes", []):
        print(f"note: {note}")
    print(f"results written to {out}")
    return 0


def _save(res: dict, path: Path) -> Path:
    """Write the results; if that fails even so (the disk filled up, the folder went away), write them
    to the temporary folder instead and say where: finished results are never lost."""
    from .runner import write_results

    try:
        return write_results(res, path)
    except OSError as exc:
        spare = Path(tempfile.gettempdir()) / path.name
        write_results(res, spare)
        print(f"specdec-bench: could not write {path} ({exc.strerror or exc}); the results were saved to {spare} instead",
              file=sys.stderr)
        return spare


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()  # HF generate's deprecation chatter would bury the results table
        hf_logging.disable_progress_bar()  # weight-loading bars; the benchmark has its own
        return _run(parser.parse_args(argv))
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"specdec-bench: error: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # while loading or warming up (an interrupted measurement returns its partial results)
        print("specdec-bench: interrupted before any run was measured; nothing was written", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
