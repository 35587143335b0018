"""KV caches: block-table invariants under random traffic, rollback == recompute, ragged rows, bad input."""

import copy
import random

import pytest
import torch
from transformers.cache_utils import DynamicCache

from specdec_lesson.kvcache import BlockTable, PagedKVCache, SlotCache, crop
from specdec_lesson.models import tiny_llama, tiny_pair
from specdec_lesson.speculative import autoregressive_generate, speculative_generate

V = 64
# The tiny models are float64, but Llama's eager attention takes its softmax in float32: two computation
# orders of the same logits (cached vs from scratch, batched vs alone) agree to ~1e-7, not to 1e-15.
ATOL = 2e-6




def _noisy_copy(model, scale, seed=0):
    """A draft that often agrees with ``model``: its weights plus Gaussian noise (``scale`` x each tensor's std)."""
    draft, gen = copy.deepcopy(model), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for prm in draft.parameters():
            prm.add_(torch.randn(prm.shape, generator=gen, dtype=prm.dtype) * scale * prm.std())
    return draft


@pytest.fixture(scope="module")
def models():
    pair = tiny_pair(vocab_size=V)  # float64 weights (see ATOL)
    # tiny_pair's draft is random and almost never accepted; the close draft makes every n = 0..K occur
    return {"target": pair.target, "draft": pair.draft, "close": _noisy_copy(pair.target, 0.1)}


def _ids(gen, *shape):
    return torch.randint(0, V, shape, generator=gen)


# ---------------------------------------------------------------- block table + a tensor pool


def test_block_table_random_traffic_no_leak_no_sharing():
    """4,000 random append / rollback / release operations on 5 sequences sharing 40 blocks of 4 slots.

    Freed blocks are poisoned with NaN, so a block still read after it was freed (or handed to two
    sequences) breaks the exact comparison with a contiguous per-sequence reference."""
    rng, gen = random.Random(0), torch.Generator().manual_seed(0)
    bs, nblocks, D, nseq = 4, 40, 3, 5
    table = BlockTable(nblocks, bs)
    pool = torch.full((nblocks, bs, D), float("nan"), dtype=torch.float64)  # [num_blocks, block_size, D]
    ref = {s: torch.zeros(0, D, dtype=torch.float64) for s in range(nseq)}
    out_of_blocks = rollbacks_freeing = 0
    for _ in range(4000):
        s, op = rng.randrange(nseq), rng.random()
        length = table.lengths.get(s, 0)
        if op < 0.6:  # append n tokens
            n = rng.randint(1, 7)
            need = table.blocks_for(length + n) - len(table.tables.get(s, []))
            if need > len(table.free):
                free_before = list(table.free)
                with pytest.raises(RuntimeError, match="out of blocks"):
                    table.reserve(s, length + n)
                assert table.free == free_before  # a failed reservation takes nothing
                out_of_blocks += 1
            else:
                table.reserve(s, length + n)
                blk, off = table.slot_index(s, length, n, "cpu")  # [n], [n]
                new = torch.randn(n, D, generator=gen, dtype=torch.float64)  # [n, D]
                pool[blk, off] = new
                ref[s] = torch.cat([ref[s], new])
        elif op < 0.95:  # rollback: a rejection of up to 8 slots
            keep = max(0, length - rng.randint(0, 8))
            blocks_before = len(table.tables.get(s, []))
            freed = table.truncate(s, keep)
            assert len(freed) == blocks_before - table.blocks_for(keep)  # exactly the blocks wholly past keep
            rollbacks_freeing += bool(freed)
            pool[freed] = float("nan")
            ref[s] = ref[s][:keep]
        else:  # the sequence finishes
            freed = list(table.tables.get(s, []))
            table.release(s)
            pool[freed] = float("nan")
            ref[s] = ref[s][:0]
        table.check()
        for seq, blocks in table.tables.items():
            got = pool[torch.tensor(blocks, dtype=torch.long)].reshape(-1, D)[: table.lengths[seq]]  # [len, D]
            assert torch.equal(got, ref[seq]), f"sequence {seq} differs from its contiguous reference"
        for seq in set(ref) - set(table.tables):
            assert len(ref[seq]) == 0
    assert out_of_blocks > 0 and rollbacks_freeing > 100  # the traffic did reach the interesting cases


def test_block_table_failed_reserve_of_new_sequence_keeps_invariants():
    table = BlockTable(2, 4)
    with pytest.raises(RuntimeError, match="out of blocks"):
        table.reserve(0, 9)  # needs 3 blocks, 2 exist
    table.check()  # the failed reservation must not leave a half-registered sequence
    table.reserve(0, 8)
    table.check()
    assert table.free == []


