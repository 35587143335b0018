"""The per-step trace (lab.trace), its coloured rendering (lab.render) and the notebook app (lab.app), on tiny models:
the trace adds up to the engine's output and SpecStats, costs nothing when off, and renders every token in its colour."""

from __future__ import annotations

import html
import re
import subprocess
import sys

import pytest
import torch

from specdec_lesson.drafters import HybridDrafter, ModelDrafter, PromptLookupDrafter, noisy_copy
from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables
from specdec_lesson.lab import Trace, TraceStep, render_ansi, render_html, token_pieces
from specdec_lesson.lab import render as render_mod
from specdec_lesson.models import tiny_llama
from specdec_lesson.speculative import speculative_generate

PROMPTS = [[3, 9, 27, 3, 9, 27, 3, 9], [5, 17, 3, 44, 9], [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2]]


class ByteTok:
    """Token i is a byte string; a few ids are halves of multi-byte UTF-8 characters (é, 😀), so single tokens
    decode to U+FFFD as a byte-level BPE tokenizer's do.  ``tok(text, return_tensors="pt").input_ids`` too."""

    chat_template = None
    TABLE = [bytes([c]) for c in b"abcdefghijklmnopqrstuvwxyz .,:()\n"] + [b"\xc3", b"\xa9", b"\xf0\x9f", b"\x98\x80"]
    TABLE += [b"_"] * (64 - len(TABLE))

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        return b"".join(self.TABLE[int(i)] for i in ids).decode("utf-8", errors="replace")

    def __call__(self, text: str, return_tensors: str = "pt"):
        ids = [self.TABLE.index(bytes([b])) if bytes([b]) in self.TABLE else 0 for b in text.encode()][-24:]
        return type("Enc", (), {"input_ids": torch.tensor([ids])})()


@pytest.fixture(scope="module")
def target():
    return tiny_llama(vocab_size=64, seed=0)  # float64


def _eagle(target):
    torch.manual_seed(0)
    model = EagleDraft(EagleConfig.from_target(target, 64), *_target_tables(target, torch.float64), d2t=torch.arange(64))
    return EagleDrafter(model.to(torch.float64).eval())


def _drafters(target):
    return {
        "model": lambda: ModelDrafter(noisy_copy(target, 0.1)),
        "lookup": lambda: PromptLookupDrafter(),
        "hybrid": lambda: HybridDrafter(_eagle(target), lookup_k=6),
    }


def check_trace(trace: Trace, out: list[torch.Tensor], stats) -> None:
    """Every row's steps concatenate to its output; the counts are SpecStats' counts."""
    for b, row in enumerate(out):
        assert trace.tokens(b) == row.tolist()
    s = trace.summary()
    for key in ("accepted", "rejections", "proposed", "emitted", "row_steps"):
        assert s[key] == getattr(stats, key), key
    assert s["steps"] == stats.target_forwards - 1  # minus the prefill
    for key in ("alpha", "utilisation", "tau"):
        assert s[key] == pytest.approx(getattr(stats, key), nan_ok=True)
    hist = [0] * len(stats.accept_hist)
    for st in trace.steps:
        hist[st.used] += 1
    assert hist == stats.accept_hist


