"""The published tables, made from the committed results files: the README's results matrix, its picture, and
one table per bench file for ``docs/results.md``.

Nothing here is typed by hand: ``python benchmarks/ledger.py`` regenerates the marked blocks of README.md and
docs/results.md and the SVG chart from ``benchmarks/results/``, and ``tests/test_ledger.py`` fails when a marked
block no longer matches its file.  A block is delimited by ``<!-- ledger:NAME -->`` and ``<!-- /ledger:NAME -->``.
"""

from __future__ import annotations

import html
import re

__all__ = ["STYLES", "MATRIX_METHODS", "machine_line", "draft_line", "matrix", "file_table", "matrix_svg", "replace_block",
           "read_block"]

STYLES = ("code", "requests", "math", "chat")  # the order of columns; a style absent from a file is left out
MATRIX_METHODS = (  # (label in the results file, what the reader calls it)
    ("adaptive-tree", "**adaptive tree** (default for one prompt: draft and lookup candidates sized per step)"),
    ("adaptive-k4", "adaptive chain (default for batches: the hybrid, K chosen per step)"),
    ("chain-k4", "draft alone (`chain`, K = 4)"),
    ("prompt-lookup-k4", "prompt lookup (`prompt-lookup`, K = 4)"),
    ("hybrid-k4", "draft + prompt lookup (`hybrid`, K = 4)"),
    ("hybrid-tree", "one tree of draft and lookup candidates (`hybrid-tree`)"),
    ("hf-prompt-lookup-k4", "Hugging Face prompt lookup (K = 4)"),
    ("hf", "Hugging Face `generate`"),
)


def _cell(row: dict | None) -> str:
    if not row or row.get("speedup") is None:
        return "-"
    ci = row.get("speedup_ci")
    return f"{row['speedup']:.2f}x [{ci[0]:.2f}-{ci[1]:.2f}]" if ci else f"{row['speedup']:.2f}x"


def _styles(results: dict) -> list[str]:
    present = {r["task"] for r in results["per_task"]}
    return [s for s in STYLES if s in present] + sorted(present - set(STYLES))


def machine_line(results: dict) -> str:
    """``AMD EPYC (avx2, avx512f), 2 threads, torch 2.13.0`` from a results file's ``machine``."""
    m = results.get("machine") or {}
    isa = ", ".join(m.get("isa") or [])
    cpu = m.get("cpu") or m.get("processor") or "unknown CPU"
    kind = f" ({m['kind']})" if m.get("kind") else ""
    return f"{cpu}{kind}{f' ({isa})' if isa else ''}, {m.get('torch_threads', '?')} threads, torch {m.get('torch', '?')}"


def draft_line(results: dict) -> str:
    """Which draft made a results file: ``draft weights 21c0bba8c460bd6f (output subset 2048, 6900 training steps)``
    from its ``pair.draft_weights`` (``drafters.eagle.draft_identity``); files made before 2026-12-06 do not say."""
    pair = results.get("pair") or {}
    w = pair.get("draft_weights")
    if not w:
        return "draft not recorded in the file (a run before 2026-12-06)" if pair.get("pair") == "default" else ""
    if w.get("missing"):
        return "no draft weights"
    return f"draft weights {w['sha256_16']} (output subset {w['n_sub']}, {w['steps_total']} training steps)"


def _n(results: dict, style: str) -> str:
    rows = [r for r in results["per_task"] if r["task"] == style and r["label"] != "ar"]
    p = max((r["prompts"] for r in rows), default=0)
    rep = max((r.get("repeats") or 0 for r in rows), default=0)
    return f"{p}x{rep}"


def matrix(results: dict, methods=MATRIX_METHODS) -> str:
    """Method x style: speedup over plain decoding (``ar``) [nominal 95% interval], as a markdown table."""
    styles = _styles(results)
    rows = {(r["task"], r["label"]): r for r in results["per_task"]}
    head = "| method | " + " | ".join(f"{s} (n = {_n(results, s)})" for s in styles) + " |"
    lines = [head, "|---|" + "---|" * len(styles)]
    for label, name in methods:
        if not any((s, label) in rows for s in styles):
            continue
        lines.append(f"| {name} | " + " | ".join(_cell(rows.get((s, label))) for s in styles) + " |")
    return "\n".join(lines)


