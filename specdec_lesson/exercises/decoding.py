"""Exercises of notebook 02 (speculative decoding): the draft step, chain verification, and reading a run's
counters.  Ground truth: :meth:`SamplingConfig.probs`, :func:`specdec_lesson.verify.verify_chain_from_randoms`,
:class:`specdec_lesson.stats.SpecStats`, and the exact joint law of toy runs (:func:`specdec_lesson.toy.mc_joint_check`)."""

from __future__ import annotations

import torch

from .. import toy
from ..sampling import SamplingConfig
from ..sim import simulate_generation
from ..stats import SpecStats
from ..verify import draw_verify_randoms, verify_chain_from_randoms
from ._core import LEVEL, Exercise, call, detectable_tv, fail, fit_test, passed, solve

__all__ = ["check_draft_step", "check_verify", "check_alpha_tau", "CHAINS", "EXERCISES"]

CHAINS = 30_000  # toy chains per joint-law test: first 3 tokens over 3 symbols (27 cells, <= 26 degrees of freedom)
_CONFIGS = {"greedy": SamplingConfig(0.0), "T=1": SamplingConfig(1.0), "T=0.5": SamplingConfig(0.5),
            "top-k=3": SamplingConfig(1.0, top_k=3), "T=0.7, top-p=0.7": SamplingConfig(0.7, top_p=0.7)}


def _joint(ex: str, what: str, gen: torch.Generator, temperature: float, top_k=None, **harness) -> float:
    target, draft = toy.random_markov(3, 1, seed=1), toy.random_markov(3, 1, seed=2)
    try:
        res = toy.mc_joint_check(target, draft, (0, 0), 3, 2, CHAINS, gen, temperature, top_k, **harness)
    except AssertionError:
        raise
    except Exception as exc:
        fail(ex, f"{what}: the speculative loop with your function raised {type(exc).__name__}: {exc}")
    if res["p_value"] < LEVEL:
        fail(ex, f"{what}: the first 3 tokens of {CHAINS} toy speculative runs do not follow the target's law "
                 f"(chi-square p-value {res['p_value']:.1e} < {LEVEL:g}, total variation {res['tv']:.3f})")
    return res["tv"]


def check_draft_step(fn) -> None:
    """``fn(logits [B, V], sampling, generator)`` -> ``(tokens [B], q [B, V])``: q the law the tokens were drawn
    from, after the run's temperature / top-k / top-p (one-hot on the argmax when greedy).

    Checks: q == ``sampling.probs(logits)`` for 5 sampling settings (catches pitfall 2, q from other processing);
    greedy tokens are the argmax; 40,000 draws from one row fit its q (chi-square at 1e-4, at most 9 degrees of
    freedom, detects TV >= 0.019 with power 0.99: catches pitfall 1, argmax tokens with a softmax q); and the joint law of
    the first 3 tokens of 30,000 toy speculative runs at T = 0.5 and at top-k = 2 (chi-square at 1e-4, each detects
    TV >= 0.026 with power 0.99)."""
    ex = "2.1"
    gen = torch.Generator().manual_seed(41)
    logits = 2.0 * torch.randn(64, 10, generator=gen, dtype=torch.float64)  # [B, V]
    for name, sampling in _CONFIGS.items():
        out = call(ex, fn, logits, sampling, gen, what=f"draft_step(logits [64, 10], {sampling})")
        if not (isinstance(out, tuple) and len(out) == 2):
            fail(ex, f"return a pair (tokens [B], q [B, V]), got {type(out).__name__}")
        tok, q = out
        if tuple(tok.shape) != (64,) or tuple(q.shape) != (64, 10):
            fail(ex, f"{name}: shapes should be tokens [64] and q [64, 10], got {tuple(tok.shape)} and {tuple(q.shape)}")
        want = sampling.probs(logits)  # [B, V]
        if not torch.allclose(q.to(want.dtype), want, rtol=0, atol=1e-9):
            fail(ex, f"{name}: q is not the law the tokens are drawn from (largest error {float((q - want).abs().max()):.3g})"
                     ". Use the same processing as the target: q = sampling.probs(logits) (pitfall 2).")
        if not bool((q.gather(-1, tok.long()[:, None]) > 0).all()):
            fail(ex, f"{name}: a token has probability 0 under the q you returned")
        if sampling.greedy and not torch.equal(tok.long(), logits.argmax(-1)):
            fail(ex, "greedy: the tokens must be the argmax of the logits")
    row = torch.tensor([1.0, 0.8, 0.6, 0.5, 0.3, 0.2, 0.0, -0.2, -0.5, -1.0], dtype=torch.float64).expand(40_000, 10)  # [N, V]
    for name in ("T=1", "T=0.7, top-p=0.7"):
        tok, q = call(ex, fn, row, _CONFIGS[name], gen, what=f"draft_step on 40,000 copies of one row ({name})")
        counts = dict(zip(*(t.tolist() for t in tok.long().unique(return_counts=True))))
        fit_test(ex, counts, {i: v for i, v in enumerate(q[0].tolist()) if v > 0},
                 f"{name}: your tokens against your q (a token must be DRAWN from q, not its argmax: pitfall 1)")
    tv = [_joint(ex, "T = 0.5", gen, 0.5, draft_fn=fn), _joint(ex, "T = 1, top-k = 2", gen, 1.0, 2, draft_fn=fn)]
    passed(ex, f"q is the processed law, tokens are drawn from it, and toy speculative runs keep the target's law "
               f"(TV {max(tv):.3f}, below the {detectable_tv(CHAINS, 26):.3f} the test would see).")


