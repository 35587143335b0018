"""The lean forward (specdec_lesson.lean) against the Hugging Face forward: logits, hidden states, caches, engines.

Tolerances.  Tiny random Llamas (float64 and float32): ATOL = 2e-6 on logits.  The lean forward is not the same
arithmetic as Hugging Face's: fused Q/K/V and gate/up products, F.rms_norm, one SDPA call over grouped queries.
In float32 that moves logits of size ~10 by a few ulps (seen: <= 7e-7).  In float64 Hugging Face's Llama rounds
RMSNorm and the eager softmax through float32 (the lean one does not), so the two agree to ~3e-7 (as in
tests/test_kvcache.py, which uses the same bound for the same reason).  SmolLM2-135M (float32, 30 layers, logits up
to ~35): max |diff| seen 5e-5, required < REAL_ATOL = 5e-4 with the same argmax everywhere; its residual streams
reach ~3e4 (massive activations), so hidden states are compared with rtol 1e-5.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from specdec_lesson import lean as L
from specdec_lesson.drafters import ModelDrafter, noisy_copy
from specdec_lesson.kvcache import SlotCache
from specdec_lesson.lean import LeanSlotCache, UnsupportedModelError, check_supported, lean_model, make_cache
from specdec_lesson.models import default_target_cache_dir, tiny_llama
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.tree import DynamicTree, StaticTree, build_tree, tree_generate

ATOL = 2e-6
REAL_ATOL = 5e-4
V = 64


def _tiny(dtype=torch.float64, seed=0, **cfg):
    return tiny_llama(vocab_size=V, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, seed=seed, dtype=dtype, **cfg)


@torch.inference_mode()
def _alone(model, row: list[int], hidden=None):
    """One row run alone from scratch through Hugging Face: logits [len, V] (and hidden_states[i] for i in hidden)."""
    out = model(input_ids=torch.tensor([row]), output_hidden_states=hidden is not None)
    return out.logits[0], (None if hidden is None else [out.hidden_states[i][0] for i in hidden])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@torch.inference_mode()
def test_ragged_prefill_steps_and_rollback_equal_each_row_alone(dtype):
    """Left-padded prompts of lengths 3, 8, 5 (holes), then two verify-like steps of 5 tokens whose rows keep 1, 5, 3
    and 4, 2, 5 of them (ragged lengths), then a 2-token step: every row's logits and its residual streams entering
    layers 0, 1 and the final normed state (HF hidden_states[0, 1, 2]) equal the row run alone through HF."""
    model, gen = _tiny(dtype), torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in (3, 8, 5)]
    B, Lmax = 3, 8
    ids = torch.tensor([[7] * (Lmax - len(p)) + p for p in prompts])  # [B, Lmax] padding with a real id
    mask = torch.tensor([[False] * (Lmax - len(p)) + [True] * len(p) for p in prompts])  # [B, Lmax]
    state, hist, layers = LeanSlotCache(model, B, "cpu", capacity=8), [list(p) for p in prompts], (0, 1, 2)
    logits, hidden = state.forward(ids, mask, has_holes=True, output_hidden=layers)  # [B, Lmax, V], [B, Lmax, 3H]
    for b in range(B):
        want, hs = _alone(model, hist[b], layers)
        torch.testing.assert_close(logits[b, mask[b]], want, rtol=0, atol=ATOL)
        torch.testing.assert_close(hidden[b, mask[b]], torch.cat(hs, -1), rtol=0, atol=ATOL)
    for keep in ([1, 5, 3], [4, 2, 5]):
        step = torch.randint(0, V, (B, 5), generator=gen)  # [B, K+1]
        since = state.num_slots
        logits, last = state.forward(step, output_hidden=True)  # [B, 5, V], [B, 5, H]
        for b in range(B):
            want, (h,) = _alone(model, hist[b] + step[b].tolist(), (-1,))
            torch.testing.assert_close(logits[b], want[-5:], rtol=0, atol=ATOL)
            torch.testing.assert_close(last[b], h[-5:], rtol=0, atol=ATOL)
            hist[b] += step[b, : keep[b]].tolist()
        state.rollback(since, keep)
        assert state.lengths.tolist() == state.cache.lens == [len(h) for h in hist]
    assert state.cache.capacity >= 8 + 10 + 2  # grew past the capacity asked for
    last = torch.randint(0, V, (B, 2), generator=gen)
    logits, _ = state.forward(last, logits_to_keep=1)  # [B, 1, V]
    for b in range(B):
        torch.testing.assert_close(logits[b], _alone(model, hist[b] + last[b].tolist())[0][-1:], rtol=0, atol=ATOL)


@torch.inference_mode()
def test_holes_anywhere_equal_slot_cache():
    """A step whose invalid tokens sit left, in the middle and at the end of rows (the engines only put them left):
    the valid tokens' logits, and the next step's, equal SlotCache's (which keeps the holes and masks them)."""
    model, gen = _tiny(), torch.Generator().manual_seed(8)
    valid = torch.tensor([[True, False, True, True], [False, False, True, True], [True, True, True, False]])
    states = [LeanSlotCache(model, 3, "cpu"), SlotCache(model, 3, "cpu")]
    steps = [torch.randint(0, V, (3, n), generator=gen) for n in (3, 4, 2)]
    outs = []
    for s in states:
        s.forward(steps[0])
        outs.append([s.forward(steps[1], valid, has_holes=True)[0][valid], s.forward(steps[2])[0]])
    for got, want in zip(*outs):
        torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    assert states[0].lengths.tolist() == states[1].lengths.tolist() == [3 + 3 + 2, 3 + 2 + 2, 3 + 3 + 2]


