"""The demo (``python -m specdec_lesson``) on tiny models: status lines before its long steps, and damaged weights
(NaN logits) stop it with one line instead of printing empty outputs and "greedy outputs identical: True"."""

from __future__ import annotations

import re

import torch

from specdec_lesson import __main__ as demo
from specdec_lesson.models import tiny_llama


class _Tok:
    """Characters as token ids of a 64-token vocabulary; ``tok(text, return_tensors="pt").input_ids``."""

    chat_template = None

    def __call__(self, text: str, return_tensors: str = "pt"):
        ids = torch.tensor([[ord(c) % 64 for c in text][-24:]])
        return type("Enc", (), {"input_ids": ids})()

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(48 + int(i) % 64) for i in ids)


def _pair(damaged: bool):
    target = tiny_llama(dtype=torch.float32)
    draft = tiny_llama(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=1, dtype=torch.float32)
    if damaged:
        with torch.no_grad():
            target.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")  # as a damaged weights cache would
    return target, draft, _Tok(), "tiny draft"


def test_demo_prints_status_lines_before_long_steps(monkeypatch, capsys):
    monkeypatch.setattr(demo, "_load", lambda: _pair(damaged=False))
    assert demo.main(["--max-new-tokens", "4", "--k", "2"]) == 0
    out, err = capsys.readouterr()
    status = [line for line in err.splitlines() if line.startswith("[specdec] ")]
    assert status[0].startswith("[specdec] loading SmolLM2-135M-Instruct and its draft")
    assert "[specdec] code prompt: plain decoding, then speculative decoding, 4 tokens each ..." in status
    assert "greedy outputs identical: True" in out
    assert [line for line in out.splitlines() if line.startswith("=== ")] == [  # a plain chat question too (issue 24)
        "=== code prompt ===", "=== math prompt ===", "=== chat prompt ==="]


def test_demo_stops_on_damaged_weights_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(demo, "_load", lambda: _pair(damaged=True))
    assert demo.main(["--max-new-tokens", "4", "--k", "2"]) == 1
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if not line.startswith("[specdec] ")]
    assert len(errors) == 1 and errors[0].startswith("python -m specdec_lesson: error: the target model's logits hold NaN")
    assert "SPECDEC_CACHE" in errors[0] and "identical" not in out


def test_demo_show_prints_each_run_in_colour_and_default_stays_plain(monkeypatch, capsys):
    monkeypatch.setattr(demo, "_load", lambda: _pair(damaged=False))
    assert demo.main(["--max-new-tokens", "6", "--k", "2"]) == 0
    plain, _ = capsys.readouterr()
    assert "\x1b[" not in plain and "step by step" not in plain  # the default output has no colour
    assert demo.main(["--max-new-tokens", "6", "--k", "2", "--show"]) == 0
    shown, _ = capsys.readouterr()
    assert shown.count("--- step by step: speculative decoding ---\nlegend: \x1b[32maccepted draft") == 3  # every prompt
    assert "\x1b[94m" in shown
    # without the trace blocks (header, legend, coloured text, stats line) it is the default output (timings aside)
    rest = re.sub(r"--- step by step: [^\n]* ---\n.*?\nalpha [^\n]*\n", "", shown, flags=re.S)

    def mask(text: str) -> str:
        return re.sub(r" *\d+(\.\d+)?", " #", text)  # numbers are right-aligned in a fixed width

    assert mask(rest) == mask(plain)


def test_demo_show_takes_no_value(capsys):
    assert demo.main(["--show=yes"]) == 2
    _, err = capsys.readouterr()
    assert err.strip() == "python -m specdec_lesson: error: argument --show: ignored explicit argument 'yes'"