@pytest.mark.parametrize("num_blocks", [3 * 12, 2], ids=["large-pool", "growing-pool"])
def test_paged_cache_random_update_and_crop_match_dynamic_cache(num_blocks):
    """PagedKVCache through the transformers Cache API against a DynamicCache: 300 random
    appends (1-5 slots) and crops on 3 rows x 2 layers, block pools shared by all rows; the
    free blocks of every layer are poisoned with NaN after each operation.  A pool of 2 blocks
    grows (every layer's pool with the table) instead of running out."""
    rng, gen = random.Random(1), torch.Generator().manual_seed(1)
    B, H, D, L, bs = 3, 2, 4, 2, 4
    paged, ref = PagedKVCache(L, B, block_size=bs, num_blocks=num_blocks), DynamicCache()
    for _ in range(300):
        length = ref.get_seq_length()
        if rng.random() < 0.6 and length < 40:
            n = rng.randint(1, 5)
            for layer in range(L):
                k, v = (torch.randn(B, H, n, D, generator=gen, dtype=torch.float64) for _ in range(2))  # [B, H, n, D]
                got_k, got_v = paged.update(k, v, layer)
                want_k, want_v = ref.update(k, v, layer)
                assert torch.equal(got_k, want_k) and torch.equal(got_v, want_v)
        elif length:
            keep = rng.randint(0, length)
            crop(paged, keep)
            crop(ref, keep)
            assert paged.get_seq_length() == ref.get_seq_length() == keep
        paged.table.check()
        assert paged.blocks_in_use() == B * paged.table.blocks_for(paged.get_seq_length())
        free = torch.tensor(paged.table.free, dtype=torch.long)
        for layer in paged.layers:
            if layer.is_initialized:
                layer.keys[free] = float("nan")
                layer.values[free] = float("nan")
        if paged.get_seq_length():
            for layer in range(L):
                got_k, got_v = paged.layers[layer].gather(B)  # [B, H, len, D]
                assert torch.equal(got_k, ref.layers[layer].keys) and torch.equal(got_v, ref.layers[layer].values)
    assert all(layer.keys.shape[0] == paged.table.num_blocks for layer in paged.layers)
    assert paged.table.num_blocks >= 3 * 10  # 3 rows reached 40 slots = 10 blocks each


def test_paged_pool_limit_and_run_sizing(models):
    """max_blocks caps the growth (one clear error); SlotCache sizes and allocates the pool of a run up front, and a
    run that exceeds max_blocks, or whose pool cannot be allocated at all, fails before any forward."""
    cache = PagedKVCache(1, 2, block_size=4, num_blocks=2, max_blocks=3)
    k = torch.zeros(2, 1, 5, 2, dtype=torch.float64)  # [B, H, 5, D]: 2 blocks per row, 4 in all
    with pytest.raises(RuntimeError, match="out of blocks.*max_blocks=3"):
        cache.update(k, k, 0)
    with pytest.raises(ValueError, match="max_blocks"):
        PagedKVCache(1, 2, num_blocks=8, max_blocks=4)
    state = SlotCache(models["target"], 3, "cpu", paged=True, capacity=40)  # 3 blocks of 16 per row
    assert state.cache.table.num_blocks == 9 and all(layer.keys.shape[0] == 9 for layer in state.cache.layers)
    with pytest.raises(ValueError, match="too small for this run: 3 rows x 40 tokens need 9 blocks"):
        SlotCache(models["target"], 3, "cpu", paged=True, capacity=40, max_blocks=8)
    with pytest.raises(RuntimeError, match="paged KV cache: cannot allocate .* GiB"):  # ~2^61 bytes: no address space
        SlotCache(models["target"], 1, "cpu", paged=True, capacity=2**56)


def test_paged_engine_runs_past_the_old_fixed_pool():
    """220 rows x 300 prompt tokens need 220 x 20 = 4400 blocks of 16 (+ the draft's), more than the fixed pool of
    4096 the engine used to take: the run used to fail mid-way with "out of blocks".  Now it equals the contiguous run."""
    model = tiny_llama(vocab_size=16, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, dtype=torch.float32)
    prompts = [[1, 2, 3] * 100] * 220
    paged, _ = speculative_generate(model, model, prompts, 4, k=2, paged=True)
    contiguous, _ = speculative_generate(model, model, prompts, 4, k=2)
    assert all(torch.equal(a, b) for a, b in zip(paged, contiguous)) and all(len(r) == 4 for r in paged)