@torch.inference_mode()
def test_rollback_then_continue_equals_recompute():
    """Prompt, then pending + 4 drafts, keep n + 1 (n = 0..4), continue with 3 tokens: equals HF from scratch."""
    model, gen = _tiny(), torch.Generator().manual_seed(2)
    prompt, drafts, cont = (torch.randint(0, V, (n,), generator=gen).tolist() for n in (9, 4, 3))
    for n in range(5):
        state = LeanSlotCache(model, 1, "cpu")
        state.forward(torch.tensor([prompt[:-1]]))
        since = state.num_slots
        state.forward(torch.tensor([prompt[-1:] + drafts]))
        state.rollback(since, [n + 1])
        assert state.num_slots == int(state.lengths[0]) == len(prompt) + n
        logits, _ = state.forward(torch.tensor([cont]))
        torch.testing.assert_close(logits[0], _alone(model, prompt + drafts[:n] + cont)[0][-3:], rtol=0, atol=ATOL)


@torch.inference_mode()
def test_tree_forward_and_compaction_equal_recompute():
    """Target side: a token tree (block mask, tree positions) over a prompt, then compaction of a root-to-leaf path:
    the next logits equal HF over prompt + path.  Draft side: a ModelDrafter on the lean path builds a tree level by
    level (forward_tree) and commits a path; its next logits equal HF over the committed tokens."""
    model = _tiny()
    prompt = [1, 5, 7, 9, 3, 11]
    gen = torch.Generator().manual_seed(7)
    tree = build_tree(StaticTree((3, 2, 1)), prompt[-1], lambda tr, nodes: torch.randn(len(nodes), V, generator=gen), _greedy())
    leaf = max(range(tree.size), key=lambda v: (tree.depths[v], v))
    path = tree.ancestors(leaf)
    state = LeanSlotCache(model, 1, "cpu")
    state.forward(torch.tensor([prompt[:-1]]))
    since, root = state.num_slots, int(state.lengths[0])
    logits, _ = state.forward(torch.tensor([tree.tokens]), block_mask=tree.mask()[None], positions=tree.positions(root)[None])
    for v in range(tree.size):  # every node's logits = HF over prompt + its path
        seq = prompt[:-1] + [tree.tokens[0]] + tree.path_tokens(v)
        torch.testing.assert_close(logits[0, v], _alone(model, seq)[0][-1], rtol=0, atol=ATOL)
    state.compact(since, [[0] + path])
    assert state.num_slots == int(state.lengths[0]) == root + 1 + len(path)
    nxt, _ = state.forward(torch.tensor([[17]]))
    want = _alone(model, prompt[:-1] + [tree.tokens[0]] + tree.path_tokens(leaf) + [17])[0][-1]
    torch.testing.assert_close(nxt[0, 0], want, rtol=0, atol=ATOL)

    drafter = ModelDrafter(model, lean=True)
    pt = torch.tensor([prompt])
    drafter.begin(pt, torch.ones_like(pt, dtype=torch.bool), None)
    assert isinstance(drafter.state, LeanSlotCache)
    built = build_tree(StaticTree((2, 2)), prompt[-1], drafter.tree_expand, _greedy())
    deep = built.size - 1  # a depth-2 leaf, never fed
    drafter.commit_tree(built, built.ancestors(deep), 42)
    fed = prompt + built.path_tokens(built.parents[deep])
    assert drafter.state.num_slots == len(fed)
    logits, _ = drafter.state.forward(torch.tensor([[built.tokens[deep], 42]]))
    torch.testing.assert_close(logits[0], _alone(model, fed + [built.tokens[deep], 42])[0][-2:], rtol=0, atol=ATOL)


