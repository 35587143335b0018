"""A :class:`~specdec_lesson.lab.trace.Trace` as coloured text: HTML for notebooks, ANSI colours for a terminal.

* accepted drafts: **green** (the draft guessed them and the target agreed);
* rejected drafts: **red, struck through** (the first rejected draft and the never-checked ones after it:
  they cost draft and verify work but are not in the text);
* the target's own token after them, the correction (after a rejection) or the bonus (all drafts
  passed): **blue**.

Read without the struck-through parts, the coloured text is exactly the run's output.  Token ids become
text through the tokenizer (:func:`token_pieces`): each token's piece is the text it adds to the tokens
before it, so byte-level markers (``Ġ``, ``▁``) become spaces, and a character split over several tokens
(an emoji, accented letters in byte-level BPE) is shown on the token that completes it.
"""

from __future__ import annotations

import html
import math

from .trace import Trace, TraceStep

__all__ = ["render_html", "render_ansi", "token_pieces", "legend_html", "LEGEND_ANSI", "STYLES", "ANSI"]

STYLES = {  # inline CSS (a notebook's output keeps no stylesheet), light and dark themes both readable
    "accepted": "background:#c9f2c9;color:#0b4f0b;border-radius:3px;box-shadow:inset -1px 0 0 #fff",
    "rejected": "background:#f9d0d0;color:#8a1111;text-decoration:line-through;border-radius:3px",
    "target": "background:#cfe0fc;color:#0c2f7a;border-radius:3px;box-shadow:inset -1px 0 0 #fff",
    "prompt": "color:#777",
}
ANSI = {"accepted": "\x1b[32m", "rejected": "\x1b[31;9m", "target": "\x1b[94m", "prompt": "\x1b[2m"}
_RESET = "\x1b[0m"
_LABELS = {"accepted": ("accepted draft", ""), "rejected": ("rejected draft", " (not in the text)"),
           "target": ("target's token", " (correction or bonus)")}  # (coloured key, plain explanation)
LEGEND_ANSI = "legend: " + "  ".join(f"{ANSI[k]}{key}{_RESET}{more}" for k, (key, more) in _LABELS.items())
_CONTEXT = 8  # tokens of left context when decoding a piece (enough for a space marker or a split character)
_REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 sequence to


def _decode(tokenizer, ids: list[int]) -> str:
    try:
        return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    except TypeError:  # a minimal tokenizer without those options
        return tokenizer.decode(ids)


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def token_pieces(tokenizer, context: list[int], tokens: list[int]) -> list[str]:
    """The text each of ``tokens`` adds after ``context`` (ids before them), one string per token.

    A token that ends inside a multi-byte character gets ``""`` and the token completing the character gets
    all of it; ``"".join(pieces)`` is the tokens' text (as ``decode(context + tokens)`` minus the context's)."""
    full = list(context) + list(tokens)
    c = len(context)
    pieces: list[str] = []
    held = c  # first index of the tokens whose text is not yet attributed (an incomplete character)
    for j in range(c, len(full)):
        lo = max(0, held - _CONTEXT)
        before = _decode(tokenizer, full[lo:held])
        after = _decode(tokenizer, full[lo:j + 1])
        if after.endswith(_REPLACEMENT) and j + 1 < len(full):
            pieces.append("")  # an incomplete character: its bytes go to the token that completes it
            continue
        pieces.append(after[_common_prefix(before, after):])
        held = j + 1
    return pieces


def _segments(trace: Trace, tokenizer, row: int) -> list[tuple[str, str, str]]:
    """``(kind, text, hover title)`` in reading order: per step the accepted drafts, the rejected ones, the target's."""
    steps = trace.row(row)
    history = list(trace.prompts[row]) if trace.prompts else []
    emitted = [t for s in steps for t in s.emitted]
    pieces = token_pieces(tokenizer, history[-_CONTEXT:], emitted)  # one pass: characters split across steps stay whole
    out: list[tuple[str, str, str]] = []
    i = 0
    for s in steps:
        title = _title(s)
        for j, _ in enumerate(s.emitted):
            kind = "accepted" if j < s.accepted else "target"
            out.append((kind, pieces[i + j], f"{title}; {_what(s, j)}"))
        if s.rejected and s.target_emitted:  # rejected drafts sit where the correction went: before it
            ctx = (history + emitted[:i + s.accepted])[-_CONTEXT:]
            rej = "".join(token_pieces(tokenizer, ctx, list(s.rejected)))
            out.insert(len(out) - 1, ("rejected", rej, f"{title}; {len(s.rejected)} draft(s) rejected, "
                                      f"the first by verification, the rest never checked"))
        i += len(s.emitted)
    return out


