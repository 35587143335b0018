"""The engine: exact greedy equality, the sampled law, EOS / budget, ragged batches, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec_lesson.drafters import ModelDrafter, PromptLookupDrafter, noisy_copy
from specdec_lesson.models import tiny_llama
from specdec_lesson.sampling import SamplingConfig, logits_to_probs
from specdec_lesson.speculative import autoregressive_generate, prepare_inputs, speculative_generate
from specdec_lesson.stats import chi_square_test


@pytest.fixture(scope="module")
def pair():
    target = tiny_llama(vocab_size=64, seed=0)
    return target, noisy_copy(target, 0.01, 1, relative=False)


PROMPTS = [[5, 17, 3, 44, 9], [1, 2, 3, 4, 5, 6, 7, 8, 9], [60, 2, 33]]


@pytest.mark.parametrize("k,paged", [(k, False) for k in range(1, 9)] + [(1, True), (3, True), (8, True)])
def test_greedy_equals_target_greedy_float64(pair, k, paged):
    """Float64 tiny models: speculative greedy output equals target greedy exactly, for every
    row of ragged batches of 1..3 rows (each row equal to that row run alone)."""
    target, draft = pair
    alone = [autoregressive_generate(target, [p], 24)[0][0] for p in PROMPTS]
    for b in (1, 2, 3):
        out, stats = speculative_generate(target, draft, PROMPTS[:b], 24, k=k, paged=paged)
        for row, ref in zip(out, alone[:b]):
            assert torch.equal(row, ref)
        assert sum(stats.accept_hist) == stats.row_steps
    # rows did accept different lengths in these runs (the ragged case is exercised)
    assert len({n for n, c in enumerate(stats.accept_hist) if c}) > 1


def test_batched_autoregressive_equals_rows_alone(pair):
    target, _ = pair
    batch, _ = autoregressive_generate(target, PROMPTS, 20)
    for p, row in zip(PROMPTS, batch):
        assert torch.equal(autoregressive_generate(target, [p], 20)[0][0], row)


def test_prompt_lookup_is_exact_and_accepts(pair):
    target, _ = pair
    prompt = [3, 9, 27, 3, 9, 27, 3, 9, 27, 3, 9]
    ref, _ = autoregressive_generate(target, [prompt], 30)
    out, stats = speculative_generate(target, PromptLookupDrafter(), [prompt], 30, k=4)
    assert torch.equal(out[0], ref[0])
    assert stats.draft_forwards == 0 and stats.target_forwards >= 1


def test_eos_and_budget(pair):
    target, draft = pair
    ref, _ = autoregressive_generate(target, [PROMPTS[0]], 30)
    eos = int(ref[0][7])
    first = ref[0].tolist().index(eos)
    for fn in (lambda: autoregressive_generate(target, [PROMPTS[0]], 30, eos_token_id=eos),
               lambda: speculative_generate(target, draft, [PROMPTS[0]], 30, k=5, eos_token_id=eos)):
        out, _ = fn()
        assert out[0].tolist() == ref[0].tolist()[: first + 1]  # EOS kept, nothing after it
    for m in (1, 2, 7):
        out, stats = speculative_generate(target, draft, PROMPTS, m, k=4)
        assert [len(r) for r in out] == [m] * 3
        assert stats.emitted == 3 * m


def _exact_joint(target, prompt, n, temperature, top_k=None, top_p=None):
    """Target law of the first n new tokens, enumerated with float64 forwards."""
    V = target.config.vocab_size
    law = {}
    for seq in itertools.product(range(V), repeat=n):
        ids = torch.tensor([prompt + list(seq)])
        with torch.no_grad():
            logits = target(ids).logits[0, len(prompt) - 1: len(prompt) - 1 + n]  # [n, V]
        probs = logits_to_probs(logits, temperature, top_k, top_p)
        law[seq] = float(torch.prod(probs[torch.arange(n), torch.tensor(seq)]))
    return law


@pytest.mark.parametrize("temperature,top_p", [(1.0, None), (0.8, 0.8)])
def test_sampled_law_matches_target(temperature, top_p):
    """The joint law of the first 2 tokens from speculative_generate (K=3) equals the target's.

    V = 8, so 64 outcomes; N = 6000 samples (12 batches of 500 independent rows); Pearson
    chi-square with cells of expected count < 5 pooled; the test fails when p < 1e-3.
    Power: the same test, applied to a drafter that drafts greedily while reporting its
    softmax law (pitfall 1), rejects (asserted below), so it detects a distortion of
    that size; at N = 6000 a chi-square on <= 63 dof at alpha = 1e-3 has power > 0.99 against
    TV distortions >= 0.05 (non-central chi-square approximation, lambda = N * sum (p-p')^2/p).
    """
    target = tiny_llama(vocab_size=8, hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=3)
    draft = noisy_copy(target, 0.3, 5, relative=False)
    prompt = [1, 5, 2]
    law = _exact_joint(target, prompt, 2, temperature, top_p=top_p)
    g = torch.Generator().manual_seed(1234)

    def sample(drafter_factory):
        counts: dict = {}
        for _ in range(12):
            out, _ = speculative_generate(target, drafter_factory(), [prompt] * 500, 2, k=3,
                                          temperature=temperature, top_p=top_p, generator=g)
            for row in out:
                key = tuple(row.tolist())
                counts[key] = counts.get(key, 0) + 1
        return counts

    stat, dof, p = chi_square_test(sample(lambda: ModelDrafter(draft)), law)
    assert p > 1e-3, (stat, dof, p)

    class GreedyDraftSoftmaxQ(ModelDrafter):  # pitfall 1, planted: argmax draft, softmax q reported
        @staticmethod
        def pick(q, sampling, generator):
            return q.argmax(-1)

    stat_b, _, p_b = chi_square_test(sample(lambda: GreedyDraftSoftmaxQ(draft)), law)
    assert p_b < 1e-3, (stat_b, p_b)


def test_bad_input(pair):
    target, draft = pair
    other = tiny_llama(vocab_size=65, seed=2)
    with pytest.raises(ValueError, match="k must be"):
        speculative_generate(target, draft, [PROMPTS[0]], 5, k=0)
    with pytest.raises(ValueError, match="exceeds the model's context"):
        speculative_generate(target, draft, [PROMPTS[0]], 5, k=600)
    with pytest.raises(ValueError, match="vocabularies differ"):
        speculative_generate(target, other, [PROMPTS[0]], 5)
    with pytest.raises(ValueError, match="empty prompt"):
        speculative_generate(target, draft, [[]], 5)
    with pytest.raises(ValueError, match="empty prompt"):
        autoregressive_generate(target, torch.zeros(1, 0, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="temperature"):
        speculative_generate(target, draft, [PROMPTS[0]], 5, temperature=-1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        autoregressive_generate(target, [PROMPTS[0]], 0)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        autoregressive_generate(target, [[1, 2, 64]], 3)
    with pytest.raises(ValueError, match="left padding"):
        prepare_inputs(torch.ones(1, 3, dtype=torch.long), torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="draft must be"):
        speculative_generate(target, "not a model", [PROMPTS[0]], 5)


def test_stats_are_consistent(pair):
    target, draft = pair
    out, s = speculative_generate(target, draft, PROMPTS, 20, k=4)
    assert s.emitted == sum(len(r) for r in out)
    assert s.accepted == sum(n * c for n, c in enumerate(s.accept_hist))
    assert 0 <= s.alpha <= 1 and 1 <= s.tau <= 5
    assert s.draft_forwards > 0 and s.time_total > 0
    _, one = speculative_generate(target, draft, PROMPTS[:1], 20, k=4)
    assert one.target_forwards == 1 + one.row_steps  # prefill + one verify forward per step
    assert one.draft_forwards == 1 + one.proposed  # draft prefill + one forward per proposed draft


def test_input_errors_name_the_problem(pair):
    """A mask of another shape (same numel: used to be silently reshaped; other numel: torch's reshape error), mask
    values other than 0 / 1, and float / bool token ids in a list (used to be truncated to integers) are each one
    ValueError that names the problem and the fix."""
    target, draft = pair
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for bad in (torch.ones(3, 2), torch.ones(2, 4), torch.ones(6)):
        with pytest.raises(ValueError, match=r"attention_mask has shape .* but input_ids has shape \(2, 3\): give one entry"):
            prepare_inputs(ids, bad)
    with pytest.raises(ValueError, match="only 0 / 1"):
        prepare_inputs(ids, torch.tensor([[0, 1, 2], [1, 1, 1]]))
    one, mask = prepare_inputs(torch.tensor([7, 8, 9]), torch.tensor([0, 1, 1]))  # a 1-D prompt takes a 1-D mask
    assert one.tolist() == [[7, 8, 9]] and mask.tolist() == [[False, True, True]]
    for bad, where in (([[1, 2.5, 3]], "row 0, position 1 holds 2.5"), ([[4, 5], [1.0, 2.0]], "row 1, position 0 holds 1.0"),
                       ([[1, True]], "row 0, position 1 holds True"), ([[1, "2"]], "row 0, position 1 holds '2'")):
        with pytest.raises(ValueError, match=f"integer token ids; {where}.*pass lists of ints or a LongTensor"):
            prepare_inputs(bad)
    with pytest.raises(ValueError, match="integer token ids"):
        speculative_generate(target, draft, [[1.0, 2.7, 3.0]], 3)
    with pytest.raises(ValueError, match="list of token-id lists"):
        prepare_inputs([[1, 2], 3])
    flat, _ = prepare_inputs([5, 6, 7])  # a flat list of ids is one prompt, like a 1-D tensor
    assert flat.tolist() == [[5, 6, 7]]
    assert prepare_inputs([[1, torch.tensor(2)], [3]])[0].tolist() == [[1, 2], [0, 3]]  # integer scalars are fine
    assert prepare_inputs([torch.tensor([4, 5]), (6,)])[0].tolist() == [[4, 5], [0, 6]]  # rows as tensors / tuples


def test_stats_count_only_drafts_emitted_before_eos(pair):
    """The target as its own greedy draft accepts all K = 5 drafts; EOS is the 3rd draft, so 2 accepted drafts (and
    the bonus) are cut.  Only the 3 emitted drafts count (they used to count 5), no rejection was observed, so the
    per-token alpha is 1 while utilisation (accepted / proposed) is 3/5; the raw outcome stays in verify_hist."""
    target, _ = pair
    ref, _ = autoregressive_generate(target, [PROMPTS[1]], 8)
    eos = int(ref[0][2])
    assert eos not in ref[0][:2].tolist()
    out, stats = speculative_generate(target, target, [PROMPTS[1]], 8, k=5, eos_token_id=eos)
    assert out[0].tolist() == ref[0][:3].tolist()
    assert stats.accepted == 3 and stats.rejections == 0 and stats.proposed == 5 and stats.accept_hist == [0, 0, 0, 1, 0, 0]
    assert stats.alpha == 1.0 and stats.utilisation == pytest.approx(3 / 5) and stats.verify_hist == {5: [0, 0, 0, 0, 0, 1]}


def test_engine_refuses_a_proposal_past_the_budget(pair):
    """The engine checks the Drafter contract: a proposal longer than the budget allows is a RuntimeError."""
    target, _ = pair

    class TooLong(PromptLookupDrafter):
        def propose(self, k, sampling, generator):
            return torch.ones(len(self.history), k + 3, dtype=torch.long), None

    with pytest.raises(RuntimeError, match="proposed 5 drafts, more than the 2 this step allows"):
        speculative_generate(target, TooLong(), [PROMPTS[0]], 3, k=2)


def test_greedy_fast_verification_equals_the_full_rule():
    """At T = 0 the engine skips the laws and the random numbers (speculative._greedy_verify): it must give the chain
    rule's result with one-hot laws, ties to the lowest id included, whatever the random numbers would have been."""
    from specdec_lesson.speculative import _greedy_verify
    from specdec_lesson.verify import draw_verify_randoms, verify_chain_from_randoms

    g = torch.Generator().manual_seed(0)
    sampling = SamplingConfig(0.0)
    for trial in range(200):
        B, K, V = 1 + trial % 4, 1 + trial % 5, 3 + trial % 7
        logits = torch.randint(0, 3, (B, K + 1, V), generator=g).float()  # [B, K+1, V] few values: many ties
        best = logits.argmax(-1)  # [B, K+1]
        drafts = torch.where(torch.rand(B, K, generator=g) < 0.6, best[:, :K], torch.randint(0, V, (B, K), generator=g))
        p = sampling.probs(logits)  # [B, K+1, V] one-hot on the first maximum
        q = torch.nn.functional.one_hot(drafts, V).float()  # [B, K, V]
        uni, expo = draw_verify_randoms(B, K, V, generator=g)
        n_ref, nxt_ref = verify_chain_from_randoms(p, q, drafts, uni, expo)
        n, nxt, host = _greedy_verify(logits, drafts, trial)
        assert host == [[a, b] + d for a, b, d in zip(n.tolist(), nxt.tolist(), drafts.tolist())]
        assert torch.equal(n, n_ref) and torch.equal(nxt, nxt_ref), (trial, logits, drafts)
    bad = torch.zeros(1, 2, 5)
    bad[0, 1, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN|non-finite|finite"):
        _greedy_verify(bad, torch.zeros(1, 1, dtype=torch.long), 3)