def test_paged_rollback_keeps_accepted_pages_in_place():
    cache = PagedKVCache(1, 1, block_size=4, num_blocks=8)
    k = torch.randn(1, 1, 10, 2, dtype=torch.float64)  # [B, H, 10, D]
    cache.update(k, k, 0)
    before = list(cache.table.tables[0])  # 3 blocks for 10 slots
    crop(cache, 5)  # reject the last 5: block 3 (slots 8-9) is freed, blocks 1-2 stay where they were
    assert cache.table.tables[0] == before[:2]
    assert before[2] in cache.table.free
    assert cache.blocks_in_use() == 2


# ---------------------------------------------------------------- rollback == recompute (real forwards)


def _reference_logits(model, rows):
    """Logits of each row run alone from scratch (no cache): list of [len, V]."""
    with torch.inference_mode():
        return [model(input_ids=torch.tensor([r])).logits[0] for r in rows]


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
@pytest.mark.parametrize("which", ["target", "draft"])
def test_rollback_then_continue_equals_recompute(models, paged, which):
    """Feed a prompt, then pending + K = 4 drafts; reject after n of them (n = 0..4), roll back,
    feed a continuation: its logits equal a from-scratch forward on the accepted prefix + continuation."""
    model, gen = models[which], torch.Generator().manual_seed(2)
    prompt, drafts, cont = _ids(gen, 9).tolist(), _ids(gen, 4).tolist(), _ids(gen, 3).tolist()
    for n in range(5):
        state = SlotCache(model, 1, "cpu", paged=paged, block_size=4)
        with torch.inference_mode():
            state.forward(torch.tensor([prompt[:-1]]))
            since = state.num_slots
            state.forward(torch.tensor([prompt[-1:] + drafts]))  # [1, K+1]
            state.rollback(since, [n + 1])  # pending + n accepted drafts stay
            assert state.num_slots == state.cache.get_seq_length() == len(prompt) + n
            if paged:
                state.cache.table.check()
                assert state.cache.blocks_in_use() == state.cache.table.blocks_for(len(prompt) + n)
            logits, _ = state.forward(torch.tensor([cont]))  # [1, 3, V]
        (want,) = _reference_logits(model, [prompt + drafts[:n] + cont])
        torch.testing.assert_close(logits[0], want[-len(cont):], rtol=0, atol=ATOL)


@pytest.mark.parametrize("paged", [False, True], ids=["contiguous", "paged"])
def test_ragged_rollback_each_row_equals_row_alone(models, paged):
    """Left-padded prompts of lengths 3, 8, 5; rows then accept 0, 4, 2 of K = 4 drafts (holes in the
    shorter rows) and continue for two more verify-like steps: every row's logits at its real
    positions equal that row run alone from scratch."""
    model, gen = models["target"], torch.Generator().manual_seed(3)
    prompts = [_ids(gen, n).tolist() for n in (3, 8, 5)]
    B, Lmax = len(prompts), max(map(len, prompts))
    ids = torch.tensor([[0] * (Lmax - len(p)) + p for p in prompts])  # [B, Lmax]
    mask = torch.tensor([[False] * (Lmax - len(p)) + [True] * len(p) for p in prompts])  # [B, Lmax]
    state = SlotCache(model, B, "cpu", paged=paged, block_size=4)
    hist = [list(p) for p in prompts]
    with torch.inference_mode():
        logits, _ = state.forward(ids, mask, has_holes=True)  # [B, Lmax, V]
        want = _reference_logits(model, hist)
        for b in range(B):
            torch.testing.assert_close(logits[b, mask[b]], want[b], rtol=0, atol=ATOL)
        for keep in ([0, 4, 2], [3, 1, 4]):
            step = _ids(gen, B, 5)  # [B, K+1] the first column plays the pending token
            since = state.num_slots
            logits, _ = state.forward(step)  # [B, K+1, V]
            for b in range(B):
                (ref,) = _reference_logits(model, [hist[b] + step[b].tolist()])
                torch.testing.assert_close(logits[b], ref[-5:], rtol=0, atol=ATOL)
                hist[b] += step[b, : keep[b] + 1].tolist()
            state.rollback(since, [k + 1 for k in keep])
            assert state.lengths.tolist() == [len(h) for h in hist]
            if paged:
                state.cache.table.check()
        last = _ids(gen, B, 2)  # [B, 2]
        logits, _ = state.forward(last)
        for b in range(B):
            (ref,) = _reference_logits(model, [hist[b] + last[b].tolist()])
            torch.testing.assert_close(logits[b], ref[-2:], rtol=0, atol=ATOL)


