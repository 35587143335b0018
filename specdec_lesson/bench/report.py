"""Benchmark report: a text table for the terminal and plotly charts saved as one small HTML file.

Charts: speedup over ``ar`` by task and method, alpha by task and method, the accepted-length
histograms, tokens/s.  The page works offline: it loads plotly.js from ``plotly.min.js`` beside it (written there
once, from the installed plotly package), so each page stays small (tens of kB) and no network is needed.
"""

from __future__ import annotations

import html
from pathlib import Path

__all__ = ["format_table", "make_figures", "write_html", "committed_results", "verify_hists", "drafts_per_step", "RESULTS_DIR"]

RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def _fmt(x, spec: str) -> str:
    if x is None:
        width = spec.split(".")[0]
        return "-".rjust(int(width)) if width.isdigit() else "-"
    return format(x, spec)


def _span(pair) -> str:
    """``[lo, hi]`` as a fixed-width ``lo-hi`` (11 characters), ``-`` when absent."""
    return f"{pair[0]:5.2f}-{pair[1]:<5.2f}" if pair else "-".rjust(11)


def alpha_and_utilisation(row: dict) -> tuple[float | None, float | None]:
    """``(alpha, utilisation)`` of a per-task or per-prompt row.  Rows written before the course had one alpha
    carry no ``utilisation`` key, and their ``alpha`` was accepted / proposed: it is returned as the utilisation,
    with alpha unknown (None), never relabelled."""
    if "utilisation" in row:
        return row.get("alpha"), row["utilisation"]
    return None, row.get("alpha")


def format_table(results: dict) -> str:
    """Per task and method: n prompts x repeats, tokens/s, speedup (the median over repeats of the paired throughput
    ratio over ar, with its two-level bootstrap interval, nominal 95%: ``bench.paired``; then the median and range of
    the per-prompt speedups), alpha (per-token
    acceptance, accepted / (accepted + rejections)), utilisation (accepted / proposed drafts), tau,
    target forwards per token, accuracy / pass@1 and greedy equality with ar."""
    head = (f"{'task':8} {'method':22} {'n':>3} {'rep':>3} {'tok/s':>8} {'speedup':>8} {'95% CI':>11} {'med':>6} {'range':>11} "
            f"{'alpha':>6} {'util':>5} {'tau':>5} {'fwd/tok':>7} {'acc':>5} {'pass':>5} {'=ar':>5}")
    lines = [head, "-" * len(head)]
    for r in results["per_task"]:
        alpha, util = alpha_and_utilisation(r)
        lines.append(
            f"{r['task']:8} {r['label']:22} {r['prompts']:>3} {r.get('repeats') or '-':>3} "
            f"{_fmt(r['tokens_per_s'], '8.2f')} {_fmt(r['speedup'], '7.2f')}x "
            f"{_span(r.get('speedup_ci'))} {_fmt(r['speedup_median'], '5.2f')}x {_span(r.get('speedup_range'))} "
            f"{_fmt(alpha, '6.3f')} {_fmt(util, '5.2f')} "
            f"{_fmt(r['tau'], '5.2f')} "
            f"{_fmt(r['target_forwards_per_token'], '7.3f')} {_fmt(r['accuracy'], '5.2f')} {_fmt(r['pass_at_1'], '5.2f')} "
            f"{_fmt(r['equal_ar_rate'], '5.2f')}"
        )
    return "\n".join(lines)


def make_figures(results: dict) -> list:
    """plotly figures: speedup and alpha per task/method, accepted-length histograms, tokens/s."""
    import plotly.graph_objects as go

    rows = [dict(r, alpha=alpha_and_utilisation(r)[0]) for r in results["per_task"]]
    tasks = sorted({r["task"] for r in rows})
    labels = [lab["label"] for lab in results["labels"] if any(r["label"] == lab["label"] for r in rows)]

    def bars(key: str, title: str, ytitle: str, skip_ar: bool = False):
        fig = go.Figure()
        for label in labels:
            if skip_ar and label == "ar":
                continue
            ys = [next((r[key] for r in rows if r["task"] == t and r["label"] == label), None) for t in tasks]
            if all(y is None for y in ys):
                continue
            fig.add_bar(name=label, x=tasks, y=ys, text=[_fmt(y, ".2f") for y in ys], textposition="outside")
        fig.update_layout(title=title, barmode="group", yaxis_title=ytitle, xaxis_title="task", height=380)
        return fig

    figs = [bars("speedup", "Speedup over plain decoding (ar), same run", "tokens/s ratio")]
    figs[0].add_hline(y=1.0, line_dash="dash", line_color="gray")
    figs.append(bars("alpha", "Per-token acceptance alpha = accepted / (accepted + rejections)", "alpha", skip_ar=True))
    hist = go.Figure()
    for r in rows:
        h = r.get("accept_hist")
        if not h or r["label"] == "ar" or sum(h) == 0:
            continue
        total = sum(h)
        hist.add_bar(name=f"{r['task']} {r['label']}", x=list(range(len(h))), y=[c / total for c in h])
    hist.update_layout(title="Accepted drafts per verify step (fraction of steps)", barmode="group",
                       xaxis_title="accepted drafts n", yaxis_title="fraction", height=380)
    figs.append(hist)
    figs.append(bars("tokens_per_s", "Throughput", "new tokens / s"))
    return figs