def _greedy():
    from specdec_lesson.sampling import SamplingConfig

    return SamplingConfig(0.0)


@torch.inference_mode()
def test_compact_with_holes_in_a_batch_of_two():
    """compact on 2 rows with paths of different lengths (the shorter row gets holes in the engine's slot map): the
    bookkeeping matches SlotCache's, and each row's next logits equal HF over its kept tokens."""
    model = _tiny()
    rows = [[1, 2, 3], [4, 5, 6]]
    new = [[7, 8, 9, 10, 11], [12, 13, 14, 15, 16]]
    paths = [[0, 2, 4], [1]]
    states = [LeanSlotCache(model, 2, "cpu"), SlotCache(model, 2, "cpu")]
    for s in states:
        s.forward(torch.tensor(rows))
        s.forward(torch.tensor(new), block_mask=torch.eye(5, dtype=torch.bool)[None])  # each sees the prompt + itself
        s.compact(3, paths)
    lean, ref = states
    assert lean.valid.tolist() == ref.valid.tolist() and lean.lengths.tolist() == ref.lengths.tolist() == [6, 4]
    assert lean.holes and lean.num_slots == ref.num_slots == 6
    nxt = torch.tensor([[20], [21]])
    got, want = lean.forward(nxt)[0], ref.forward(nxt)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="slot offsets"):
        lean.compact(3, [[0, 9], [0]])
    with pytest.raises(ValueError, match="valid slots"):
        lean.compact(3, [[0], [2]])  # row 1's slot 3 + 2 is a hole after the compaction above + this forward


def test_pitfall_7_is_planted_in_the_lean_cache_too():
    """pitfalls.buggy_shared_positions also patches LeanSlotCache: inside it the rows that kept fewer slots are off
    (one position counter for the batch), the row that kept all is right; on exit the cache is restored."""
    from specdec_lesson.pitfalls import buggy_shared_positions

    model, gen = _tiny(), torch.Generator().manual_seed(4)
    prompts, step, nxt = (torch.randint(0, V, shape, generator=gen) for shape in ((3, 6), (3, 5), (3, 1)))
    original, errors = LeanSlotCache.forward, {}
    for bug in (False, True):
        with buggy_shared_positions() if bug else torch.inference_mode(), torch.inference_mode():
            state = LeanSlotCache(model, 3, "cpu")
            state.forward(prompts)
            state.forward(step)
            state.rollback(6, [1, 5, 3])
            logits, _ = state.forward(nxt)  # [B, 1, V]
        rows = [prompts[b].tolist() + step[b, :k].tolist() + nxt[b].tolist() for b, k in enumerate([1, 5, 3])]
        errors[bug] = [float((_alone(model, r)[0][-1] - logits[b, -1]).abs().max()) for b, r in enumerate(rows)]
    assert LeanSlotCache.forward is original
    assert max(errors[False]) < ATOL and errors[True][1] < ATOL and min(errors[True][0], errors[True][2]) > 1e-4


@pytest.mark.parametrize("cfg", [{}, {"attention_bias": True, "mlp_bias": True},
                                 {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
                                 {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "rope_theta": 500000.0,
                                                      "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 64}}],
                         ids=["plain", "biases", "rope-linear", "rope-llama3"])
@torch.inference_mode()
def test_config_variants_equal_hf(cfg):
    """Biases on every projection and the static RoPE scalings: a 40-token prefill and 3 decode steps."""
    from transformers import LlamaConfig, LlamaForCausalLM

    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=512, attn_implementation="eager")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**{**base, **cfg})).double().eval()
    for prm in model.parameters():  # a non-zero init for the biases too
        prm.add_(torch.randn(prm.shape, dtype=prm.dtype, generator=torch.Generator().manual_seed(1)) * 0.02)
    row = torch.randint(0, V, (43,), generator=torch.Generator().manual_seed(4)).tolist()
    state = LeanSlotCache(model, 1, "cpu")
    got = [state.forward(torch.tensor([row[:40]]))[0][0]] + [state.forward(torch.tensor([[t]]))[0][0] for t in row[40:]]
    torch.testing.assert_close(torch.cat(got), _alone(model, row)[0], rtol=0, atol=ATOL)