def _title(s: TraceStep) -> str:
    return (f"step {s.step}: {s.accepted} of {s.k} drafts accepted, draft {s.draft_ms:.1f} ms, "
            f"verify {s.verify_ms:.1f} ms")


def _what(s: TraceStep, j: int) -> str:
    if j < s.accepted:
        return f"draft {j + 1}, accepted"
    return {"plain": "target's token (nothing drafted)", "bonus": "bonus token (all drafts passed)",
            "correction": "correction (the target's token where the first rejected draft was)"}[s.kind]


def _visible(text: str) -> str:
    """A rejected draft's whitespace made visible (it is not part of the text): newline -> ↵, tab -> →."""
    return text.replace("\n", "↵").replace("\t", "→") or "∅"


def _check(trace: Trace, row: int) -> None:
    if not isinstance(trace, Trace):
        raise ValueError(f"expected a specdec_lesson.lab.Trace, got {type(trace).__name__}")
    if not trace.steps:
        raise ValueError("the trace is empty: pass it to speculative_generate(..., trace=trace) first")
    trace.row(row)  # raises naming the valid rows


def _stats_line(trace: Trace, row: int) -> str:
    s = trace.summary(row)

    def f(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{x:.2f}"

    return (f"alpha {f(s['alpha'])} · utilisation {f(s['utilisation'])} · tau {f(s['tau'])} tokens/step · "
            f"{s['steps']} steps · draft {s['draft_ms']:.1f} ms, verify {s['verify_ms']:.1f} ms per step")


def legend_html() -> str:
    return ("<div style='font-family:sans-serif;font-size:12px;margin-bottom:6px'>"
            + " &nbsp; ".join(f"<span style='{STYLES[k]};padding:1px 4px'>{html.escape(key)}</span>{html.escape(more)}"
                              for k, (key, more) in _LABELS.items())
            + "</div>")


def render_html(trace: Trace, tokenizer, row: int = 0, *, prompt_tokens: int = 0, legend: bool = True,
                stats: bool = True) -> str:
    """Row ``row`` of ``trace`` as self-contained HTML (inline styles; hover a token for its step, counts and times).

    ``prompt_tokens``: show that many of the prompt's last tokens first, in grey; ``legend`` / ``stats``: the
    colour key above the text, alpha / utilisation / tau below it."""
    _check(trace, row)
    parts = [legend_html()] if legend else []
    parts.append("<div style='font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:13px;"
                 "white-space:pre-wrap;line-height:1.7;padding:8px;border:1px solid #ddd;border-radius:4px'>")
    if prompt_tokens:
        text = _decode(tokenizer, trace.prompts[row][-prompt_tokens:])
        parts.append(f"<span style='{STYLES['prompt']}' title='prompt'>{html.escape(text)}</span>")
    for kind, text, title in _segments(trace, tokenizer, row):
        shown = _visible(text) if kind == "rejected" else text
        parts.append(f"<span class='sd-{kind}' data-kind='{kind}' style='{STYLES[kind]}' "
                     f"title='{html.escape(title, quote=True)}'>{html.escape(shown)}</span>")
    parts.append("</div>")
    if stats:
        parts.append(f"<div style='font-family:sans-serif;font-size:12px;color:#555;margin-top:4px'>"
                     f"{html.escape(_stats_line(trace, row))}</div>")
    return "".join(parts)


def render_ansi(trace: Trace, tokenizer, row: int = 0, *, legend: bool = True, stats: bool = False) -> str:
    """Row ``row`` of ``trace`` with ANSI colours for a terminal (``legend``: a one-line key first)."""
    _check(trace, row)
    runs: list[list[str]] = []  # neighbours of one kind share one colour code
    for kind, text, _ in _segments(trace, tokenizer, row):
        text = _visible(text) if kind == "rejected" else text
        if runs and runs[-1][0] == kind:
            runs[-1][1] += text
        else:
            runs.append([kind, text])
    body = "".join(f"{ANSI[kind]}{text}{_RESET}" for kind, text in runs)
    lines = ([LEGEND_ANSI] if legend else []) + [body] + ([_stats_line(trace, row)] if stats else [])
    return "\n".join(lines)
