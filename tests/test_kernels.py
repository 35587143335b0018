"""Triton kernels against their torch references, on CPU under TRITON_INTERPRET=1.

The interpreter runs programs one after another (~15-70 ms each), so cases use few programs
with large blocks; "many random seeds" are many independent batch rows in one launch.
Verification is compared BIT FOR BIT with the library function; tree attention within a
stated float tolerance; compaction exactly.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import specdec_lesson.kernels as K
from specdec_lesson.kernels import compact_kv_triton, tree_attention_triton, verify_chain_triton
from specdec_lesson.kernels.reference import build_tree_mask, compact_kv, tree_attention
from specdec_lesson.verify import draw_verify_randoms, verify_chain, verify_chain_from_randoms

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- package plumbing


def test_importing_the_library_never_imports_triton():
    code = "import sys, specdec_lesson, specdec_lesson.verify, specdec_lesson.sampling; print('triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_exports_and_availability():
    assert callable(verify_chain_triton) and callable(tree_attention_triton) and callable(compact_kv_triton)
    assert K.kernels_available() == (torch.cuda.is_available() and K.triton_importable())
    if not torch.cuda.is_available():
        assert os.environ.get("TRITON_INTERPRET") == "1"
    with pytest.raises(AttributeError):
        K.no_such_kernel  # noqa: B018


# ---------------------------------------------------------------- fused verification


def _laws(B, K, V, gen, dtype, sharp=3.0):
    t_logits = torch.randn(B, K + 1, V, generator=gen, dtype=torch.float64) * sharp  # [B, K+1, V]
    d_logits = t_logits[:, :K] + torch.randn(B, K, V, generator=gen, dtype=torch.float64) * 0.7  # [B, K, V]
    return torch.softmax(t_logits, -1).to(dtype), torch.softmax(d_logits, -1).to(dtype)


def _sample_tokens(draft_probs, gen):
    B, K, V = draft_probs.shape
    return torch.multinomial(draft_probs.double().reshape(B * K, V), 1, generator=gen).reshape(B, K)  # [B, K]


def _assert_same(args, **kw):
    n_ref, tok_ref = verify_chain_from_randoms(*args)
    n, tok = verify_chain_triton(*args, **kw)
    assert n.dtype == tok.dtype == torch.int64
    assert torch.equal(n, n_ref), (n, n_ref)
    assert torch.equal(tok, tok_ref), (tok, tok_ref)
    return n_ref


@pytest.mark.parametrize(
    "B,K,V,dtype,block_v,splits",
    [
        (48, 4, 1000, torch.float32, None, 1),  # 48 independent rows = 48 random cases, one launch
        (1, 1, 1000, torch.float32, None, 1),  # B = 1, K = 1
        (6, 1, 3001, torch.float64, 512, 1),  # V not a multiple of the block, several chunks
        (4, 8, 4099, torch.float32, 1024, 1),
        (8, 3, 1500, torch.bfloat16, 512, 1),
        (8, 3, 1500, torch.float16, 512, 1),
        (6, 3, 3001, torch.float32, 512, 4),  # vocabulary split over 4 programs per row
        (3, 2, 1000, torch.bfloat16, 256, 2),
        (2, 1, 700, torch.float64, 512, 8),  # more splits asked than blocks: fewer used
    ],
)
def test_verify_bit_equal_random(B, K, V, dtype, block_v, splits):
    gen = torch.Generator().manual_seed(1000 * K + V)
    target_probs, draft_probs = _laws(B, K, V, gen, dtype)
    draft_tokens = _sample_tokens(draft_probs, gen)
    uniforms, exponentials = draw_verify_randoms(B, K, V, dtype=dtype, generator=gen)
    n = _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials), block_v=block_v, splits=splits)
    if B >= 48:
        assert len(set(n.tolist())) >= 3  # the random rows exercise several acceptance lengths


def test_verify_bit_equal_over_many_seeds():
    """24 seeds, each its own random (B, K, V, sharpness): 24 launches, 180 rows in all."""
    meta = torch.Generator().manual_seed(2024)
    rows, lengths = 0, set()
    for seed in range(24):
        B, K = int(torch.randint(1, 13, (1,), generator=meta)), int(torch.randint(1, 9, (1,), generator=meta))
        V = int(torch.randint(500, 5000, (1,), generator=meta))
        sharp = float(torch.empty(1).uniform_(0.5, 6.0, generator=meta))
        gen = torch.Generator().manual_seed(seed)
        target_probs, draft_probs = _laws(B, K, V, gen, torch.float32, sharp=sharp)
        draft_tokens = _sample_tokens(draft_probs, gen)
        uniforms, exponentials = draw_verify_randoms(B, K, V, generator=gen)
        n = _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials))
        rows += B
        lengths |= {(int(a), K) for a in n}
    assert any(a == k for a, k in lengths) and any(0 < a < k for a, k in lengths) and any(a == 0 for a, _ in lengths)


def test_verify_rejection_forced_at_each_position_all_and_none_accepted():
    """Row j (j = 0..K) has q = p up to position j, and p(x_j) = 0 at position j: n = j exactly.
    Row K accepts everything (bonus from p_K with q = 0)."""
    K, V, reps = 5, 1200, 4
    gen = torch.Generator().manual_seed(7)
    B = (K + 1) * reps
    target_probs, draft_probs = _laws(B, K, V, gen, torch.float32)
    draft_probs = target_probs[:, :K].clone()  # q = p: every draft with p(x) > 0 is accepted
    draft_tokens = _sample_tokens(draft_probs, gen)
    for b in range(B):
        j = b % (K + 1)
        if j < K:
            x = int(draft_tokens[b, j])
            target_probs[b, j, x] = 0.0  # p(x_j) = 0 rejects for sure
            target_probs[b, j] /= target_probs[b, j].sum()
            draft_probs[b, j] = torch.softmax(torch.randn(V, generator=gen), -1)  # residual is non-trivial
    uniforms, exponentials = draw_verify_randoms(B, K, V, generator=gen)
    n = _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials))
    assert n.tolist() == [b % (K + 1) for b in range(B)]


def test_verify_all_zero_residual_guard_and_one_hot_draft():
    """Rejection where p == q (residual max(0, p - q) all zero: the 0/0 pitfall): falls back to p.
    Rows 2-3: a greedy (one-hot) draft."""
    K, V = 2, 1000
    gen = torch.Generator().manual_seed(3)
    target_probs, _ = _laws(4, K, V, gen, torch.float32)
    target_probs[:2, 0, 17] = 0.0
    target_probs[:2, 0] /= target_probs[:2, 0].sum(-1, keepdim=True)
    draft_probs = target_probs[:, :K].clone()  # [4, K, V]
    draft_tokens = torch.full((4, K), 17)
    draft_tokens[2:] = target_probs[2:, :K].argmax(-1)
    draft_probs[2:] = torch.zeros(2, K, V).scatter_(-1, draft_tokens[2:].unsqueeze(-1), 1.0)  # one-hot q
    uniforms, exponentials = draw_verify_randoms(4, K, V, generator=gen)
    # rows 0-1: q(17) = p(17) = 0 -> u*0 < 0 is False -> rejected at 0 with p == q everywhere
    for splits in (1, 2):
        n = _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials), block_v=256, splits=splits)
        assert n[:2].tolist() == [0, 0]


def test_verify_ties_resolve_to_lowest_index_across_chunks():
    K, V = 1, 3000
    target_probs = torch.zeros(2, K + 1, V)
    for pos in (5, 1100, 2900):  # equal weights in three different 512-chunks
        target_probs[:, :, pos] = 1 / 3
    draft_probs = torch.zeros(2, K, V)
    draft_probs[:, :, 7] = 1.0  # p(7) = 0: rejected, residual = p
    draft_tokens = torch.full((2, K), 7)
    uniforms = torch.full((2, K), 0.5)
    exponentials = torch.ones(2, V)  # every ratio ties
    exponentials[1, 5] = 2.0  # row 1: index 5 loses, 1100 wins the tie with 2900
    for splits in (1, 4):  # ties inside a program's slice and between slices
        n, tok = verify_chain_triton(target_probs, draft_probs, draft_tokens, uniforms, exponentials, block_v=512, splits=splits)
        assert tok.tolist() == [5, 1100] and n.tolist() == [0, 0]
        _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials), block_v=512, splits=splits)


def test_verify_matches_verify_chain_with_same_generator():
    B, K, V = 4, 3, 1000
    gen = torch.Generator().manual_seed(11)
    target_probs, draft_probs = _laws(B, K, V, gen, torch.float32)
    draft_tokens = _sample_tokens(draft_probs, gen)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    n_ref, tok_ref = verify_chain(target_probs, draft_probs, draft_tokens, g1)
    u, e = draw_verify_randoms(B, K, V, generator=g2)
    n, tok = verify_chain_triton(target_probs, draft_probs, draft_tokens, u, e)
    assert torch.equal(n, n_ref) and torch.equal(tok, tok_ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_verify_half_precision_laws_are_their_fp32_renormalisation(dtype):
    """bf16 / fp16 laws (rows off 1 by their rounding) give bit for bit what their fp32
    renormalisation p / sum p, q / sum q gives, in the kernel and in the reference, with fp32
    random numbers (draw_verify_randoms never makes half-precision ones)."""
    B, K, V = 6, 3, 1500
    gen = torch.Generator().manual_seed(21)
    target_probs, draft_probs = _laws(B, K, V, gen, dtype)
    draft_tokens = _sample_tokens(draft_probs, gen)
    uniforms, exponentials = draw_verify_randoms(B, K, V, dtype=dtype, generator=gen)
    assert uniforms.dtype == exponentials.dtype == torch.float32
    fp32 = [t.float() / t.float().sum(-1, keepdim=True) for t in (target_probs, draft_probs)]
    n, tok = verify_chain_triton(target_probs, draft_probs, draft_tokens, uniforms, exponentials, block_v=512)
    n32, tok32 = verify_chain_triton(*fp32, draft_tokens, uniforms, exponentials, block_v=512)
    assert torch.equal(n, n32) and torch.equal(tok, tok32)
    _assert_same((target_probs, draft_probs, draft_tokens, uniforms, exponentials), block_v=512)


def test_verify_mixed_dtypes_and_empty_batch():
    """Inputs of different float dtypes are brought to one precision (fp64 if any is fp64) by the
    wrapper as by the reference; a batch of 0 rows returns empty tensors without a launch."""
    B, K, V = 3, 2, 700
    gen = torch.Generator().manual_seed(22)
    target_probs, draft_probs = _laws(B, K, V, gen, torch.float32)
    draft_tokens = _sample_tokens(draft_probs, gen)
    uniforms, exponentials = draw_verify_randoms(B, K, V, dtype=torch.float64, generator=gen)
    _assert_same((target_probs.bfloat16(), draft_probs, draft_tokens, uniforms.float(), exponentials.float()), block_v=256)
    _assert_same((target_probs, draft_probs.double(), draft_tokens, uniforms, exponentials.float()), block_v=256)
    n, tok = verify_chain_triton(torch.zeros(0, K + 1, V), torch.zeros(0, K, V), torch.zeros(0, K, dtype=torch.long),
                                 torch.zeros(0, K), torch.ones(0, V))
    assert n.shape == tok.shape == (0,) and n.dtype == tok.dtype == torch.int64


def test_verify_bad_inputs_raise_one_clear_error():
    tp, dp = torch.full((1, 3, 10), 0.1), torch.full((1, 2, 10), 0.1)
    tok, u, e = torch.zeros(1, 2, dtype=torch.long), torch.rand(1, 2), torch.ones(1, 10)
    with pytest.raises(ValueError, match="draft_probs"):
        verify_chain_triton(tp, dp[:, :1], tok, u, e)
    with pytest.raises(ValueError, match="exponentials"):
        verify_chain_triton(tp, dp, tok, u, e[:, :5])
    with pytest.raises(ValueError, match="dtype"):  # half-precision random numbers are refused (biased)
        verify_chain_triton(tp, dp, tok, u.bfloat16(), e)
    with pytest.raises(ValueError, match="dtype"):
        verify_chain_triton(tp, dp, tok, u, e.half())
    with pytest.raises(ValueError, match="dtype"):
        verify_chain_triton(tp.long(), dp, tok, u, e)
    with pytest.raises(ValueError, match="integer"):
        verify_chain_triton(tp, dp, tok.float(), u, e)
    with pytest.raises(ValueError, match="splits"):
        verify_chain_triton(tp, dp, tok, u, e, splits=3)
    with pytest.raises(ValueError, match="K\\+1"):
        verify_chain_triton(tp[:, :1], dp[:, :0], tok[:, :0], u[:, :0], e)


# ---------------------------------------------------------------- tree attention

# tolerance against the fp32 reference (SDPA on fp32 copies of the same inputs)
ATTN_TOL = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def _random_tree(N, gen):
    tree = torch.eye(N, dtype=torch.bool)  # [N, N]
    for i in range(1, N):
        tree[i] |= tree[int(torch.randint(0, i, (1,), generator=gen))]  # parent < i
    return tree


@pytest.mark.parametrize(
    "B,H,Hkv,N,P,D,dtype",
    [
        (2, 4, 2, 7, 45, 64, torch.float32),  # GQA 2, S = 52 not a multiple of the key block
        (1, 2, 2, 13, 120, 128, torch.float32),  # B = 1, plain MHA, D = 128, several key blocks
        (1, 8, 2, 5, 30, 64, torch.float32),  # GQA 4
        (2, 4, 1, 9, 40, 64, torch.float16),
        (1, 2, 1, 6, 70, 128, torch.bfloat16),
    ],
)
def test_tree_attention_matches_sdpa(B, H, Hkv, N, P, D, dtype):
    gen = torch.Generator().manual_seed(N * 100 + P)
    S = P + N
    q = torch.randn(B, H, N, D, generator=gen).to(dtype)  # [B, H, N, D]
    k = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)  # [B, Hkv, S, D]
    v = torch.randn(B, Hkv, S, D, generator=gen).to(dtype)  # [B, Hkv, S, D]
    prefix = torch.ones(B, P, dtype=torch.bool)  # [B, P]
    prefix[:, : P // 3] = torch.rand(B, P // 3, generator=gen) > 0.5  # left padding / freed slots
    mask = build_tree_mask(prefix, _random_tree(N, gen))  # [B, N, S]
    out = tree_attention_triton(q, k, v, mask)
    ref = tree_attention(q.float(), k.float(), v.float(), mask)
    assert out.dtype == dtype and out.shape == (B, H, N, D)
    err = (out.float() - ref).abs().max().item()
    assert err <= ATTN_TOL[dtype], err
    if dtype == torch.float32:  # also against the reference on the very same tensors, with a scale
        torch.testing.assert_close(tree_attention_triton(q, k, v, mask, scale=0.3), tree_attention(q, k, v, mask, scale=0.3),
                                   atol=1e-5, rtol=1e-5)


def test_tree_attention_fully_masked_row_is_zero_and_bad_inputs():
    q, k, v = torch.randn(1, 2, 3, 64), torch.randn(1, 2, 10, 64), torch.randn(1, 2, 10, 64)
    mask = torch.ones(1, 3, 10, dtype=torch.bool)
    mask[0, 1] = False
    out = tree_attention_triton(q, k, v, mask)
    assert torch.equal(out[:, :, 1], torch.zeros(1, 2, 64))
    ref = tree_attention(q, k, v, mask)
    torch.testing.assert_close(out[:, :, [0, 2]], ref[:, :, [0, 2]], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="mask"):
        tree_attention_triton(q, k, v, mask.float())
    with pytest.raises(ValueError, match="multiple"):
        tree_attention_triton(torch.randn(1, 3, 3, 64), k, v, mask)
    with pytest.raises(ValueError, match="keys and values"):
        tree_attention_triton(q, k, v[:, :, :5], mask)


def test_build_tree_mask_layout():
    prefix = torch.tensor([[False, True, True]])
    tree = torch.tensor([[1, 0], [1, 1]], dtype=torch.bool)
    m = build_tree_mask(prefix, tree)
    assert m.tolist() == [[[False, True, True, True, False], [False, True, True, True, True]]]


# ---------------------------------------------------------------- KV compaction


def _naive_compact(keys, values, src_index, dst_start, n_valid):
    k_old, v_old = keys.clone(), values.clone()
    for b in range(keys.shape[0]):
        for i in range(int(n_valid[b])):
            keys[b, :, int(dst_start[b]) + i] = k_old[b, :, int(src_index[b, i])]
            values[b, :, int(dst_start[b]) + i] = v_old[b, :, int(src_index[b, i])]


@pytest.mark.parametrize("B,H,S,D,dtype", [(1, 2, 40, 64, torch.float32), (4, 3, 50, 128, torch.bfloat16)])
def test_compact_kv_matches_reference_exactly(B, H, S, D, dtype):
    gen = torch.Generator().manual_seed(S)
    keys = torch.randn(B, H, S, D, generator=gen).to(dtype)  # [B, H, S, D]
    values = torch.randn(B, H, S, D, generator=gen).to(dtype)
    N = 6
    src_index = torch.zeros(B, N, dtype=torch.long)  # [B, N]
    dst_start = torch.zeros(B, dtype=torch.long)
    n_valid = torch.zeros(B, dtype=torch.long)
    cases = [  # (src, dst_start, n_valid): tree path, all of N, none, overlap both ways, unsorted
        ([30, 32, 33, 36, 37, 39], 30, 6),
        ([20, 21, 22, 0, 0, 0], 22, 3),  # destinations after the sources, overlapping
        ([5, 6, 7, 8, 9, 10], 12, 0),  # nothing to move
        ([13, 2, 9, 9, 0, 0], 9, 4),  # arbitrary, with a repeated source
    ]
    for b in range(B):
        src, ds, nv = cases[b % len(cases)] if B > 1 else cases[0]
        src_index[b] = torch.tensor(src)
        dst_start[b], n_valid[b] = ds, nv
    k1, v1 = keys.clone(), values.clone()
    _naive_compact(k1, v1, src_index, dst_start, n_valid)
    k2, v2 = keys.clone(), values.clone()
    assert compact_kv(k2, v2, src_index, dst_start, n_valid) == (k2, v2)
    k3, v3 = keys.clone(), values.clone()
    compact_kv_triton(k3, v3, src_index, dst_start, n_valid)
    assert torch.equal(k2, k1) and torch.equal(v2, v1)  # reference == naive loop
    assert torch.equal(k3, k1) and torch.equal(v3, v1)  # kernel == reference, bit for bit


def test_compact_kv_bad_inputs():
    k, v = torch.zeros(2, 1, 8, 4), torch.zeros(2, 1, 8, 4)
    src, ds, nv = torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long), torch.ones(2, dtype=torch.long)
    for fn in (compact_kv, compact_kv_triton):
        with pytest.raises(ValueError, match="src_index"):
            fn(k, v, src.int(), ds, nv)
        with pytest.raises(ValueError, match="n_valid"):
            fn(k, v, src, ds, nv + 5)
        with pytest.raises(ValueError, match="destination"):
            fn(k, v, src, ds + 7, nv + 1)
        with pytest.raises(ValueError, match="src_index entries"):
            fn(k, v, src + 8, ds, nv)


# ---------------------------------------------------------------- GPU code path, checked without a GPU

_COMPILE_CHECK = textwrap.dedent(
    r"""
    import os, re
    os.environ["TRITON_INTERPRET"] = "0"
    import triton
    from triton.compiler import ASTSource
    from triton.backends.compiler import GPUTarget
    from specdec_lesson.kernels.verify_chain import _verify_chain_kernel
    from specdec_lesson.kernels.tree_attention import _tree_attention_kernel
    from specdec_lesson.kernels.compaction import _compact_kv_kernel
    target = GPUTarget("cuda", 90, 32)
    def build(fn, sig, consts, nw=8):
        attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}
        return triton.compile(ASTSource(fn, sig, consts, attrs), target=target, options={"num_warps": nw})
    def sig_of(names, types):
        return dict(zip(names.split(), types))
    v_names = ("target_ptr draft_ptr tokens_ptr uniforms_ptr expo_ptr num_accepted_ptr next_token_ptr "
               "part_val_ptr part_idx_ptr part_any_ptr counter_ptr K V V_PER_SPLIT "
               "stride_tb stride_tk stride_db stride_dk stride_xb stride_ub stride_eb "
               "BLOCK_K BLOCK_V NUM_STAGES SPLITS IS_F64")
    for dt, f64, splits in (("fp32", False, 1), ("fp64", True, 1), ("fp32", False, 4)):  # the wrapper upcasts fp16 / bf16
        ct = "fp64" if f64 else "fp32"
        types = ["*" + dt] * 2 + ["*i64", "*" + dt, "*" + dt, "*i64", "*i64", "*" + ct, "*i64", "*i32", "*i32"]
        sig = sig_of(v_names, types + ["i32"] * 10 + ["constexpr"] * 5)
        consts = {"BLOCK_K": 8, "BLOCK_V": 4096, "NUM_STAGES": 3, "SPLITS": splits, "IS_F64": f64}
        ptx = build(_verify_chain_kernel, sig, consts).asm["ptx"]
        if dt == "fp32":
            assert "div.rn.f32" in ptx and "div.full" not in ptx and "div.approx" not in ptx, "division is not IEEE"
            assert "fma." not in ptx, "a fused multiply-add would change the accept test's rounding"
            assert "cp.async" in ptx, "the vocabulary loop is not pipelined"
        if splits > 1:
            assert re.search(r"atom\.[a-z.]*(gpu\.acq_rel|acq_rel\.gpu)", ptx), "the arrival counter is not an acq_rel atomic"
            assert "ld.volatile" in ptx, "partials may be read from a stale L1 line"
    a_names = ("q_ptr k_ptr v_ptr mask_ptr out_ptr N S Hkv qk_scale sqb sqh sqn sqd skb skh sks skd svb svh svs svd "
               "smb smn sms sob soh son sod G D BLOCK_M BLOCK_N BLOCK_D F32_DOTS")
    for dt, f32d in (("fp32", True), ("bf16", False)):
        sig = sig_of(a_names, ["*" + dt] * 3 + ["*u8", "*" + dt] + ["i32"] * 3 + ["fp32"] + ["i32"] * 19 + ["constexpr"] * 6)
        build(_tree_attention_kernel, sig, {"G": 4, "D": 128, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_D": 128, "F32_DOTS": f32d})
    c_names = "k_ptr v_ptr src_ptr dst_start_ptr n_valid_ptr H skb skh sks skd svb svh svs svd s_src_b s_src_n D BLOCK_N BLOCK_D"
    sig = sig_of(c_names, ["*bf16"] * 2 + ["*i64"] * 3 + ["i32"] * 11 + ["constexpr"] * 3)
    ptx = build(_compact_kv_kernel, sig, {"D": 128, "BLOCK_N": 8, "BLOCK_D": 128}, nw=4).asm["ptx"]
    assert "bar.sync" in ptx, "the gather-before-scatter barrier is missing"
    print("compiled")
    """
)


def test_kernels_compile_for_sm90_without_a_gpu():
    """Lower every kernel to an sm_90 cubin with triton's bundled ptxas (no GPU needed) and check
    the properties bit-exactness relies on: IEEE division, no FMA contraction in the accept test."""
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except Exception as exc:  # pragma: no cover - triton without the NVIDIA backend
        pytest.skip(f"triton NVIDIA backend unavailable: {exc}")
    env = {**os.environ, "TRITON_INTERPRET": "0", "PYTHONPATH": REPO}
    out = subprocess.run([sys.executable, "-c", _COMPILE_CHECK], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "compiled" in out.stdout, out.stderr[-3000:]


# ---------------------------------------------------------------- benchmark script


def test_bench_without_cuda_exits_zero(capsys):
    from specdec_lesson.kernels import bench

    if torch.cuda.is_available():  # pragma: no cover
        pytest.skip("CUDA present: the real benchmark would run")
    assert bench.main([]) == 0
    assert "needs CUDA" in capsys.readouterr().out


def test_bench_pipeline_on_cpu_interpreter(tmp_path):
    import csv

    from specdec_lesson.kernels import bench

    timer = lambda fn: bench.wall_timer(fn, reps=1)
    rows = bench.run_bench("cpu", timer, bench.SMOKE_SIZES, 1 << 20,
                           verify_configs=[(512, 4, 2, 2)], attention_configs=[(16, 32, 4)])
    assert [r["kernel"] for r in rows] == ["verify_chain", "tree_attention", "compact_kv"]
    assert all(r["correct"] for r in rows)
    path = bench.write_csv(rows, tmp_path, "Fake GPU 9000")
    assert path.name == "kernels_fake_gpu_9000.csv"
    with open(path) as f:
        got = list(csv.DictReader(f))
    assert len(got) == 3 and got[0]["gpu"] == "Fake GPU 9000" and got[0]["triton"] and set(bench.FIELDS) == set(got[0])
