"""benchmarks/compile_probe.py: bad flags fail in one line before any model loads; its block arithmetic equals the
lean forward (so the compiled-or-not comparison times the same work)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_probe.py"


@pytest.mark.parametrize("flags,message", [(["--widths", "0"], "1..64"), (["--widths", "a,b"], "comma-separated"),
                                           (["--rounds", "0"], "--rounds must be >= 1")])
def test_compile_probe_rejects_bad_flags_before_loading_models(flags, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), *flags], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


def test_compile_probe_refuses_to_overwrite_without_force(tmp_path):
    out = tmp_path / "r.json"
    out.write_text("{}")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--force" in proc.stderr and out.read_text() == "{}"


def _setup(seed: int):
    """The script as a module, the tiny model's lean forward, a 9-token prompt in a 16-slot cache and 4 new tokens."""
    from specdec_lesson.lean.model import lean_model
    from specdec_lesson.models import tiny_llama

    spec = importlib.util.spec_from_file_location("compile_probe", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lean = lean_model(tiny_llama(seed=0))
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, lean.embed.shape[0], (1, 9), generator=gen)  # [1, 9]
    new = torch.randint(0, lean.embed.shape[0], (1, 4), generator=gen)  # [1, 4]
    with torch.inference_mode():
        cache = lean.new_cache(1, 16)
        lean.forward(prompt, cache, cache.plan(9))
    return mod, lean, cache, new


def test_block_forward_equals_the_lean_forward():
    mod, lean, cache, new = _setup(0)
    pre, post = mod.block_functions(lean)
    with torch.inference_mode():
        kc, vc = cache.k.clone(), cache.v.clone()
        for n in (1, 4):
            ref, _ = lean.forward(new[:, :n], cache, cache.plan(n))  # [1, n, V]
            cache.set_lengths([9])
            got = mod.block_forward(lean, pre, post, kc, vc, new[:, :n], 9)  # [1, n, V]
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (n, (got - ref).abs().max())


def test_frozen_forward_equals_the_lean_forward():
    """The module compiled with frozen weights computes the lean forward (eagerly here): same logits, and the keys and
    values it writes at the given positions are the lean cache's."""
    mod, lean, cache, new = _setup(1)
    frozen = mod.FrozenForward(lean).eval()
    with torch.inference_mode():
        kc, vc = cache.k.clone(), cache.v.clone()
        for n in (1, 4):
            ref, _ = lean.forward(new[:, :n], cache, cache.plan(n))  # [1, n, V]
            got = frozen(new[:, :n], kc, vc, torch.arange(9, 9 + n))  # [1, n, V]
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (n, (got - ref).abs().max())
            assert torch.allclose(kc[:, :, :, : 9 + n], cache.k[:, :, :, : 9 + n], atol=1e-6)
            assert torch.allclose(vc[:, :, :, : 9 + n], cache.v[:, :, :, : 9 + n], atol=1e-6)
            cache.set_lengths([9])