def write_html(results: dict, path: str | Path) -> Path:
    """One HTML page: settings, the table, the charts (plotly.js from ``plotly.min.js`` beside the page, written
    there when missing or different: no network needed); written atomically (``results.write_text_atomic``), so an
    interrupted write never leaves a truncated page or file."""
    from plotly.offline import get_plotlyjs

    from .results import write_text_atomic

    path = Path(path)
    js, script = path.parent / "plotly.min.js", get_plotlyjs()
    if not js.is_file() or js.read_text(encoding="utf-8") != script:
        write_text_atomic(js, script, "plotly.js beside the report")
    parts = []
    for i, fig in enumerate(make_figures(results)):
        parts.append(fig.to_html(full_html=False, include_plotlyjs="directory" if i == 0 else False))
    pair, m, s = results["pair"], results["machine"], results["settings"]
    meta = (f"pair: {pair.get('target')} / draft {pair.get('draft')} | device {results.get('device')} | "
            f"torch {m.get('torch')}, transformers {m.get('transformers')} | {m.get('processor')}, {m.get('cpu_count')} CPUs "
            f"{', '.join(m.get('gpus') or [])} | git {(results.get('git') or {}).get('revision')} | "
            f"max_new_tokens {s['max_new_tokens']}, temperature {s['temperature']}, repeats {s['repeats']}")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in results.get("notes", []))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>specdec benchmark</title></head><body>"
            f"<h1>Speculative decoding benchmark</h1><p>{html.escape(meta)}</p><ul>{notes}</ul>"
            f"<pre>{html.escape(format_table(results))}</pre>{''.join(parts)}</body></html>")
    return write_text_atomic(path, page, "the report")


def _counted_runs(results: dict, task: str, label: str, first_repeat_only: bool | None) -> list[dict]:
    """The runs of one (task, method) with stats; greedy files (by default) keep repeat 0 alone, since greedy repeats
    replay the same tokens and pooling them would count each step several times."""
    if first_repeat_only is None:
        first_repeat_only = results["settings"].get("temperature", 0) == 0
    return [r for r in results["runs"] if r["task"] == task and r["label"] == label and r.get("stats")
            and not (first_repeat_only and r["repeat"] != 0)]


def verify_hists(results: dict, task: str, label: str, first_repeat_only: bool | None = None) -> dict[int, list[int]]:
    """The raw verification outcomes ``{K': [steps with n = 0..K' accepted]}`` of one (task, method) in a results
    file, summed over its runs: the sample of :func:`specdec_lesson.stats.acceptance_independence`.

    ``first_repeat_only`` (default: when the run is greedy) keeps repeat 0 alone: greedy repeats replay the same
    tokens, so pooling them would count each outcome several times.  Files written before the runner stored
    ``verify_hist`` give {}."""
    out: dict[int, list[int]] = {}
    for r in _counted_runs(results, task, label, first_repeat_only):
        for k, h in (r["stats"].get("verify_hist") or {}).items():
            acc = out.setdefault(int(k), [0] * (int(k) + 1))
            for n, c in enumerate(h):
                acc[n] += c
    return dict(sorted(out.items()))


def drafts_per_step(results: dict, task: str, label: str, first_repeat_only: bool | None = None) -> dict[int, float]:
    """What a method chose: the share of its decode steps that drafted K' tokens, ``{K': share}`` (K' = 0: a plain
    step, no drafts), for one (task, method) of a results file, pooled over its runs.  The steps with drafts are
    those of :func:`verify_hists`; the rest of the run's ``row_steps`` drafted nothing.  ``first_repeat_only`` as
    there.  {} when the file stores no ``verify_hist``."""
    runs = [r for r in _counted_runs(results, task, label, first_repeat_only) if "verify_hist" in r["stats"]]
    steps = sum(r["stats"]["row_steps"] for r in runs)
    if not steps:
        return {}
    counts = {k: sum(h) for k, h in verify_hists(results, task, label, first_repeat_only).items()}
    counts[0] = steps - sum(counts.values())
    return {k: counts[k] / steps for k in sorted(counts)}


def committed_results(folder: str | Path = RESULTS_DIR) -> list[dict]:
    """Every complete results file ``bench_*.json`` in ``folder``, newest first (by ``created``);
    interrupted (``.partial``) or unreadable files are skipped."""
    from .results import load_results

    found = []
    for path in sorted(Path(folder).glob("bench_*.json")):
        try:
            res = load_results(path)
        except ValueError:
            continue
        res["_path"] = str(path)
        found.append(res)
    return sorted(found, key=lambda r: r.get("created", ""), reverse=True)