def file_table(results: dict) -> str:
    """Every (style, method) row of a bench file: speedup [interval], alpha, tau, greedy equality with ``ar``."""
    lines = ["| style | method | n (prompts x repeats) | speedup over ar [95% nominal] | alpha | tau | = ar |",
             "|---|---|---|---|---|---|---|"]
    for r in results["per_task"]:
        if r["label"] == "ar":
            continue
        alpha = f"{r['alpha']:.2f}" if r.get("alpha") is not None else "-"
        tau = f"{r['tau']:.2f}" if r.get("tau") is not None else "-"
        eq = f"{r['equal_ar_rate']:.2f}" if r.get("equal_ar_rate") is not None else "-"
        lines.append(f"| {r['task']} | {r['label']} | {r['prompts']}x{r.get('repeats') or '?'} | {_cell(r)} | "
                     f"{alpha} | {tau} | {eq} |")
    return "\n".join(lines)


def matrix_svg(results: dict, methods=MATRIX_METHODS, title: str = "") -> str:
    """A grouped bar chart of :func:`matrix` (bars: the speedup; whiskers: the interval; dashed line: 1x), as SVG
    text with no script and no external resource."""
    styles = _styles(results)
    rows = {(r["task"], r["label"]): r for r in results["per_task"]}
    methods = [(lab, name) for lab, name in methods if any((s, lab) in rows for s in styles)]
    colours = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#b279a2", "#9d755d", "#72b7b2", "#bab0ac"]
    top = max([1.0] + [max(r.get("speedup_ci") or [r["speedup"] or 0]) for (s, lab), r in rows.items()
                       if any(lab == m for m, _ in methods)])
    top = float(int(top * 2) + 1) / 2  # the next 0.5 above every whisker
    w, h, left, bottom, group = 760, 330, 48, 40, 640 / max(1, len(styles))
    bar = group * 0.8 / max(1, len(methods))

    def y(v: float) -> float:
        return h - bottom - (h - bottom - 30) * v / top

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h + 18 * len(methods)}" '
           'font-family="sans-serif" font-size="12">', f'<text x="{left}" y="16">{html.escape(title)}</text>']
    for k in range(int(top * 2) + 1):
        v = k / 2
        out.append(f'<line x1="{left}" x2="{left + 650}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>'
                   f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.1f}x</text>')
    out.append(f'<line x1="{left}" x2="{left + 650}" y1="{y(1):.1f}" y2="{y(1):.1f}" stroke="#444" stroke-dasharray="4 3"/>')
    for i, s in enumerate(styles):
        x0 = left + 10 + i * group
        out.append(f'<text x="{x0 + group * 0.4:.1f}" y="{h - bottom + 18}" text-anchor="middle">{html.escape(s)}</text>')
        for j, (lab, _) in enumerate(methods):
            r = rows.get((s, lab))
            if not r or r.get("speedup") is None:
                continue
            x = x0 + j * bar
            out.append(f'<rect x="{x:.1f}" y="{y(r["speedup"]):.1f}" width="{bar * 0.9:.1f}" '
                       f'height="{y(0) - y(r["speedup"]):.1f}" fill="{colours[j % len(colours)]}"/>')
            if r.get("speedup_ci"):
                lo, hi = r["speedup_ci"]
                cx = x + bar * 0.45
                out.append(f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(lo):.1f}" y2="{y(hi):.1f}" stroke="#222"/>')
    for j, (_, name) in enumerate(methods):
        yy = h + 4 + 18 * j
        out.append(f'<rect x="{left}" y="{yy}" width="12" height="12" fill="{colours[j % len(colours)]}"/>'
                   f'<text x="{left + 18}" y="{yy + 10}">{html.escape(name.replace("`", "").replace("**", ""))}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


_BLOCK = "<!-- ledger:{0} -->\n{1}\n<!-- /ledger:{0} -->"


def _pattern(name: str) -> str:
    return rf"<!-- ledger:{re.escape(name)} -->\n(.*?)<!-- /ledger:{re.escape(name)} -->"


def read_block(text: str, name: str) -> str | None:
    """The content of the marked block ``name`` in ``text`` (None when absent; "" when empty)."""
    m = re.search(_pattern(name), text, re.DOTALL)
    return None if m is None else m.group(1).removesuffix("\n")


def replace_block(text: str, name: str, content: str) -> str:
    """``text`` with the marked block ``name`` holding ``content``; ValueError if the markers are missing."""
    if read_block(text, name) is None:
        raise ValueError(f"no block <!-- ledger:{name} --> ... <!-- /ledger:{name} --> to fill: add the two markers")
    return re.sub(_pattern(name), lambda _: _BLOCK.format(name, content), text, count=1, flags=re.DOTALL)
