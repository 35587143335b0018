"""Command-line demo: ``python -m specdec_lesson``.

Loads the offline default pair (SmolLM2-135M-Instruct and the project's distilled draft),
generates a completion for a code prompt, a math prompt and a chat question with plain decoding and with
speculative decoding (the draft alone, the draft + prompt lookup: ``hybrid.HybridDrafter``, that hybrid with K
chosen per step, 0 = a plain step: ``adaptive.AdaptiveDrafter``, which says what it chose and why, and one tree of
draft and lookup candidates sized per step: ``tree.adaptive.AdaptiveTree``, which says what it chose), and prints
tokens/s, the speedup, acceptance statistics and the text.  ``--show`` also prints each chain run step by step in
colour (``lab.render``): accepted drafts green, rejected drafts red and struck through, the target's correction or
bonus token blue.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .cli_args import OneLineParser, UsageError, check_float, check_int, check_seed, check_threads

CODE_PROMPT = '''def running_max(values: list[int]) -> list[int]:
    """Return a list whose i-th item is the largest of values[0..i].
    >>> running_max([1, 3, 2, 5, 4])
    [1, 3, 3, 5, 5]
    """
'''
MATH_PROMPT = (
    "A baker makes 12 trays of muffins with 8 muffins on each tray. She sells 67 muffins "
    "and gives 9 to her neighbours. How many muffins does she have left?"
)


MAX_NEW_TOKENS = 4096  # prompt (about 130 tokens) + reply + one step's drafts must fit SmolLM2's 8192 positions
MAX_K = 64
TREE_WIDTH = 17  # the adaptive tree's widest verify: the root and up to 16 nodes
PROG = "python -m specdec_lesson"
_COSTS: dict = {}  # the adaptive policy's measured step costs, per pair and k_max


def _parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=__doc__.split("\n\n")[1])
    ap.add_argument("--max-new-tokens", type=int, default=96,
                    help=f"tokens to generate per prompt, 1..{MAX_NEW_TOKENS} (default 96)")
    ap.add_argument("--k", type=int, default=None, help=f"drafts per step, 1..{MAX_K} (default: the draft's tuned K)")
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default); a finite number >= 0")
    ap.add_argument("--seed", type=int, default=0, help="an integer >= 0")
    ap.add_argument("--threads", type=int, default=None, help="torch threads, 1..the number of CPUs (default: torch's choice)")
    ap.add_argument("--show", action="store_true", help="print each speculative run's steps in colour (ANSI): accepted "
                    "drafts green, rejected drafts red and struck through, the target's correction or bonus blue")
    return ap


def _check(args) -> None:
    """Every argument, before anything is loaded (UsageError naming the flag)."""
    check_int(args.max_new_tokens, "--max-new-tokens", lo=1, hi=MAX_NEW_TOKENS)
    check_int(args.k, "--k", lo=1, hi=MAX_K, allow_none=True)
    check_float(args.temperature, "--temperature", lo=0.0)
    check_seed(args.seed, "--seed")
    check_threads(args.threads, "--threads")


def _load():
    from .models import load_default_target

    try:
        from .drafters.pair import load_default_pair
    except ImportError:
        load_default_pair = None
    if load_default_pair is not None:
        pair = load_default_pair()
        return pair.target, pair.draft, pair.tokenizer, "distilled draft"
    from .drafters import PromptLookupDrafter

    target, tok = load_default_target()
    return target, PromptLookupDrafter(), tok, "prompt lookup (no distilled draft installed)"


def _status(text: str) -> None:
    """A status line on stderr before a step that may take long (minutes on a busy machine)."""
    print(f"[specdec] {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """The demo; bad input, a model that cannot load or computes NaN, and Ctrl-C each print one line (exit 2, 1,
    130)."""
    from .sampling import NonFiniteLogitsError

    try:
        args = _parser().parse_args(argv)
        _check(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    try:
        return _demo(args)
    except NonFiniteLogitsError as exc:  # damaged weights: never print garbage tokens as if all were well
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _demo(args) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    from .bench.tasks import chat, format_code_prompt, format_math_prompt, task_items
    from .lab import Trace, render_ansi
    from .sim.calibrate import tune_k
    from .speculative import autoregressive_generate, speculative_generate

    t0 = time.perf_counter()
    _status("loading SmolLM2-135M-Instruct and its draft (the first run converts the weights: about 30 s) ...")
    try:
        target, draft, tok, kind = _load()
    except Exception as exc:  # a read-only or full cache folder, a damaged cache or draft file: one line, no traceback
        msg = " ".join(str(exc).split())
        msg = msg if isinstance(exc, (RuntimeError, ValueError, OSError)) and msg else f"{type(exc).__name__}: {msg}"
        print(f"{PROG}: error: cannot load the default pair: {msg}", file=sys.stderr)
        return 1
    print(f"loaded SmolLM2-135M-Instruct + {kind} in {time.perf_counter() - t0:.1f} s; "
          f"temperature = {args.temperature}, {torch.get_num_threads()} threads")
    d = getattr(target, "dispatch_profile", None)
    if d and d["plain_ms"]:
        r = d["plain_rows_max"]
        where = f"plain up to {r} rows, pre-packed beyond" if r else "pre-packed at every width"
        fwd = "lean forward" if d.get("forward") == "lean" else "Hugging Face forward"
        print(f"fastest form on this CPU ({fwd}): one-token forward {d['plain_ms'][1]:.1f} ms plain, "
              f"{d['packed_ms'][1]:.1f} ms pre-packed -> {where} (plain decoding and verification alike)")
    prompts = {
        "code": format_code_prompt({"prompt": CODE_PROMPT}),
        "math": format_math_prompt({"question": MATH_PROMPT}),
        "chat": task_items("chat", 1)[0]["text"],  # a plain question, held out of every training set (bench.chat)
    }
    if args.k is not None:
        k = args.k
        print(f"K = {k} (--k)")
    else:
        probe = tok(chat(tok, prompts["code"]), return_tensors="pt").input_ids
        _status("choosing K: timing a short speculative run on this machine ...")
        k, why = tune_k(target, draft, probe)
        print(f"K = {k}, chosen by the simulator's cost model from a probe of this machine: {why}")
    from .drafters.adaptive import AdaptiveDrafter, measure_step_costs

    adaptive = getattr(draft, "accepts_foreign_proposals", False)  # the adaptive policy wraps the hybrid
    k_max = max(8, k)  # the adaptive policy's cap: it picks 0..k_max drafts per step (lookup steps too)
    if adaptive:
        key = (repr(getattr(target, "config", None)), type(draft).__name__, k_max)
        if key not in _COSTS:  # once per process and pair: the policy's choices then depend on the text alone
            _status("adaptive policy: timing T(n) and the draft's cost per step on this machine (a few seconds) ...")
            probe_ids = tok(chat(tok, prompts["code"]), return_tensors="pt").input_ids
            _COSTS[key] = measure_step_costs(target, draft, probe_ids, k_max, max_width=max(k_max + 1, TREE_WIDTH))
        costs = _COSTS[key]
        print(f"adaptive policy's costs: T(1) {costs.T(1) * 1e3:.1f} ms, T({k_max + 1})/T(1) = "
              f"{costs.T(k_max + 1) / costs.T(1):.2f}, draft a = {costs.draft_first * 1e3:.1f} ms + b = "
              f"{costs.draft_next * 1e3:.1f} ms per further token")
    best: dict[str, tuple[str, float]] = {}
    for name, text in prompts.items():
        ids = tok(chat(tok, text), return_tensors="pt").input_ids
        g = torch.Generator().manual_seed(args.seed)
        _status(f"{name} prompt: plain decoding, then speculative decoding, {args.max_new_tokens} tokens each ...")
        autoregressive_generate(target, ids, 4)  # warm-up
        t = time.perf_counter()
        ar, _ = autoregressive_generate(target, ids, args.max_new_tokens, args.temperature, generator=g)
        t_ar = time.perf_counter() - t
        runs = [("speculative decoding", draft)]
        if getattr(draft, "accepts_foreign_proposals", False):
            from .drafters.hybrid import HybridDrafter

            runs.append(("+ prompt lookup     ", HybridDrafter(draft, lookup_k=max(8, k))))
            runs.append(("adaptive K per step ", AdaptiveDrafter(HybridDrafter(draft, lookup_k=k_max), costs, k_max)))
        n_ar = len(ar[0])
        print(f"\n=== {name} prompt ===")
        print(f"plain decoding      : {n_ar} tokens in {t_ar:.2f} s = {n_ar / t_ar:6.1f} tokens/s")
        for label, drafter in runs:
            g = torch.Generator().manual_seed(args.seed)
            trace = Trace() if args.show else None
            t = time.perf_counter()
            sp, st = speculative_generate(target, drafter, ids, args.max_new_tokens, k=k, temperature=args.temperature,
                                          generator=g, trace=trace)
            t_sp = time.perf_counter() - t
            n_sp = len(sp[0])
            gain = t_ar / n_ar / (t_sp / n_sp)
            print(f"{label}: {n_sp} tokens in {t_sp:.2f} s = {n_sp / t_sp:6.1f} tokens/s "
                  f"(speedup {gain:.2f}x, alpha {st.alpha:.2f}, tau {st.tau:.2f} tokens/forward)")
            if name not in best or gain > best[name][1]:
                best[name] = (label.strip(), gain)
            if args.temperature == 0:
                print(f"greedy outputs identical: {torch.equal(ar[0], sp[0])}")
            if isinstance(drafter, AdaptiveDrafter):
                print(f"adaptive policy: {drafter.summary()}")
            if trace is not None:
                print(f"--- step by step: {label.strip()} ---\n{render_ansi(trace, tok, stats=True)}")
        if adaptive:  # one tree of draft and lookup candidates, its size chosen per step (batch size 1)
            gain = _tree_run(target, draft, ids, args, costs, t_ar / n_ar, ar)
            if gain > best[name][1]:
                best[name] = ("adaptive tree", gain)
        print("--- speculative output ---")
        print(tok.decode(sp[0], skip_special_tokens=True).strip())
    print("\nbest method here, over plain decoding in its fastest form on this machine: "
          + "; ".join(f"{name} {label} {gain:.2f}x" for name, (label, gain) in best.items())
          + " (one prompt each, one run: benchmarks/results/ has medians over prompts and repeats)")
    return 0


def _tree_run(target, draft, ids, args, costs, s_per_token_ar: float, ar) -> float:
    """The adaptive tree on one prompt: its line of the demo (speed, tau, what it chose); returns its speedup.  Its
    lookup is prompt lookup, as in the chain runs above (the bench's ``adaptive-tree`` also searches the target's
    past answers)."""
    from .tree import AdaptiveTree, HybridTreeDrafter, tree_generate
    from .tree.adaptive import describe_choices

    drafter = HybridTreeDrafter(draft)
    g = torch.Generator().manual_seed(args.seed)
    t = time.perf_counter()
    out, st = tree_generate(target, drafter, ids, args.max_new_tokens, tree=AdaptiveTree(costs),
                            temperature=args.temperature, generator=g)
    t_sp = time.perf_counter() - t
    n_sp = len(out[0])
    gain = s_per_token_ar / (t_sp / n_sp)
    print(f"adaptive tree       : {n_sp} tokens in {t_sp:.2f} s = {n_sp / t_sp:6.1f} tokens/s "
          f"(speedup {gain:.2f}x, tau {st.tau:.2f} tokens/forward)")
    if args.temperature == 0:
        print(f"greedy outputs identical: {torch.equal(ar[0], out[0])}")
    print(f"adaptive tree: {describe_choices(drafter.choices)}\n{drafter.explain()}")
    return gain


if __name__ == "__main__":
    sys.exit(main())