def _verify_cases(gen: torch.Generator) -> list[tuple]:
    """Random batches (K = 1, 2, 4; V = 5, 16) with p == q rows (bonus), p(x) = 0 rows, and one guard row."""
    cases = []
    for k, vocab in ((1, 5), (2, 16), (4, 5), (4, 16)):
        B = 240
        t_logits = 2.0 * torch.randn(B, k + 1, vocab, generator=gen, dtype=torch.float64)  # [B, K+1, V]
        d_logits = t_logits[:, :k] + torch.randn(B, k, vocab, generator=gen, dtype=torch.float64)  # [B, K, V]
        tp, dp = torch.softmax(t_logits, -1), torch.softmax(d_logits, -1)
        tp[40:80, :, 0] = 0.0  # the target forbids token 0 (drafts of 0 must be rejected)
        tp = tp / tp.sum(-1, keepdim=True)
        dp[:40] = tp[:40, :k]  # p == q: every draft accepted, then the bonus
        tokens = torch.multinomial(dp.reshape(-1, vocab), 1, generator=gen).view(B, k)  # [B, K] drafts ~ q
        tokens[40:80, 0] = 0
        u, e = draw_verify_randoms(B, k, vocab, dtype=torch.float64, generator=gen)  # [B, K], [B, V]
        u[40:60] = 0.0  # u = 0 with p(x) = 0: u * q < p is false, the draft is rejected
        cases.append((tp, dp, tokens, u, e))
    q = torch.tensor([[[0.1, 0.2, 0.3, 0.4]]], dtype=torch.float64)  # [1, 1, V]
    p = torch.cat([q * (1 - 1e-9), q], dim=1)  # [1, 2, V]: p < q everywhere (rounding), residual all zero
    cases.append((p, q, torch.tensor([[3]]), torch.tensor([[1 - 1e-12]], dtype=torch.float64),
                  torch.tensor([[1.0, 1.0, 0.05, 1.0]], dtype=torch.float64)))
    return cases