def test_engines_on_the_lean_path_equal_the_hf_path():
    """Greedy: autoregressive, speculative (K = 1, 3; a close Llama draft, also lean) on a ragged batch, and tree
    decoding, give the same tokens on both paths.  Sampled (T = 1, same seed): the same tokens too (the laws differ
    by ~1e-7, so a draw lands on the other side of a boundary with probability ~1e-5 per run)."""
    target = _tiny()
    draft = noisy_copy(target, 0.1, 3)
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41, 42, 43]]
    ar = {lean: autoregressive_generate(target, prompts, 20, lean=lean)[0] for lean in (False, True)}
    rows = [[x.tolist() for x in ar[False]]]
    assert [x.tolist() for x in ar[True]] == rows[0]
    for k in (1, 3):
        for lean in (False, True):
            out, stats = speculative_generate(target, draft, prompts, 20, k=k, lean=lean)
            assert [x.tolist() for x in out] == rows[0]
            assert stats.accept_hist[0] > 0 and stats.accept_hist[k] > 0  # rejections and full acceptances
        sampled = [speculative_generate(target, draft, prompts, 20, k=k, temperature=1.0, lean=lean,
                                        generator=torch.Generator().manual_seed(5))[0] for lean in (False, True)]
        assert [x.tolist() for x in sampled[0]] == [x.tolist() for x in sampled[1]]
    for spec in (StaticTree((3, 2, 1)), DynamicTree(depth=4, topk=3, num_nodes=8)):
        out, _ = tree_generate(target, draft, [prompts[0]], 20, tree=spec, lean=True)
        assert out[0].tolist() == rows[0][0]


def test_make_cache_switch_and_fallback_for_unsupported_models():
    """make_cache: lean only when asked (lean=True, or LEAN_BY_DEFAULT) for a supported model; an unsupported model
    raises ONE UnsupportedModelError in check_supported, and the engine falls back to the HF path (a warning when
    lean=True was explicit) with the same tokens."""
    from transformers import GPT2Config, GPT2LMHeadModel

    llama = _tiny()
    assert type(make_cache(llama, 1, "cpu")) is (LeanSlotCache if L.slots.LEAN_BY_DEFAULT else SlotCache)
    assert type(make_cache(llama, 1, "cpu", lean=True)) is LeanSlotCache
    assert type(make_cache(llama, 1, "cpu", lean=True, paged=True)) is SlotCache  # paged keeps the HF path
    assert type(make_cache(llama, 1, "cpu", lean=False)) is SlotCache
    with pytest.raises(ValueError, match="lean must be True, False or None"):
        make_cache(llama, 1, "cpu", lean="yes")
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(UnsupportedModelError, match="LlamaForCausalLM models only, got GPT2LMHeadModel.*lean=False"):
        check_supported(gpt2)
    gelu = _tiny()
    gelu.config.hidden_act = "gelu"
    with pytest.raises(UnsupportedModelError, match="hidden_act 'gelu'"):
        lean_model(gelu)
    with pytest.warns(UserWarning, match="LlamaForCausalLM models only"):
        assert type(make_cache(gpt2, 1, "cpu", lean=True)) is SlotCache
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert type(make_cache(gpt2, 1, "cpu", lean=None)) is SlotCache  # the default falls back silently
    with pytest.warns(UserWarning):
        out, _ = speculative_generate(gpt2, gpt2, [[1, 2, 3]], 6, k=2, lean=True)
    assert out[0].tolist() == autoregressive_generate(gpt2, [[1, 2, 3]], 6)[0][0].tolist()


def test_lean_model_is_cached_and_rebuilt_when_a_weight_changes():
    """(Weights that are inference tensors, made under torch.inference_mode, have no version counter: an in-place
    change of one is not seen, as in fastcpu.PackedLinear.)"""
    model = _tiny()  # made outside inference mode: its weights have version counters
    first = lean_model(model)
    assert lean_model(model) is first
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.weight.mul_(1.5)  # in place: the fused QKV copy is stale
    second = lean_model(model)
    assert second is not first
    model.model.layers[0].mlp.up_proj.weight = torch.nn.Parameter(torch.zeros(64, 32, dtype=torch.float64))  # replaced
    assert lean_model(model) is not second
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    with torch.inference_mode():
        got = LeanSlotCache(model, 1, "cpu").forward(ids)[0][0]
    torch.testing.assert_close(got, _alone(model, ids[0].tolist())[0], rtol=0, atol=ATOL)
    with pytest.raises(ValueError, match="output_hidden layer indices"):
        LeanSlotCache(model, 1, "cpu").forward(ids, output_hidden=(3,))
    with pytest.raises(ValueError, match="keep must list"):
        state = LeanSlotCache(model, 1, "cpu")
        state.forward(ids)
        state.rollback(0, [7])