def test_left_padded_batch_equals_rows_alone(models):
    """SlotCache holes from left padding: each row's logits (at real tokens, and over 3 decode steps)
    equal the row alone, for the contiguous and the paged store."""
    model, gen = models["draft"], torch.Generator().manual_seed(4)
    prompts = [_ids(gen, n).tolist() for n in (1, 6, 4)]
    Lmax = max(map(len, prompts))
    ids = torch.tensor([[5] * (Lmax - len(p)) + p for p in prompts])  # padding with a real id must not matter
    mask = torch.tensor([[False] * (Lmax - len(p)) + [True] * len(p) for p in prompts])
    nxt = _ids(gen, 3, 3)  # [B, 3] three decode steps
    for paged in (False, True):
        state = SlotCache(model, 3, "cpu", paged=paged, block_size=4)
        with torch.inference_mode():
            first, _ = state.forward(ids, mask, has_holes=True)  # [B, Lmax, V]
            steps = [state.forward(nxt[:, j:j + 1])[0][:, 0] for j in range(3)]  # 3 x [B, V]
        for b, p in enumerate(prompts):
            (ref,) = _reference_logits(model, [p + nxt[b].tolist()])
            torch.testing.assert_close(first[b, mask[b]], ref[: len(p)], rtol=0, atol=ATOL)
            torch.testing.assert_close(torch.stack([s[b] for s in steps]), ref[len(p):], rtol=0, atol=ATOL)


# ---------------------------------------------------------------- the engine on both stores


@pytest.mark.parametrize("k", [1, 3])
def test_paged_engine_equals_contiguous_engine(models, k):
    """Greedy: speculative (paged and contiguous) == autoregressive, row by row, on a ragged batch whose rows
    accept different numbers of drafts. Sampled (T = 1): paged and contiguous consume the same random numbers,
    so the same seed gives the same tokens."""
    t, d = models["target"], models["close"]
    prompts = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15], [40, 41, 42, 43]]
    ar, _ = autoregressive_generate(t, prompts, 24)
    ar_paged, _ = autoregressive_generate(t, prompts, 24, paged=True)
    outs = {}
    for paged in (False, True):
        outs[paged], stats = speculative_generate(t, d, prompts, 24, k=k, paged=paged)
        assert stats.accept_hist[0] > 0 and stats.accept_hist[k] > 0  # rejections and full acceptances both occur
    for b in range(len(prompts)):
        assert ar[b].tolist() == ar_paged[b].tolist() == outs[False][b].tolist() == outs[True][b].tolist()
    sampled = {}
    for paged in (False, True):
        gen = torch.Generator().manual_seed(5)
        sampled[paged], _ = speculative_generate(t, d, prompts, 24, k=k, temperature=1.0, generator=gen, paged=paged)
    assert [x.tolist() for x in sampled[False]] == [x.tolist() for x in sampled[True]]


# ---------------------------------------------------------------- bad input


def test_crop_bad_input_raises():
    model = tiny_llama(vocab_size=V, num_layers=1)
    for cache in (DynamicCache(), PagedKVCache.for_model(model, 1, block_size=4, num_blocks=8)):
        with torch.inference_mode():
            model(input_ids=torch.arange(5)[None], cache=cache, use_cache=True)
        assert cache.get_seq_length() == 5
        for keep in (-1, 6):
            with pytest.raises(ValueError, match="cannot crop a cache of 5 slots"):
                crop(cache, keep)
        crop(cache, 5)  # a no-op
        assert cache.get_seq_length() == 5


def test_block_table_and_slot_cache_bad_input_raise(models):
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockTable(0, 4)
    with pytest.raises(ValueError, match="num_blocks and block_size"):
        BlockTable(4, 0)
    table = BlockTable(4, 4)
    table.reserve(0, 5)
    with pytest.raises(ValueError, match="cannot roll back to 6"):
        table.truncate(0, 6)
    with pytest.raises(ValueError, match="cannot roll back to -1"):
        table.truncate(0, -1)
    state = SlotCache(models["draft"], 2, "cpu")
    with torch.inference_mode():
        state.forward(torch.ones(2, 3, dtype=torch.long))
    for keep in ([1], [0, 4], [-1, 0]):
        with pytest.raises(ValueError, match="keep must list"):
            state.rollback(0, keep)