def check_verify(fn) -> None:
    """``fn(target_probs [B, K+1, V], draft_probs [B, K, V], draft_tokens [B, K], uniforms [B, K], exponentials
    [B, V])`` -> ``(num_accepted [B], next_token [B])``, with the library's random-number protocol: draft i accepted
    iff ``u_i * q_i(x_i) < p_i(x_i)``; the next token is ``argmax(w / exponentials)`` with w the residual at the
    first rejection (p itself if that residual is all zero) or p_K after K acceptances (the bonus).

    Checks: equal, row for row, to ``verify_chain_from_randoms`` on 961 rows (K = 1, 2, 4; full acceptances, drafts
    the target forbids, u = 0, an all-zero residual); then the joint law of 30,000 toy runs through it (chi-square
    at 1e-4, detects TV >= 0.026 with power 0.99)."""
    ex = "2.2"
    gen = torch.Generator().manual_seed(42)
    for tp, dp, tokens, u, e in _verify_cases(gen):
        B, K = tokens.shape
        out = call(ex, fn, tp.clone(), dp.clone(), tokens.clone(), u.clone(), e.clone(),
                   what=f"verify on a batch of {B} rows with K = {K}")
        if not (isinstance(out, tuple) and len(out) == 2):
            fail(ex, f"return a pair (num_accepted [B], next_token [B]), got {type(out).__name__}")
        n_ref, y_ref = verify_chain_from_randoms(tp, dp, tokens, u, e)
        n, y = (torch.as_tensor(t).long().reshape(-1) for t in out)
        if n.shape != n_ref.shape or y.shape != y_ref.shape:
            fail(ex, f"K = {K}: expected two [{B}] tensors, got {tuple(n.shape)} and {tuple(y.shape)}")
        bad = ((n != n_ref) | (y != y_ref)).nonzero().flatten().tolist()
        if bad:
            b = bad[0]
            nb, kb = int(n_ref[b]), int(n[b])
            if kb != nb:
                why = (f"accepted {kb} drafts instead of {nb}: accept draft i iff u_i * q_i(x_i) < p_i(x_i) (strict), "
                       "and stop at the first rejection")
            elif int(y[b]) < 0 and nb == K:
                why = "after K acceptances there is no -1: draw the bonus token from p_K (pitfall 3b drops it)"
            elif nb == K:
                why = "the bonus token must be argmax(p_K / exponentials), a sample, not argmax p_K (pitfall 3a)"
            elif B == 1:
                why = ("this row's residual max(0, p - q) is all zero (p and q differ by rounding): guard it and race "
                       "over p instead (pitfall 4: 0 / 0 = NaN)")
            else:
                why = "at the first rejection race over the residual: argmax(max(0, p_n - q_n) / exponentials)"
            fail(ex, f"K = {K}, row {b}: expected (n = {nb}, next = {int(y_ref[b])}), got (n = {kb}, next = {int(y[b])}): "
                     f"{why}")

    def with_randoms(target_probs, draft_probs, draft_tokens, generator=None):
        B, K1, V = target_probs.shape
        u, e = draw_verify_randoms(B, K1 - 1, V, dtype=target_probs.dtype, generator=generator)
        return fn(target_probs, draft_probs, draft_tokens, u, e)

    tv = _joint(ex, "T = 1", gen, 1.0, verify_fn=with_randoms)
    passed(ex, f"bit for bit the library's verification on 961 rows (bonus, forbidden drafts, guard), and exact in law "
               f"on toy runs (TV {tv:.3f}).")


def _outcomes(gen: torch.Generator) -> tuple[dict, SpecStats]:
    """Simulated verification outcomes (K' = 4 mostly, some shorter proposals) and the SpecStats of them."""
    stats, hist = SpecStats(k=4), {}
    for k, alpha, steps in ((4, 0.7, 3000), (2, 0.7, 200), (1, 0.5, 100)):
        run = simulate_generation(alpha, k, steps, generator=gen, seed=None)
        n = torch.tensor(run.accepted)  # [S]
        stats.record(n, n + 1, torch.ones_like(n), k_step=k)
        hist[k] = torch.bincount(n, minlength=k + 1).tolist()
    return hist, stats


def check_alpha_tau(fn) -> None:
    """``fn(verify_hist)`` -> ``(alpha, tau)`` from the histograms ``{K': [steps that accepted n = 0..K' drafts]}``:
    alpha = accepted / (accepted + rejections) (a rejection: a step with n < K'), tau = tokens emitted per step;
    compared (1e-12) with :class:`SpecStats` fed the same simulated steps, on three seeds."""
    ex = "2.3"
    for seed in (0, 1, 2):
        hist, stats = _outcomes(torch.Generator().manual_seed(43 + seed))
        got = call(ex, fn, {k: list(v) for k, v in hist.items()}, what=f"alpha_tau({hist})")
        if not (isinstance(got, tuple) and len(got) == 2):
            fail(ex, f"return a pair (alpha, tau), got {got!r}")
        alpha, tau = (float(v) for v in got)
        if abs(alpha - stats.alpha) > 1e-12:
            hint = (" That is the utilisation, accepted / proposed: a chain stops at its first rejection, so count "
                    "the rejections, not the drafts." if abs(alpha - stats.utilisation) < 1e-12 else "")
            fail(ex, f"alpha: expected {stats.alpha:.6f}, got {alpha:.6f}.{hint}")
        if abs(tau - stats.tau) > 1e-12:
            fail(ex, f"tau: expected {stats.tau:.6f}, got {tau:.6f}: every step emits its n accepted drafts plus one "
                     "token (the residual sample or the bonus)")
    passed(ex, f"alpha = {stats.alpha:.3f}, tau = {stats.tau:.3f} on the last seed, as SpecStats counts them.")