@torch.inference_mode()
def test_prepacked_model_keeps_its_per_width_dispatch():
    """A model whose linears are pre-packed (fastcpu): the lean copy packs its fused weights, reads the model's
    plain_rows_max at every lean_model call, and gives the HF logits at widths on either side of the threshold."""
    from specdec_lesson.fastcpu import packed_linear_available, prepack_linears, set_plain_rows

    if not packed_linear_available():
        pytest.skip("oneDNN pre-packed linear unavailable in this build")
    model = prepack_linears(_tiny(torch.float32))
    set_plain_rows(model, 2)
    lean = lean_model(model)
    assert lean.packed and lean.plain_rows_max == 2 and lean.layers[0].qkv.packed is not None
    set_plain_rows(model, 0)
    assert lean_model(model) is lean and lean.plain_rows_max == 0
    set_plain_rows(model, 2)
    row = torch.randint(0, V, (12,), generator=torch.Generator().manual_seed(6)).tolist()
    state = LeanSlotCache(model, 1, "cpu")
    got = [state.forward(torch.tensor([row[:8]]))[0][0]]  # 8 rows: packed
    got += [state.forward(torch.tensor([row[8:9]]))[0][0], state.forward(torch.tensor([row[9:]]))[0][0]]  # 1, 3 rows
    torch.testing.assert_close(torch.cat(got), _alone(model, row)[0], rtol=0, atol=1e-5)


def test_tune_lean_dispatch_picks_the_faster_weights_per_width(monkeypatch):
    """With timings faked so that plain weights win up to 2 rows, the lean copy's threshold becomes 2 and stays (no
    longer inherited from the model's PackedLinears); a real probe on the tiny model returns a time per width."""
    from specdec_lesson.fastcpu import packed_linear_available, prepack_linears
    from specdec_lesson.lean import model as lean_mod

    if not packed_linear_available():
        pytest.skip("oneDNN pre-packed linear unavailable in this build")
    model = prepack_linears(_tiny(torch.float32))
    real = lean_mod.lean_verify_curve(model, [1, 3], context=8)
    assert set(real) == {1, 3} and all(len(v) == 1 and v[0] > 0 for v in real.values())

    def fake(model, ns, context=128, rounds=1, warmup=True):
        assert isinstance(model, lean_mod.LeanLlama)  # timed as it is set, not re-read from the Hugging Face model
        plain = model.plain_rows_max > 0
        return {n: [(1.0 if n <= 2 else 3.0) if plain else 2.0] for n in ns}

    monkeypatch.setattr(lean_mod, "lean_verify_curve", fake)
    res = lean_mod.tune_lean_dispatch(model, widths=(1, 2, 3, 4), repeats=3)
    assert res["plain_rows_max"] == 2 and res["best_ms"] == {1: 1e3, 2: 1e3, 3: 2e3, 4: 2e3} and not res["noisy"]
    assert lean_model(model).plain_rows_max == 2  # kept, although the model's PackedLinears say 0

    def noisy(model, ns, context=128, rounds=1, warmup=True):  # a neighbour slowed one-token forwards in 2 rounds of 3
        noisy.calls += 1
        return {n: [(3.0 if n == 1 and noisy.calls % 3 else 1.0) * (1 + 0.1 * n)] for n in ns}

    noisy.calls = 0
    monkeypatch.setattr(lean_mod, "lean_verify_curve", noisy)
    with pytest.warns(UserWarning):
        res = lean_mod.tune_lean_dispatch(model, widths=(1, 2), repeats=3)
    assert res["best_ms"] == {1: pytest.approx(1.1e3), 2: pytest.approx(1.2e3)}  # each width's fastest round

    def dipping(model, ns, context=128, rounds=1, warmup=True):  # the first 3 rounds' one-token forwards all slowed
        dipping.calls += 1
        return {n: [(1.5 if n == 1 and dipping.calls <= 6 else 1.0) * (1 + 0.1 * n)] for n in ns}

    dipping.calls = 0
    monkeypatch.setattr(lean_mod, "lean_verify_curve", dipping)
    res = lean_mod.tune_lean_dispatch(model, widths=(1, 2, 4), repeats=3)  # no spread: the dip asks for more rounds
    assert dipping.calls == 2 * 12 and res["spread"] == 0.0 and not res["noisy"]
    assert res["best_ms"] == {1: pytest.approx(1.1e3), 2: pytest.approx(1.2e3), 4: pytest.approx(1.4e3)}


