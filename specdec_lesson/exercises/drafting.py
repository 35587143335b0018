"""Exercises of notebook 08 (training a draft): the distillation loss, offline acceptance replayed on fixed
target answers, and the vocabulary subset chosen by predicted speedup.  Ground truth:
:func:`specdec_lesson.distill.train.draft_loss`, :func:`specdec_lesson.distill.evaluate.offline_alpha` and
:func:`specdec_lesson.theory.speedup` on ``benchmarks/results/draft_vocab.json``."""

from __future__ import annotations

import copy

import torch

from ..theory import speedup
from ._core import Exercise, call, fail, passed, solve

__all__ = ["check_soft_ce", "check_replay", "check_subset_choice", "EXERCISES"]


class _Logits(torch.nn.Module):
    """A stand-in for the draft in ``draft_loss``: its 'features' are its logits and the head is the identity, so
    the teacher's law is softmax(targets) and the student's log_softmax(feats)."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.head = torch.eye(vocab, dtype=torch.float64)  # [N, N]

    def forward_train(self, feats, tokens, steps):
        yield feats

    def logits(self, g):
        return g


def check_soft_ce(fn) -> None:
    """``fn(teacher_logits [B, T, N], student_logits [B, T, N], weight [B, T])`` -> the weighted mean over positions of
    the cross-entropy from the teacher's law to the student's, -sum_x p(x) log q(x); compared (1e-10) with
    ``distill.train.draft_loss`` (one unrolled step, no feature regression) on 5 random batches."""
    ex = "8.1"
    from ..distill.train import draft_loss

    g = torch.Generator().manual_seed(81)
    for case in range(5):
        B, T, N = 2 + case % 2, 5 + case, 7 + 2 * case
        teacher = 3 * torch.randn(B, T, N, generator=g, dtype=torch.float64)  # [B, T, N]
        student = 3 * torch.randn(B, T, N, generator=g, dtype=torch.float64)  # [B, T, N]
        weight = torch.ones(B, T, dtype=torch.float64)
        weight[:, :2], weight[0, -1] = 0.3, 0.0  # prompt positions count less, padding not at all
        want = float(draft_loss(_Logits(N), student, None, teacher, weight, 1, reg_weight=0.0)[0])
        got = call(ex, fn, teacher.clone(), student.clone(), weight.clone(), what=f"soft_ce(<[{B}, {T}, {N}] logits>)")
        got = float(got)
        if abs(got - want) > 1e-10:
            hard = torch.nn.functional.cross_entropy(student.flatten(0, 1), teacher.argmax(-1).flatten(), reduction="none")
            hard = float((hard.view(B, T) * weight).sum() / weight.sum())
            hint = (" That is the cross-entropy to the teacher's argmax (hard labels): distil its whole law, "
                    "-sum_x softmax(teacher)(x) log_softmax(student)(x)." if abs(got - hard) < 1e-10 else
                    " Per position -sum_x p(x) log q(x), p = softmax(teacher), q = softmax(student); then sum with the "
                    "weights and divide by the sum of the weights.")
            fail(ex, f"batch {case}: expected {want:.8f}, got {got:.8f}.{hint}")
    passed(ex, "your loss equals the training loss the shipped draft was distilled with (soft labels, weighted).")


def _rows(g: torch.Generator, count: int = 6) -> list[tuple[list[int], int]]:
    """(tokens, n_prompt): a prompt of random tokens and an answer that copies spans of it with edits (so a lookup
    drafter is right for a while, then wrong)."""
    out = []
    for _ in range(count):
        prompt = torch.randint(0, 24, (40,), generator=g).tolist()
        answer: list[int] = []
        while len(answer) < 60:
            if float(torch.rand(1, generator=g)) < 0.6:
                s = int(torch.randint(0, 30, (1,), generator=g))
                answer += prompt[s:s + int(torch.randint(3, 10, (1,), generator=g))]
            else:
                answer += torch.randint(0, 24, (2,), generator=g).tolist()
        out.append((prompt + answer[:60], len(prompt)))
    return out


def check_replay(fn) -> None:
    """``fn(tokens, n_prompt, propose, k)`` -> ``(alpha, tau)`` of greedy chain speculation replayed on a fixed
    target answer (``tokens[n_prompt:]``), ``propose(context, k)`` giving up to k draft tokens; compared (to the
    library's rounding, 1e-4 and 1e-3) with ``distill.evaluate.offline_alpha`` driving a prompt-lookup drafter on 6
    sequences, K = 2, 4 and 8."""
    ex = "8.2"
    from ..distill.evaluate import offline_alpha
    from ..drafters import PromptLookupDrafter

    lookup = PromptLookupDrafter()
    for i, (tokens, n_prompt) in enumerate(_rows(torch.Generator().manual_seed(82))):
        for k in (2, 4, 8):
            row = {"tokens": torch.tensor(tokens), "feats": torch.zeros(len(tokens), 1), "n_prompt": n_prompt}
            want = offline_alpha(PromptLookupDrafter(), [row], k)["all"]
            got = call(ex, fn, list(tokens), n_prompt, lambda ctx, kk: lookup.continuation(list(ctx), kk), k,
                       what=f"replay(<sequence {i}>, n_prompt={n_prompt}, propose, k={k})")
            if not (isinstance(got, tuple) and len(got) == 2):
                fail(ex, f"return a pair (alpha, tau), got {got!r}")
            alpha, tau = (float(v) for v in got)
            if abs(alpha - want["alpha_tok"]) > 1e-4 or abs(tau - want["tau"]) > 1e-3:
                fail(ex, f"sequence {i}, K = {k}: expected alpha {want['alpha_tok']:.4f}, tau {want['tau']:.3f}; got "
                         f"alpha {alpha:.4f}, tau {tau:.3f}. Each step: propose from the answer so far, accept the "
                         "LEADING drafts equal to the answer's next tokens, then the target's token; a rejection is a "
                         "step that accepted fewer drafts than it proposed.")
    passed(ex, "your replay measures the same alpha and tau as the library's offline evaluation, the numbers the "
               "draft was selected by.")


def _subset_cases(ex: str) -> list[dict]:
    from ..bench.report import RESULTS_DIR

    path = RESULTS_DIR / "draft_vocab.json"
    if not path.exists():
        fail(ex, f"{path} is missing: run this exercise from a clone of the repository")
    import json

    dv = json.loads(path.read_text())
    try:
        cases = [{"k": dv["k"], "verify_ratio": dv["verify_ratio"],
                  "subsets": {n: {"n": r["n"], "c": r["c"], "offline": r["offline"]} for n, r in dv["subsets"].items()}}]
    except KeyError as exc:
        fail(ex, f"draft_vocab.json lacks the field {exc}: regenerate it with benchmarks/draft_vocab.py")
    g = torch.Generator().manual_seed(83)
    for _ in range(4):  # the same subsets on a machine with other costs
        alt = copy.deepcopy(cases[0])
        alt["verify_ratio"] = 0.8 + 0.8 * float(torch.rand(1, generator=g))
        for r in alt["subsets"].values():
            r["c"] *= 0.3 + 2 * float(torch.rand(1, generator=g))
        cases.append(alt)
    return cases


def check_subset_choice(fn) -> None:
    """``fn(dv, kind)`` -> ``(subset name, predicted speedup)`` maximising theory.speedup(alpha_tok, K, c,
    verify_ratio) over the subsets of ``draft_vocab.json`` (its recorded predictions and choice removed), for kind
    "code" and "math"; checked on the committed file and on 4 variants with other costs (c scaled, verify ratio
    0.8..1.6)."""
    ex = "8.3"
    for i, dv in enumerate(_subset_cases(ex)):
        for kind in ("code", "math"):
            pred = {n: speedup(r["offline"][kind]["alpha_tok"], dv["k"], r["c"], dv["verify_ratio"])
                    for n, r in dv["subsets"].items()}
            best = max(pred, key=lambda n: (pred[n], -dv["subsets"][n]["n"]))
            got = call(ex, fn, copy.deepcopy(dv), kind, what=f"best_subset(<case {i}>, {kind!r})")
            if not (isinstance(got, tuple) and len(got) == 2):
                fail(ex, f"return a pair (subset name, predicted speedup), got {got!r}")
            if got[0] != best or abs(float(got[1]) - pred[best]) > 1e-9:
                fail(ex, f"case {i} ({'the committed file' if i == 0 else 'other costs'}), {kind}: expected {best!r} at "
                         f"{pred[best]:.4f}x, got {got!r}. Score each subset with theory.speedup(alpha_tok, K, c, "
                         "verify_ratio): alpha from its offline acceptance, c its own draft cost.")
    dv = _subset_cases(ex)[0]
    full = max(dv["subsets"].values(), key=lambda r: r["n"])
    full_s = speedup(full["offline"]["code"]["alpha_tok"], dv["k"], full["c"], dv["verify_ratio"])
    picks = {kind: fn(dv, kind) for kind in ("code", "math")}
    passed(ex, "; ".join(f"{kind}: {name} predicts {s:.2f}x" for kind, (name, s) in picks.items())
           + f" (the full {full['n']}-token head: {full_s:.2f}x on code). A smaller head accepts a little less and "
             "costs much less.")


_P81 = """The draft is distilled from the target's whole next-token law, not only from its argmax: the accept test
uses all of q. Write `soft_ce(teacher_logits, student_logits, weight)` for `[B, T, N]` logits and `[B, T]` weights:
the cross-entropy -sum_x p(x) log q(x) at each position (p the teacher's softmax, q the student's), averaged with
the weights. The check compares with the loss the shipped draft was trained with."""

_S81 = '''import torch

from specdec_lesson.exercises import check_soft_ce


def soft_ce(teacher_logits, student_logits, weight):
    """Weighted mean over positions of -sum_x p(x) log q(x)."""
    raise NotImplementedError


check_soft_ce(soft_ce)
'''

_A81 = solve(_S81, '''
    p = torch.softmax(teacher_logits, -1)                    # [B, T, N]
    ce = -(p * torch.log_softmax(student_logits, -1)).sum(-1)  # [B, T]
    return (ce * weight).sum() / weight.sum()
''')

_P82 = """A draft is selected by its *offline* acceptance: chain speculation replayed on fixed greedy answers of the
target, no target forward needed. Write `replay(tokens, n_prompt, propose, k)`: starting after the prompt, each step
asks `propose(context, k')` for up to k' = min(k, answer tokens not yet emitted) drafts, accepts the leading drafts
that equal the answer's next tokens, then takes the answer's next token (the target's own); return (alpha, tau),
alpha = accepted / (accepted + rejections), tau = tokens per step. The check passes a prompt-lookup `propose`."""

_S82 = '''from specdec_lesson.exercises import check_replay


def replay(tokens, n_prompt, propose, k):
    """(alpha, tau) of greedy chain speculation replayed on tokens[n_prompt:]."""
    raise NotImplementedError


check_replay(replay)
'''

_A82 = solve(_S82, '''
    pos = n_prompt - 1                                  # index of the pending token
    accepted = rejections = steps = 0
    while pos + 1 < len(tokens):
        drafts = propose(tokens[:pos + 1], min(k, len(tokens) - pos - 1))
        n = 0
        while n < len(drafts) and drafts[n] == tokens[pos + 1 + n]:
            n += 1
        accepted, steps = accepted + n, steps + 1
        rejections += n < len(drafts)
        pos += n + 1                                    # the accepted drafts, then the target's token
    return accepted / max(1, accepted + rejections), (accepted + steps) / steps
''')

_P83 = """`benchmarks/results/draft_vocab.json` measured the shipped draft with its output layer cut to the N most
frequent tokens: per subset the offline acceptance (`offline[kind]["alpha_tok"]`) and the draft's cost `c`, with
the run's K and verify ratio T(K+1)/T(1). Write `best_subset(dv, kind)` returning the subset name with the largest
predicted speedup `theory.speedup(alpha, K, c, verify_ratio)` and that speedup (on ties, the smaller N)."""

_S83 = '''from specdec_lesson.exercises import check_subset_choice
from specdec_lesson.theory import speedup


def best_subset(dv, kind):
    """(subset name, predicted speedup) of the best vocabulary subset for `kind`."""
    raise NotImplementedError


check_subset_choice(best_subset)
'''

_A83 = solve(_S83, '''
    def score(name):
        r = dv["subsets"][name]
        return speedup(r["offline"][kind]["alpha_tok"], dv["k"], r["c"], dv["verify_ratio"])

    name = max(dv["subsets"], key=lambda n: (score(n), -dv["subsets"][n]["n"]))
    return name, score(name)
''')

EXERCISES = [
    Exercise("8.1", "the distillation loss", check_soft_ce, _P81, _S81, _A81),
    Exercise("8.2", "offline acceptance, replayed", check_replay, _P82, _S82, _A82),
    Exercise("8.3", "the vocabulary subset by predicted speedup", check_subset_choice, _P83, _S83, _A83),
]
