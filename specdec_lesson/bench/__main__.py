"""``python -m specdec_lesson.bench`` / ``specdec-bench``: run the benchmark or turn results into a report.

Examples::

    python -m specdec_lesson.bench --pair default --task code,math --k 1,2,4 --repeats 3
    python -m specdec_lesson.bench --pair tiny --limit 2 --max-new-tokens 8 --repeats 1 --out results.json
    python -m specdec_lesson.bench --prompts mine.jsonl --method ar,prompt-lookup,hf-prompt-lookup
    python -m specdec_lesson.bench --report benchmarks/results/bench_default_....json

Bad input prints one ``specdec-bench: error: ...`` line on stderr and exits with status 2, before any
model is loaded where it can be known then (flags, conflicting flags, the prompts file, the ``--out`` path, a
prompt longer than the target's context, read from the tokenizer and config alone where they are on disk).

Nothing is lost or overwritten: the results path is reserved at the start by creating its run journal
``<out>.partial.jsonl`` exclusively (``bench.journal``), so a second run with the same ``--out`` fails at once; an
existing finished results file is overwritten only with ``--force``; the ``--prompts`` file and, with ``--report``,
the results file are never an output.  Every measured run is appended to the journal (fsynced) as it finishes, so
even a killed process keeps them; the results file is written atomically at the end and the journal removed.
Ctrl-C or SIGTERM (kill, timeout, a scheduler) prints one line (exit 130 or 143), keeping the runs measured so far
in a ``.partial.json`` file marked incomplete (which ``--report`` refuses).  Default results names carry
microseconds and, if taken even so, a counter.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from ..cli_args import UsageError, check_output_file, check_seed, check_threads, same_file
from .journal import free_name, sigterm_as_interrupt

__all__ = ["main", "build_parser"]

DEFAULT_METHODS = "ar,adaptive,chain,prompt-lookup,hf,hf-assisted,hf-prompt-lookup"


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


def _ks(text: str | None) -> list[int]:
    if text is None:
        return [4]  # the default
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
    g.add_argument("--task", default=None, help="comma list of code, math, requests (free-form function requests), "
                   "chat (general chat questions), prompts (default code,math; prompts with --prompts)")
    g.add_argument("--prompts", default=None, help="JSONL file, one {\"prompt\": ...} object per line")
    g.add_argument("--method", default=DEFAULT_METHODS,
                   help=f"comma list (default {DEFAULT_METHODS}; also hybrid, hybrid-suffix, suffix, tree, hybrid-tree, "
                        "adaptive-tree)")
    g.add_argument("--k", default=None, help="drafts per step of the K methods: one value (default 4), a sweep like "
                   "1,2,4,8, or auto (chosen by the simulator's cost model from a probe of this machine)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=None, help="with --temperature > 0")
    g.add_argument("--top-p", type=float, default=None, help="with --temperature > 0")
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
    g.add_argument("--target-device-map", default=None, help="e.g. auto: shard the target with accelerate (hub pairs "
                   "and --target/--draft only)")
    g.add_argument("--dtype", default="auto", help="auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16")
    g.add_argument("--engine", default="native", choices=["native", "vllm"], help="vllm: add vLLM's peers of the "
                   "methods (the vllm* methods need it)")
    g.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    g = p.add_argument_group("output")
    g.add_argument("--out", default=None, help="results JSON (default benchmarks/results/bench_<pair>_<time>.json); "
                   "reserved at the start (its journal <out>.partial.jsonl holds every run measured so far)")
    g.add_argument("--report", default=None, metavar="RESULTS.json", help="make the HTML report of a results file, run nothing")
    g.add_argument("--html", default=None, help="report path (default: the results path with .html; never the results "
                   "file itself)")
    g.add_argument("--force", action="store_true", help="overwrite an existing finished results file at --out (without "
                   "it a run refuses, before loading anything)")
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
    """The run's settings from the flags, every check that needs no model: values, conflicting flags (each would
    be ignored yet recorded as used), the pair name (before any path is made from it), the prompts file."""
    from .loading import check_pair_args
    from .methods import k_methods
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
    auto_k = a.k is not None and a.k.strip().lower() == "auto"
    s = BenchSettings(tasks=tasks, methods=methods, ks=_ks(a.k), auto_k=auto_k,
                      max_new_tokens=a.max_new_tokens, temperature=a.temperature, top_k=a.top_k, top_p=a.top_p,
                      repeats=a.repeats, warmup=a.warmup, limit=a.limit, seed=a.seed, prompts_file=a.prompts,
                      check_code=a.check_code, hybrid_lookup_k=a.hybrid_lookup_k)
    s.validate()
    if a.engine == "vllm":  # ours + their vLLM peers (vllm_engine.peer_methods)
        from .vllm_engine import peer_methods

        s.methods = peer_methods(s.methods, a.method != DEFAULT_METHODS)
        s.validate()
    if s.temperature == 0 and (a.top_k is not None or a.top_p is not None):
        flag = "--top-k" if a.top_k is not None else "--top-p"
        raise _UsageError(f"{flag} shapes sampling, and --temperature 0 decodes greedily (it would be ignored): drop "
                          f"{flag}, or sample with --temperature > 0")
    if a.k is not None and not set(s.methods) & k_methods():
        raise _UsageError(f"--k {a.k} sets the drafts per step of the K methods ({', '.join(sorted(k_methods()))}), and "
                          f"none of {','.join(s.methods)} is one: drop --k, or add one to --method")
    check_pair_args(a.pair, a.target, a.draft, a.dtype, a.target_device_map)
    if a.prompts:
        from .tasks import load_prompts

        load_prompts(a.prompts)  # fail before loading any model
    return s


def _precheck_fits(a, s) -> None:
    """Refuse a prompt longer than the target's context before loading the models: from the target's tokenizer
    and config alone (a second or so), where both are on disk (the default pair's converted cache, a local
    ``--target`` folder, a hub model in the local cache).  Elsewhere (the tiny pair loads in no time; a hub model
    not cached) the same check runs after the load, before any probe or warm-up."""
    from . import tasks as T
    from .loading import PAIRS
    from .runner import check_fits, context_limit

    if a.target:
        source = a.target
    elif a.pair == "default":
        from ..models import default_target_cache_dir

        source = default_target_cache_dir()
        if not (Path(source) / "config.json").is_file():
            return  # not converted yet: the load converts it, then checks
    elif PAIRS.get(a.pair):
        source = PAIRS[a.pair][0]
    else:
        return
    try:
        from transformers import AutoConfig, AutoTokenizer

        local = Path(source).is_dir()
        cfg = AutoConfig.from_pretrained(source, local_files_only=not local)
        tok = AutoTokenizer.from_pretrained(source, local_files_only=not local)
    except Exception:  # not on disk, or unreadable: the loader reports it with its own message
        return
    items = {t: T.task_items(t, s.limit, s.prompts_file) for t in s.tasks}
    encoded = {t: [tok(T.chat(tok, it["text"]), add_special_tokens=False)["input_ids"] for it in its]
               for t, its in items.items()}
    labels = [(lab, m, None if s.auto_k else k) for lab, m, k in s.labels()]
    check_fits(context_limit(cfg), items, encoded, s, labels)


def _reserve_out(a):
    """The results path and its run journal, created exclusively now, before any model is loaded: a second run
    with the same --out fails at once, an existing finished file needs --force, the prompts file is never an output;
    a default name (microseconds) that is taken even so gets a counter."""
    from .journal import RunJournal

    if a.out:
        out = check_output_file(a.out, "--out")  # now, not after the run: a bad path must not cost the results
        if a.prompts and same_file(out, a.prompts):
            raise _UsageError(f"--out {out} is the --prompts file: the results would replace your prompts; choose "
                              "another --out")
        return out, RunJournal.reserve(out, force=a.force)
    now = datetime.now(UTC)
    base = f"bench_{a.pair if not a.target else 'custom'}_{now.strftime('%Y%m%dT%H%M%S')}_{now.microsecond:06d}Z"
    folder = Path("benchmarks/results")
    check_output_file(folder / f"{base}.json", "the default results path (choose one with --out)", make_parent=True)
    return RunJournal.reserve_free(folder / f"{base}.json")


def _report(a) -> int:
    from . import report
    from .results import is_results_file
    from .runner import load_results

    res = load_results(a.report)
    src = Path(a.report)
    html = Path(a.html) if a.html else src.with_suffix(".html")
    if same_file(html, src):
        other = src.with_suffix(".html") if src.suffix != ".html" else src.with_name(src.stem + "_report.html")
        raise _UsageError(f"--html {html} is the results file itself: the page would replace the results; give another "
                          f"path, such as --html {other}")
    if is_results_file(html):
        raise _UsageError(f"--html {html} is a benchmark results file: the page would replace its results; give "
                          "another path ending in .html")
    check_output_file(html, "--html")
    report.write_html(res, html)
    print(report.format_table(res))
    print(f"report written to {html}")
    return 0


def _stopped(got: list[int]) -> tuple[str, int]:
    return ("terminated (SIGTERM)", 128 + signal.SIGTERM) if got else ("interrupted", 130)


def _run(a, got: list[int]) -> int:
    from .methods import runs_on
    from .runner import load_models, run_benchmark

    if a.report:
        return _report(a)
    settings = _settings(a)
    _check_device(a.device)
    _check_device(a.draft_device)
    if a.threads is not None:
        import torch

        torch.set_num_threads(a.threads)
    if a.engine == "vllm" or runs_on("vllm", settings.methods):  # the venv, before loading
        from .vllm_engine import check_available

        check_available()
    _precheck_fits(a, settings)
    out, journal = _reserve_out(a)
    try:
        res = _measure(a, settings, journal, load_models, run_benchmark)
        complete = bool(res.get("complete"))
        partial = out.with_name(out.stem + ".partial.json")
        saved = _save(res, out if complete else free_name(partial)) if complete or res["runs"] else None
    except BaseException as exc:
        if journal.count == 0:  # nothing measured: nothing to keep
            journal.discard()
            raise
        journal.close()
        kept = f"the {journal.count} runs measured so far are kept in {journal.path} (one JSON line each)"
        if isinstance(exc, KeyboardInterrupt):
            what, code = _stopped(got)
            print(f"specdec-bench: {what}; {kept}", file=sys.stderr)
            return code
        if isinstance(exc, Exception):
            raise RuntimeError(f"{' '.join(str(exc).split()) or type(exc).__name__}; {kept}") from exc
        raise
    journal.discard()  # the runs are in ``saved`` now
    if not complete:
        what, code = _stopped(got)
        print(f"specdec-bench: {what}; {len(res['runs'])} runs kept in {saved} (marked incomplete)" if saved else
              f"specdec-bench: {what} before any run was measured; nothing was written", file=sys.stderr)
        return code
    from . import report

    print(report.format_table(res))
    for note in res.get("notes", []):
        print(f"note: {note}")
    print(f"results written to {saved}")
    return 0


def _measure(a, settings, journal, load_models, run_benchmark) -> dict:
    loaded = load_models(a.pair, a.target, a.draft, device=a.device, draft_device=a.draft_device, dtype=a.dtype,
                         target_device_map=a.target_device_map)
    try:
        return run_benchmark(loaded, settings, progress=not a.no_progress, journal=journal)
    finally:
        if a.engine == "vllm":
            from .vllm_engine import close_all

            close_all()


def _save(res: dict, path: Path) -> Path:
    """Write the results; if that fails even so (the disk filled up, the folder went away), write them
    to the temporary folder instead and say where: finished results are never lost."""
    from .runner import write_results

    try:
        return write_results(res, path)
    except OSError as exc:
        spare = free_name(Path(tempfile.gettempdir()) / path.name)
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
        with sigterm_as_interrupt() as got:
            try:
                return _run(parser.parse_args(argv), got)
            except KeyboardInterrupt:  # while loading or warming up (a measurement returns its partial results)
                what, code = _stopped(got)
                print(f"specdec-bench: {what} before any run was measured; nothing was written", file=sys.stderr)
                return code
    except (ValueError, RuntimeError, OSError, ImportError) as exc:
        msg = " ".join(str(exc).split()) or type(exc).__name__
        print(f"specdec-bench: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