_P21 = """A draft step returns the token AND the law it was drawn from; the verifier trusts that law. Write
`draft_step(logits, sampling, generator)` for `logits [B, V]` and a `SamplingConfig`: tokens `[B]` drawn with the
run's temperature / top-k / top-p, and q `[B, V]`, the law they were drawn from (greedy: the argmax, one-hot q).
The check compares q with the target's processing, samples, and runs toy speculative chains through your step."""

_S21 = '''import torch

from specdec_lesson.exercises import check_draft_step
from specdec_lesson.sampling import sample_from_probs


def draft_step(logits, sampling, generator):
    """(tokens [B], q [B, V]): the draft's proposal and the law it was drawn from."""
    raise NotImplementedError


check_draft_step(draft_step)
'''

_A21 = solve(_S21, '''
    q = sampling.probs(logits)                    # [B, V] the same processing as the target's
    return sample_from_probs(q, generator), q     # greedy: q is one-hot, so this draws the argmax
''')

_P22 = """Write chain verification from its random numbers, `verify(target_probs, draft_probs, draft_tokens, uniforms,
exponentials)`: `[B, K+1, V]`, `[B, K, V]`, `[B, K]`, `[B, K]`, `[B, V]` -> `(num_accepted [B], next_token [B])`.
Accept draft i iff `u_i * q_i(x_i) < p_i(x_i)`, stop at the first rejection; then race: the next token is
`argmax(w / exponentials)` with w the residual `max(0, p_n - q_n)` (p_n itself if that is all zero), or `p_K` after
K acceptances. The check compares you with the library row for row, then runs toy chains through you."""

_S22 = '''import torch

from specdec_lesson.exercises import check_verify


def verify(target_probs, draft_probs, draft_tokens, uniforms, exponentials):
    """(num_accepted [B], next_token [B]) of token-level chain verification."""
    raise NotImplementedError


check_verify(verify)
'''

_A22 = solve(_S22, '''
    B, K1, V = target_probs.shape
    K = K1 - 1
    tok = draft_tokens.long().unsqueeze(-1)                              # [B, K, 1]
    p_x = target_probs[:, :K].gather(-1, tok).squeeze(-1)               # [B, K]
    q_x = draft_probs.gather(-1, tok).squeeze(-1)                       # [B, K]
    n = (uniforms * q_x < p_x).long().cumprod(-1).sum(-1)               # [B] leading accepted drafts
    rows = torch.arange(B)
    p_n = target_probs[rows, n]                                          # [B, V]
    q_n = draft_probs[rows, n.clamp(max=K - 1)] * (n < K).unsqueeze(-1)  # [B, V], zero for the bonus
    w = (p_n - q_n).clamp_min(0)                                         # [B, V] residual
    w = torch.where((w > 0).any(-1, keepdim=True), w, p_n)              # guard: all zero -> p
    return n, (w / exponentials).argmax(-1)
''')

_P23 = """A run's counters hold, per proposal length K', how many steps accepted n = 0..K' drafts
(`SpecStats.verify_hist`). Write `alpha_tau(verify_hist)` returning the per-token acceptance alpha (accepted drafts
over accepted drafts plus rejections, a rejection being a step with n < K') and tau (tokens emitted per step). The
check compares with `SpecStats` on simulated runs."""

_S23 = '''from specdec_lesson.exercises import check_alpha_tau


def alpha_tau(verify_hist):
    """(alpha, tau) from {K': [steps with n = 0..K' accepted]}."""
    raise NotImplementedError


check_alpha_tau(alpha_tau)
'''

_A23 = solve(_S23, '''
    accepted = sum(n * c for h in verify_hist.values() for n, c in enumerate(h))
    rejections = sum(c for k, h in verify_hist.items() for n, c in enumerate(h) if n < k)
    steps = sum(sum(h) for h in verify_hist.values())
    return accepted / (accepted + rejections), (accepted + steps) / steps
''')

EXERCISES = [
    Exercise("2.1", "a draft step that reports its law", check_draft_step, _P21, _S21, _A21),
    Exercise("2.2", "chain verification from its random numbers", check_verify, _P22, _S22, _A22),
    Exercise("2.3", "alpha and tau from a run's counters", check_alpha_tau, _P23, _S23, _A23),
]
