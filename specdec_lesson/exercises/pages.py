"""Exercises of notebook 03 (KV-cache rollback), part 2: which blocks a paged cache frees at rollback, and the
per-row positions of a ragged batch (pitfall 7).  Ground truth: :meth:`specdec_lesson.kvcache.BlockTable.truncate`
and every row of the batch run alone, from scratch, through the same model."""

from __future__ import annotations

import torch

from ._core import Exercise, call, fail, passed, solve

__all__ = ["check_blocks_to_free", "check_positions", "EXERCISES"]


def check_blocks_to_free(fn) -> None:
    """``fn(table, new_length, block_size)`` -> the block ids of ``table`` (a sequence's block table, in order) that a
    rollback to ``new_length`` tokens frees; compared with ``BlockTable.truncate`` on 300 random rollbacks (block
    sizes 1, 4, 16; two sequences interleaved so tables are not contiguous)."""
    ex = "3.3"
    from ..kvcache import BlockTable

    gen = torch.Generator().manual_seed(33)
    for case in range(300):
        bs = (1, 4, 16)[case % 3]
        bt = BlockTable(num_blocks=256, block_size=bs)
        length = int(torch.randint(1, 8 * bs + 1, (1,), generator=gen))
        for step in range(1, 5):  # grow both sequences in turns
            bt.reserve(0, length * step // 4)
            bt.reserve(1, int(torch.randint(1, 8 * bs + 1, (1,), generator=gen)) * step // 4)
        new_length = int(torch.randint(0, length + 1, (1,), generator=gen))
        table = list(bt.tables[0])
        got = call(ex, fn, list(table), new_length, bs, what=f"blocks_to_free({table}, {new_length}, {bs})")
        want = bt.truncate(0, new_length)
        bt.check()
        if list(got) != want:
            fail(ex, f"a sequence of {length} tokens in blocks of {bs} (table {table}) rolled back to {new_length} tokens"
                     f" frees {want}, you freed {list(got)}: keep ceil(new_length / block_size) blocks, the last one "
                     "possibly half full (its tail is overwritten by the next append), and free the rest")
    passed(ex, "your rollback frees exactly the blocks wholly past the kept length, in 300 random cases; accepted "
               "pages never move.")


@torch.inference_mode()
def check_positions(fn) -> None:
    """``fn(valid, n)`` -> ``[B, n]`` positions of n new tokens appended to every row of a ragged batch, given the
    slot map ``valid [B, S]`` (False: left padding or a rejected draft, a hole).  Checked on the tiny float64 Llama
    in a :class:`SlotCache` (3 left-padded prompts, two verify steps with ragged acceptance, then one token): each
    row's last logits must equal that row run alone from scratch (1e-5)."""
    ex = "3.4"
    from ..kvcache import SlotCache
    from ..models import tiny_pair

    model = tiny_pair(vocab_size=64)[0]
    prompts = [[3, 14, 15], [9, 2, 6, 5, 35, 8, 9, 7], [32, 38, 46, 26, 43]]
    B, L = len(prompts), max(map(len, prompts))
    ids = torch.tensor([[0] * (L - len(p)) + p for p in prompts])  # [B, L] left-padded
    mask = torch.tensor([[False] * (L - len(p)) + [True] * len(p) for p in prompts])  # [B, L]
    state = SlotCache(model, B, "cpu")
    state.forward(ids[:, :-1], mask[:, :-1], has_holes=True)  # prefill (the library's positions)
    history = [p[:-1] for p in prompts]
    pending, g = ids[:, -1:], torch.Generator().manual_seed(34)  # [B, 1]

    def positions(n: int) -> torch.Tensor:
        pos = call(ex, fn, state.valid.clone(), n, what=f"positions(valid {tuple(state.valid.shape)}, {n})")
        if not isinstance(pos, torch.Tensor) or tuple(pos.shape) != (B, n):
            fail(ex, f"return a [B, n] = [{B}, {n}] tensor of positions, got {type(pos).__name__} "
                     f"{tuple(getattr(pos, 'shape', ()))}")
        return pos.long()

    for keep in ([0, 4, 2], [3, 1, 4]):  # accepted drafts per row: rows fall out of step, holes appear
        drafts = torch.randint(0, 64, (B, 4), generator=g)  # [B, K = 4]
        since = state.num_slots
        state.forward(torch.cat([pending, drafts], 1), positions=positions(5))  # [B, K+1]
        state.rollback(since, [n + 1 for n in keep])  # pending + n accepted stay
        for b in range(B):
            history[b] += [int(pending[b, 0])] + drafts[b, : keep[b]].tolist()
        pending = torch.randint(0, 64, (B, 1), generator=g)  # [B, 1]
    logits, _ = state.forward(pending, positions=positions(1))  # [B, 1, V]
    for b in range(B):
        alone = model(input_ids=torch.tensor([history[b] + [int(pending[b, 0])]])).logits[0, -1]  # [V]
        err = float((alone - logits[b, -1]).abs().max())
        if err > 1e-5:
            fail(ex, f"row {b} of the batch differs from the same row run alone (largest logit error {err:.2g}): its "
                     f"tokens got the wrong positions. Row {b} holds {len(history[b])} real tokens in "
                     f"{state.num_slots - 1} slots; a position counts real tokens, not slots (pitfall 7).")
    passed(ex, "every row of the ragged batch equals the row alone: positions count each row's own valid slots.")


_P33 = """A paged cache keeps each sequence in fixed-size blocks listed in its block table. Write
`blocks_to_free(table, new_length, block_size)`: the block ids (in table order) that a rollback to `new_length`
tokens returns to the free list. The check compares with the library's `BlockTable.truncate` on 300 random
rollbacks."""

_S33 = '''from specdec_lesson.exercises import check_blocks_to_free


def blocks_to_free(table, new_length, block_size):
    """Block ids of `table` wholly past `new_length` tokens."""
    raise NotImplementedError


check_blocks_to_free(blocks_to_free)
'''

_A33 = solve(_S33, '''
    keep = -(-new_length // block_size)   # ceil: a half-full last block stays
    return table[keep:]
''')

_P34 = """One slot layout serves the whole batch, but rows accept different numbers of drafts, so a row can have
*holes* (slots it does not attend to). Write `positions(valid, n)`: given the slot map `valid [B, S]` (bool), the
positions `[B, n]` of n new tokens appended to every row. The check feeds a ragged batch through the tiny model with
your positions and compares each row with the row run alone."""

_S34 = '''import torch

from specdec_lesson.exercises import check_positions


def positions(valid, n):
    """[B, n] positions of n new tokens after the slots in `valid [B, S]`."""
    raise NotImplementedError


check_positions(positions)
'''

_A34 = solve(_S34, '''
    lengths = valid.long().sum(-1)                        # [B] real tokens per row
    return lengths[:, None] + torch.arange(n)[None, :]   # [B, n]
''')

EXERCISES = [
    Exercise("3.3", "the blocks a rollback frees", check_blocks_to_free, _P33, _S33, _A33),
    Exercise("3.4", "positions in a ragged batch", check_positions, _P34, _S34, _A34),
]
