"""bench.tasks.load_prompts: JSONL lines end at "\n" only, so prompts may hold any character a JSON string may."""

from __future__ import annotations

import json

import pytest

from specdec_lesson.bench import tasks as T


def test_load_prompts_keeps_unicode_line_separators_inside_prompts(tmp_path):
    texts = ["first\u2028line", "para\u2029graph", "next\u0085line", "form\x0cfeed and \x1c\x1d\x1e separators"]
    path = tmp_path / "p.jsonl"
    lines = [json.dumps({"id": f"p{i}", "prompt": t}, ensure_ascii=False) for i, t in enumerate(texts)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")  # raw U+2028 etc. inside JSON strings: valid JSON
    assert T.load_prompts(path) == [{"id": f"p{i}", "prompt": t} for i, t in enumerate(texts)]
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))  # Windows line ends
    assert [p["prompt"] for p in T.load_prompts(crlf)] == texts


def test_load_prompts_names_the_right_line_after_such_prompts(tmp_path):
    path = tmp_path / "p.jsonl"
    good = json.dumps({"prompt": "a\u2028b\u2029c\u0085d"}, ensure_ascii=False)
    path.write_text(f"{good}\n\n{good.replace('a', 'x')}\n{{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:4: not valid JSON"):
        T.load_prompts(path)
    path.write_text(f"{good}\n{{\"text\": \"no prompt field\"}}\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: expected a JSON object with a non-empty string 'prompt' field"):
        T.load_prompts(path)