@pytest.mark.skipif(not default_target_cache_dir().exists(), reason="default target not converted in ~/.cache/specdec_lesson")
def test_real_target_logits_hidden_and_greedy_outputs():
    """SmolLM2-135M-Instruct (fp32): a ragged left-padded prefill, two verify steps with ragged rollbacks and a decode
    step give the HF logits (< REAL_ATOL, same argmax) and residual streams; greedy autoregressive and speculative
    decoding (the shipped EAGLE-style draft, which reads layers 2, 15, 27) emit the HF path's tokens."""
    from specdec_lesson.drafters.eagle import load_default_draft
    from specdec_lesson.models import load_default_target

    model, tok = load_default_target(verbose=False)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=gen)  # [2, 24]
    mask = torch.ones(2, 24, dtype=torch.bool)
    mask[0, :7] = False
    layers = (2, 15, 27)
    with torch.inference_mode():
        a, b = SlotCache(model, 2, "cpu"), LeanSlotCache(model, 2, "cpu")
        outs = [s.forward(ids, mask, has_holes=True, output_hidden=layers) for s in (a, b)]
        steps = [(torch.randint(0, model.config.vocab_size, (2, 5), generator=gen), keep) for keep in ([2, 5], [5, 1])]
        for nxt, keep in steps + [(torch.tensor([[11], [12]]), None)]:
            since = a.num_slots
            outs += [s.forward(nxt, output_hidden=True) for s in (a, b)]
            if keep:
                a.rollback(since, keep)
                b.rollback(since, keep)
    for i in range(0, len(outs), 2):
        (la, ha), (lb, hb) = outs[i], outs[i + 1]
        m = mask if i == 0 else torch.ones(la.shape[:2], dtype=torch.bool)
        assert (la - lb)[m].abs().max() < REAL_ATOL and torch.equal(la[m].argmax(-1), lb[m].argmax(-1))
        torch.testing.assert_close(hb[m], ha[m], rtol=1e-5, atol=1e-3)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in ("def fibonacci(n):", "The capital of France is")]
    for lean in (False, True):
        ar, _ = autoregressive_generate(model, prompts, 12, lean=lean)
        spec, stats = speculative_generate(model, load_default_draft(model), prompts, 12, k=3, lean=lean)
        if not lean:
            ref = [x.tolist() for x in ar]
        assert [x.tolist() for x in ar] == [x.tolist() for x in spec] == ref
        assert stats.accepted > 0


def test_decode_breakdown_parts_and_floors():
    """decode_breakdown: the three timed parts plus the rest add up to the whole step; each floor is its bytes over the
    bandwidth (the projections' bytes are every layer's fused weights, the head's the tied embedding); bad input fails."""
    from specdec_lesson.lean import decode_breakdown

    model = _tiny(torch.float32)
    lean = lean_model(model)
    bw = 1e10
    res = decode_breakdown(model, bw, context=16, repeats=3)
    parts = res["parts"]
    assert set(parts) == {"projections", "attention", "lm_head", "rest"}
    assert abs(sum(p["ms"] for p in parts.values()) - res["total_ms"]) < 1e-9
    assert all(parts[k]["ms"] > 0 for k in ("projections", "attention", "lm_head")) and res["total_ms"] > 0
    cfg = model.config
    per_layer = (cfg.hidden_size * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * lean.head_dim
                 + cfg.num_attention_heads * lean.head_dim * cfg.hidden_size + 3 * cfg.hidden_size * cfg.intermediate_size)
    assert parts["projections"]["bytes"] == cfg.num_hidden_layers * per_layer * 4
    assert parts["lm_head"]["bytes"] == cfg.vocab_size * cfg.hidden_size * 4
    assert parts["attention"]["bytes"] == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * 17 * lean.head_dim * 4
    for p in parts.values():
        assert p["floor_ms"] == pytest.approx(p["bytes"] / bw * 1e3)
    with pytest.raises(ValueError, match="bandwidth"):
        decode_breakdown(model, 0.0)
    with pytest.raises(ValueError, match="context and repeats"):
        decode_breakdown(model, bw, context=0)