@pytest.mark.parametrize("name", ["model", "lookup", "hybrid"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_trace_adds_up_to_output_and_stats(target, name, temperature):
    trace = Trace()
    out, stats = speculative_generate(target, _drafters(target)[name](), PROMPTS, 24, k=3, temperature=temperature,
                                      generator=torch.Generator().manual_seed(0), eos_token_id=7, trace=trace)
    check_trace(trace, out, stats)
    assert trace.batch == 3 and trace.prompts == PROMPTS and trace.k == 3
    kinds = {s.kind for s in trace.steps}
    assert "correction" in kinds and ("bonus" in kinds or name == "lookup")
    assert all(s.draft_ms >= 0 and s.verify_ms > 0 for s in trace.steps)


def test_planted_wrong_count_fails(target):
    class OffByOne(Trace):  # a bug: the correction counted as an accepted draft
        def record(self, step, host, emitted, active, draft_s, verify_s):
            super().record(step, [[min(r[0] + 1, len(r) - 2)] + r[1:] for r in host], emitted, active, draft_s, verify_s)

    trace = OffByOne()
    with pytest.raises((AssertionError, ValueError)):
        out, stats = speculative_generate(target, _drafters(target)["model"](), PROMPTS, 16, k=3, trace=trace)
        check_trace(trace, out, stats)


def test_trace_off_costs_nothing(target, monkeypatch):
    """trace=None: the same tokens and counts, and no Trace code runs."""
    on = Trace()
    ref, ref_stats = speculative_generate(target, _drafters(target)["model"](), PROMPTS, 16, k=3, trace=on)

    def boom(*a, **k):
        raise AssertionError("trace code ran with trace=None")

    monkeypatch.setattr(Trace, "start", boom)
    monkeypatch.setattr(Trace, "record", boom)
    out, stats = speculative_generate(target, _drafters(target)["model"](), PROMPTS, 16, k=3)
    assert all(torch.equal(a, b) for a, b in zip(out, ref))
    drop = {"time_prefill", "time_draft", "time_verify", "time_other", "time_total"}
    assert {k: v for k, v in stats.summary().items() if k not in drop} == {
        k: v for k, v in ref_stats.summary().items() if k not in drop}


def test_engine_never_imports_the_lab():
    code = ("import sys, torch; from specdec_lesson.models import tiny_llama; from specdec_lesson.speculative import "
            "speculative_generate; from specdec_lesson.drafters import PromptLookupDrafter; "
            "speculative_generate(tiny_llama(), PromptLookupDrafter(), [[1, 2, 1, 2, 1]], 6); "
            "assert not [m for m in sys.modules if m.startswith('specdec_lesson.lab')], 'lab imported'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)


def test_bad_trace_arguments(target):
    with pytest.raises(ValueError, match="trace must be None or a specdec_lesson.lab.Trace"):
        speculative_generate(target, PromptLookupDrafter(), PROMPTS, 4, trace=[])
    trace = Trace()
    speculative_generate(target, PromptLookupDrafter(), PROMPTS, 4, trace=trace)
    with pytest.raises(ValueError, match="already holds a run; pass a new Trace"):
        speculative_generate(target, PromptLookupDrafter(), PROMPTS, 4, trace=trace)
    with pytest.raises(ValueError, match="row must be in 0..2"):
        trace.row(3)
    with pytest.raises(ValueError, match="accepted = 3 is outside 0..2"):
        TraceStep(1, 0, (4, 5), 3, 6, (4, 5, 6), 0.0, 0.0)
    with pytest.raises(ValueError, match="the trace is empty"):
        render_html(Trace(), ByteTok())


# ------------------------------------------------------------------------------------------- rendering
def test_token_pieces_keep_split_characters_whole():
    tok = ByteTok()
    e_acute, smile = [33, 34], [35, 36]  # é and 😀 in two tokens each
    ids = [0, 26] + e_acute + [1] + smile + [32]
    pieces = token_pieces(tok, [], ids)
    assert pieces == ["a", " ", "", "é", "b", "", "😀", "\n"]
    for cut in range(1, len(ids)):  # any split point: the pieces complete the context's text
        head = tok.decode(ids[:cut])
        if not head.endswith("\ufffd"):
            assert head + "".join(token_pieces(tok, ids[:cut], ids[cut:])) == tok.decode(ids)


def _spans(page: str) -> list[tuple[str, str, str]]:
    found = re.findall(r"<span class='sd-(\w+)' data-kind='\w+' style='([^']*)' title='[^']*'>(.*?)</span>", page, re.S)
    return [(kind, style, html.unescape(text)) for kind, style, text in found]


COLOURS = {"accepted": "#c9f2c9", "rejected": "#f9d0d0", "target": "#cfe0fc"}  # green, red, blue backgrounds


def check_html(page: str, trace: Trace, tok, row: int) -> None:
    spans = _spans(page)
    for kind, style, _ in spans:
        assert COLOURS[kind] in style and ("line-through" in style) == (kind == "rejected")
    steps = trace.row(row)
    counts = {k: sum(1 for s in spans if s[0] == k) for k in COLOURS}
    assert counts["accepted"] == sum(s.used for s in steps)
    assert counts["target"] == sum(s.target_emitted for s in steps)
    assert counts["rejected"] == sum(s.rejection for s in steps)
    kinds = [kind for kind, _, _ in spans]
    assert all(kinds[i + 1:i + 2] == ["target"] for i, kind in enumerate(kinds) if kind == "rejected")  # then corrected
    assert "".join(text for kind, _, text in spans if kind != "rejected") == tok.decode(trace.tokens(row))


def test_html_colours_every_token(target):
    tok = ByteTok()
    trace = Trace()
    speculative_generate(target, _drafters(target)["hybrid"](), PROMPTS, 24, k=3, trace=trace)
    for b in range(3):
        page = render_html(trace, tok, b, prompt_tokens=4)
        check_html(page, trace, tok, b)
        assert "accepted draft" in page and "rejected draft" in page and "correction or bonus" in page  # the legend
        assert "alpha " in page and "tau " in page


def test_planted_wrong_colour_fails(target, monkeypatch):
    tok = ByteTok()
    trace = Trace()
    speculative_generate(target, _drafters(target)["model"](), PROMPTS, 16, k=3, trace=trace)
    monkeypatch.setitem(render_mod.STYLES, "target", render_mod.STYLES["accepted"])  # corrections drawn green
    with pytest.raises(AssertionError):
        check_html(render_html(trace, tok, 0), trace, tok, 0)


def test_ansi_rendering(target):
    tok = ByteTok()
    trace = Trace()
    out, _ = speculative_generate(target, _drafters(target)["model"](), PROMPTS, 16, k=3, trace=trace)
    text = render_ansi(trace, tok, 1, stats=True)
    legend, body, stats = text.split("\n")[0], "\n".join(text.split("\n")[1:-1]), text.split("\n")[-1]
    assert legend.startswith("legend: \x1b[32maccepted draft") and "\x1b[31;9m" in legend and "\x1b[94m" in legend
    assert "\x1b[31;9m" in body and "\x1b[94m" in body
    kept = re.sub(r"\x1b\[31;9m.*?\x1b\[0m", "", body, flags=re.S)  # drop the rejected drafts
    assert re.sub(r"\x1b\[[0-9;]*m", "", kept) == tok.decode(out[1])
    assert stats.startswith("alpha ")


# --------------------------------------------------------------------------------------------- the app
def test_app_run_matches_the_engine(target):
    pytest.importorskip("ipywidgets")
    from specdec_lesson.lab.app import build_app

    tok = ByteTok()
    drafters = {name: (lambda k, make=make: make()) for name, make in _drafters(target).items()}
    lab = build_app(target, tok, drafters=drafters, prompt="abc abc abc ab", max_new_tokens=16, k=3)
    assert list(lab.drafter.options) == ["model", "lookup", "hybrid"]
    for name in ("hybrid", "lookup"):
        lab.drafter.value = name
        lab.temperature.value = 1.0 if name == "lookup" else 0.0
        result = lab.run()
        ids = tok(lab.prompt.value).input_ids
        ref, stats = speculative_generate(target, drafters[name](3), ids, 16, k=3, temperature=lab.temperature.value,
                                          generator=torch.Generator().manual_seed(0))
        assert result.spec_tokens == ref[0].tolist() and result.spec_text == tok.decode(ref[0])
        assert result.stats.accepted == stats.accepted
        assert lab.trace_html.value == result.html
        check_html(result.html, result.trace, tok, 0)
        assert "plain decoding" in lab.speed.value and "speculative decoding" in lab.speed.value
        assert f"{result.spec_tps:.1f}" in lab.speed.value and f"{result.plain_tps:.1f}" in lab.speed.value
    lab.prompt.value = "  "
    with pytest.raises(ValueError, match="the prompt is empty"):
        lab.run()
    lab.run_button.click()  # the button shows the error instead of raising
    assert "the prompt is empty" in lab.status.value and not lab.run_button.disabled


def test_app_status_says_what_the_adaptive_drafter_did(target):
    """The status line names the adaptive drafter's steps per kind, and when it drafted nothing, the policy's reason
    (a learner otherwise sees a trace without green and no why)."""
    pytest.importorskip("ipywidgets")
    from specdec_lesson.drafters.adaptive import AdaptiveDrafter
    from specdec_lesson.drafters.adaptive_policy import StepCosts
    from specdec_lesson.lab.app import build_app

    tok = ByteTok()
    steep = StepCosts((0.01, 0.03, 0.04, 0.05), 0.005, 0.005)  # verifying 2 costs 3 tokens' time: drafting never pays
    flat = StepCosts((0.01, 0.0101, 0.0102, 0.0103), 0.0001, 0.0001)
    drafters = {"steep": lambda k: AdaptiveDrafter(_eagle(target), steep, k, probe_every=100),
                "flat": lambda k: AdaptiveDrafter(_eagle(target), flat, k),
                "model": lambda k: ModelDrafter(noisy_copy(target, 0.1))}
    lab = build_app(target, tok, drafters=drafters, prompt="abc abc abc ab", max_new_tokens=16, k=3)
    lab.run()
    assert "steps: plain 15" in lab.status.value  # 16 tokens: the prefill emits the first
    assert "the policy drafted nothing: alpha_hat" in lab.status.value
    assert "plain step 10 ms beats" in html.unescape(lab.status.value)
    lab.drafter.value = "flat"
    lab.run()
    assert "steps: draft" in lab.status.value and "drafted nothing" not in lab.status.value
    lab.drafter.value = "model"
    lab.run()
    assert "steps:" not in lab.status.value and lab.status.value.startswith("done: model, K = 3")


def test_default_drafters_offer_the_three_and_load_the_draft_lazily(target):
    pytest.importorskip("ipywidgets")
    from specdec_lesson.lab.app import default_drafters

    eagle = _eagle(target)
    options = default_drafters(target, eagle)
    names = list(options)
    assert names[:3] == ["distilled draft (EAGLE-style)", "prompt lookup", "hybrid: draft + prompt lookup"]
    assert options[names[0]](4) is eagle and isinstance(options[names[1]](4), PromptLookupDrafter)
    hybrid = options[names[2]](4)
    assert isinstance(hybrid, HybridDrafter) and hybrid.model is eagle and hybrid.lookup_k == 8


def test_app_offers_the_adaptive_drafter(target):
    pytest.importorskip("ipywidgets")
    from specdec_lesson.lab.app import DecodeLab, default_drafters

    tok = ByteTok()
    options = default_drafters(target, _eagle(target), probe_ids=torch.tensor([PROMPTS[2]]))
    name = [n for n in options if n.startswith("adaptive")]
    assert len(name) == 1 and "adaptive" not in "".join(default_drafters(target, _eagle(target)))  # no probe: no option
    lab = DecodeLab(target, tok, options, prompt="abc abc abc abc ab", max_new_tokens=16, k=3)
    assert lab.drafter.value == name[0]  # the app's default drafter
    result = lab.run()
    assert result.spec_tokens == result.plain_tokens  # greedy, float64: exact
    assert result.trace.tokens(0) == result.spec_tokens
    check_html(result.html, result.trace, tok, 0)
