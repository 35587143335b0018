"""Pre-packed oneDNN linears: same outputs as nn.Linear within fp32 rounding, clean fallback.

Tolerance: pre-packing changes only the summation order of fp32 dot products, so logits may move
by rounding (about 1e-4 on SmolLM2's logits of size ~20); we require max |diff| < 1e-3 and the same
argmax at every position of every input tested."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from specdec_lesson import fastcpu
from specdec_lesson.fastcpu import PackedLinear, count_packed, packed_linear_available, prepack_linears, unpack_linears
from specdec_lesson.models import default_target_cache_dir, tiny_llama

TOL = 1e-3
needs_onednn = pytest.mark.skipif(not packed_linear_available(), reason="oneDNN pre-packed linear unavailable in this build")




def _tied_tiny(seed: int = 0) -> nn.Module:
    model = tiny_llama(vocab_size=96, hidden_size=64, num_layers=2, seed=seed, dtype=torch.float32)
    model.lm_head.weight = model.model.embed_tokens.weight  # tie like SmolLM2
    return model


def _inputs(vocab: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (b, t), generator=g) for b, t in [(1, 1), (1, 7), (3, 12), (2, 33)]]


def _logits(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=ids).logits  # [B, T, V]


def _cached_logits(model: nn.Module, ids: torch.Tensor, split: int) -> torch.Tensor:
    """Prefill ids[:, :split] into a DynamicCache, then one forward over the rest (a verify step)."""
    from transformers import DynamicCache

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :split], cache=cache, use_cache=True)
        pos = torch.arange(split, ids.shape[1]).unsqueeze(0)  # [1, n]
        return model(input_ids=ids[:, split:], position_ids=pos, cache=cache, use_cache=True).logits  # [B, n, V]


def _assert_close_same_argmax(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff < TOL, f"max |logit diff| {diff:.3g} >= {TOL}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))


@needs_onednn
def test_tiny_model_same_logits_and_tied_head_stays_tied():
    model = _tied_tiny()
    inputs = _inputs(96)
    before = [_logits(model, ids) for ids in inputs]
    keys_before = list(model.state_dict().keys())
    embed = model.model.embed_tokens
    assert prepack_linears(model) is model
    assert count_packed(model) == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer + lm_head
    assert model.model.embed_tokens is embed and type(embed) is nn.Embedding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert list(model.state_dict().keys()) == keys_before
    for ids, want in zip(inputs, before):
        _assert_close_same_argmax(_logits(model, ids), want)


@needs_onednn
def test_cached_verify_forward_matches_plain():
    model = tiny_llama(vocab_size=80, hidden_size=48, num_layers=3, num_heads=4, num_kv_heads=2, seed=3, dtype=torch.float32)
    ids = torch.randint(0, 80, (2, 40), generator=torch.Generator().manual_seed(5))
    want = {n: _cached_logits(model, ids[:, : 30 + n], 30) for n in (1, 2, 5, 9)}
    prepack_linears(model)
    for n, w in want.items():
        _assert_close_same_argmax(_cached_logits(model, ids[:, : 30 + n], 30), w)


@needs_onednn
def test_unpack_restores_plain_linear_and_exact_outputs():
    model = _tied_tiny(seed=1)
    ids = _inputs(96, seed=1)[2]
    want = _logits(model, ids)
    prepack_linears(model)
    unpack_linears(model)
    assert count_packed(model) == 0
    assert all(type(m) is nn.Linear for name, m in model.named_modules() if name.endswith(("proj", "lm_head")))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert torch.equal(_logits(model, ids), want)  # same weights, same kernels: bit for bit


@needs_onednn
def test_packed_linear_bias_fallbacks_and_repack():
    g = torch.Generator().manual_seed(0)
    lin = nn.Linear(40, 24)
    x = torch.randn(5, 40, generator=g)  # [5, 40]
    with torch.no_grad():
        want = lin(x)  # [5, 24]
    layer = prepack_linears(nn.Sequential(lin))[0]
    assert isinstance(layer, PackedLinear)
    with torch.no_grad():
        assert (layer(x) - want).abs().max().item() < 1e-4
        # float64 input: F.linear on float64 weights
        layer64 = PackedLinear(nn.Linear(40, 24).double())
        x64 = x.double()
        assert torch.equal(layer64(x64), torch.nn.functional.linear(x64, layer64.weight, layer64.bias))
        # an in-place weight update must not leave a stale packed copy
        layer.weight.mul_(2.0)
        assert (layer(x) - torch.nn.functional.linear(x, layer.weight, layer.bias)).abs().max().item() < 1e-4
    # autograd enabled: F.linear path, gradients flow
    xg = x.clone().requires_grad_(True)
    out = layer(xg)
    out.sum().backward()
    assert xg.grad is not None and layer.weight.grad is not None
    # d(sum out)/dx = the column sums of W, up to fp32 summation order: the backward GEMM and W.sum(0) add the
    # same terms in different orders (MKL's threaded order varies run to run), so an entry near 6e-4 can differ by 6e-8,
    # above allclose's default atol of 1e-8; 1e-6 is far below any real error (a wrong gradient is off by O(0.1)).
    torch.testing.assert_close(xg.grad, layer.weight.sum(0).expand(5, 40).detach(), rtol=1e-5, atol=1e-6)


@needs_onednn
def test_deepcopy_and_torch_save_work():
    import copy
    import io

    model = prepack_linears(_tied_tiny(seed=4))
    ids = _inputs(96, seed=4)[2]
    want = _logits(model, ids)
    clone = copy.deepcopy(model)
    assert clone.lm_head.weight is clone.model.embed_tokens.weight and clone.lm_head.weight is not model.lm_head.weight
    assert torch.equal(_logits(clone, ids), want)
    buf = io.BytesIO()
    torch.save(model, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(_logits(loaded, ids), want)


def test_fallback_when_op_unavailable(monkeypatch):
    def broken_pack(weight):
        raise RuntimeError("simulated: no mkldnn")

    monkeypatch.setattr(fastcpu, "_AVAILABLE", None)
    monkeypatch.setattr(fastcpu, "_pack", broken_pack)
    assert packed_linear_available() is False
    model = _tied_tiny(seed=2)
    ids = _inputs(96, seed=2)[1]
    want = _logits(model, ids)
    assert prepack_linears(model) is model
    assert count_packed(model) == 0
    assert torch.equal(_logits(model, ids), want)
    with pytest.raises(RuntimeError, match="not available"):
        prepack_linears(model, strict=True)


def test_fallback_when_op_disagrees(monkeypatch):
    """The availability probe checks equality, not only that the op runs."""
    real = fastcpu._packed_linear
    monkeypatch.setattr(fastcpu, "_AVAILABLE", None)
    monkeypatch.setattr(fastcpu, "_packed_linear", lambda x, p, b: real(x, p, b) + 1e-2)
    assert packed_linear_available() is False
    model = nn.Sequential(nn.Linear(8, 8))
    prepack_linears(model)
    assert type(model[0]) is nn.Linear


@needs_onednn
def test_only_fp32_cpu_linears_are_swapped():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8).double(), nn.Linear(8, 8, device="meta"))
    prepack_linears(model)
    assert [type(m) for m in model] == [PackedLinear, nn.Linear, nn.Linear]
    assert count_packed(tiny_llama(dtype=torch.float64)) == 0


@needs_onednn
def test_model_built_under_inference_mode():
    with torch.inference_mode():
        lin = nn.Linear(16, 8)
        x = torch.randn(3, 16)
        want = lin(x)
        layer = prepack_linears(nn.Sequential(lin))[0]
        assert isinstance(layer, PackedLinear)
        assert (layer(x) - want).abs().max().item() < 1e-4


def test_rejects_non_module():
    with pytest.raises(ValueError, match="nn.Module"):
        prepack_linears("not a model")


@needs_onednn
@pytest.mark.skipif(not default_target_cache_dir().exists(), reason="default target not converted in ~/.cache/specdec_lesson")
def test_default_target_logits_within_rounding():
    from specdec_lesson.models import load_default_target

    model, _ = load_default_target(verbose=False)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 48), generator=g)  # [2, 48]
    want_full = _logits(model, ids)
    want_verify = {n: _cached_logits(model, ids[:, : 40 + n], 40) for n in (1, 8)}
    prepack_linears(model)
    assert count_packed(model) == 30 * 7 + 1
    assert model.lm_head.weight is model.model.embed_tokens.weight
    _assert_close_same_argmax(_logits(model, ids), want_full)
    for n, w in want_verify.items():
        _assert_close_same_argmax(_cached_logits(model, ids[:, : 40 + n], 40), w)


def _packed_tiny() -> nn.Module:
    """The tiny test Llama with its linears pre-packed; skips where this PyTorch build has no oneDNN packed
    linear (then there is no dispatch between plain and packed weights to test)."""
    model = tiny_llama(dtype=torch.float32)
    prepack_linears(model)
    if count_packed(model) == 0:
        pytest.skip("the oneDNN packed linear is not available in this PyTorch build")
    return model


def test_dispatch_threshold_routes_small_inputs_to_the_plain_weights(monkeypatch):
    model = _packed_tiny()
    calls = []
    monkeypatch.setattr(fastcpu, "_packed_linear", lambda x, p, b: calls.append(x.shape) or torch.ops.mkldnn._linear_pointwise(
        x, p, b, "none", [], ""))
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        ref = model(ids[:, :1]).logits
        assert calls
        calls.clear()
        assert fastcpu.set_plain_rows(model, 1) == fastcpu.count_packed(model)
        one = model(ids[:, :1]).logits  # 1 row: plain
        assert not calls
        model(ids)  # 4 rows: packed
        assert calls
    torch.testing.assert_close(one, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError):
        fastcpu.set_plain_rows(model, -1)


def test_tune_dispatch_picks_the_faster_path_per_width(monkeypatch):
    from specdec_lesson import profiling

    model = _packed_tiny()

    def fake_curve(m, context, repeats, ns):  # plain faster at 1 and 2 rows, packed from 3 on
        plain = next(x for x in m.modules() if isinstance(x, fastcpu.PackedLinear)).plain_rows_max > 0
        return {n: (0.010 if n <= 2 else 0.030) if plain else 0.020 for n in ns}

    monkeypatch.setattr(profiling, "measure_verify_curve", fake_curve)
    res = profiling.tune_dispatch(model, widths=(1, 2, 3, 4), repeats=3)
    assert res["plain_rows_max"] == 2 and res["best_ms"] == {1: 10.0, 2: 10.0, 3: 20.0, 4: 20.0}
    assert all(m.plain_rows_max == 2 for m in model.modules() if isinstance(m, fastcpu.PackedLinear))
    assert res["spread"] == 0.0 and res["noisy"] is False  # identical repeats: a quiet machine


def test_tune_dispatch_reports_each_widths_fastest_round(monkeypatch):
    """Rounds in which a neighbour slowed the one-token forward twice out of three: the median curve would read
    T(2) below T(1); the cost model gets each width's fastest round (profiling.probe_cost), the forward's own cost."""
    import itertools

    from specdec_lesson import profiling

    model = _packed_tiny()
    slow = itertools.cycle([3.0, 3.0, 1.0, 1.0, 3.0, 3.0])  # per call (one path, one round): width 1's slowdown

    def fake_curve(m, context, repeats, ns):
        f = next(slow)
        return {n: 0.010 * (1 + 0.1 * (n - 1)) * (f if n == 1 else 1.0) for n in ns}

    monkeypatch.setattr(profiling, "measure_verify_curve", fake_curve)
    with pytest.warns(UserWarning):
        res = profiling.tune_dispatch(model, widths=(1, 2), repeats=3, verbose=False)
    assert res["best_ms"] == {1: pytest.approx(10.0), 2: pytest.approx(11.0)}
    assert res["plain_ms"][1] == pytest.approx(10.0) and res["packed_ms"][1] == pytest.approx(10.0)


def test_tune_dispatch_warns_when_the_machine_is_busy(monkeypatch):
    """A probe whose repeats disagree (another process on the cores) is flagged and warns; one slow repeat in
    three is not (the median survives it, and quiet machines show such outliers)."""
    import itertools

    from specdec_lesson import profiling

    model = _packed_tiny()

    def probe(factors):
        calls = itertools.count()

        def fake_curve(m, context, repeats, ns):  # each call (one path, one repeat) scaled by the next factor
            f = factors[next(calls) % len(factors)]  # a number, or {width: factor}
            return {n: 0.010 * n * (f.get(n, 1.0) if isinstance(f, dict) else f) for n in ns}

        monkeypatch.setattr(profiling, "measure_verify_curve", fake_curve)
        return profiling.tune_dispatch(model, widths=(1, 2, 4), repeats=3)

    one_outlier = probe([1.0, 1.0, 1.0, 1.0, {4: 1.5}, 1.0])  # one width of one repeat of one path 50% slow
    assert one_outlier["noisy"] is False and one_outlier["spread"] == 0.0
    with pytest.warns(UserWarning, match="rerun on a quiet machine"):
        busy = probe([1.0, 1.0, 3.0, 3.0, 10.0, 10.0])  # repeats 1x, 3x, 10x: a machine under load
    assert busy["noisy"] is True and busy["spread"] > profiling.NOISY_SPREAD
