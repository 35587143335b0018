"""Bad arguments get one clear ValueError naming the argument, the value and what is allowed (validate.py and its
users: the engines' eos_token_id and rule, theory, the simulator, SpecStats); valid inputs of every numeric type the
notebooks pass (numpy / torch scalars, Fractions, alpha = 0 or 1) still work."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from specdec_lesson import theory
from specdec_lesson.models import tiny_llama
from specdec_lesson.sim import simulate_generation, spec_timing, speedup_curve, tree_expected_tokens, tree_speedup
from specdec_lesson.sim.calibrate import Profile, predict_speedup
from specdec_lesson.speculative import autoregressive_generate, speculative_generate
from specdec_lesson.stats import SpecStats, truncated_geometric
from specdec_lesson.tree import tree_generate
from specdec_lesson.validate import as_int, as_law, as_prob, as_real, as_token_ids

NAN = float("nan")


def test_helpers_accept_every_numeric_type_and_name_the_argument():
    assert as_int(np.int64(3), "k", lo=1) == 3 and as_int(torch.tensor(3), "k") == 3
    assert as_real(np.float32(0.5), "c") == 0.5 and as_real(torch.tensor(0.25), "c") == 0.25
    assert as_real(Fraction(1, 4), "c") == 0.25 and as_prob(0, "alpha") == 0.0 and as_prob(1, "alpha") == 1.0
    assert as_law(torch.tensor([0.2, 0.8], dtype=torch.float32), "p") == pytest.approx([0.2, 0.8])
    assert as_token_ids([1, np.int64(2)], "eos_token_id", 8) == [1, 2] and as_token_ids(None, "eos_token_id", 8) == []
    cases = [
        (lambda: as_int(2.5, "k", lo=1), "k must be an integer >= 1, got 2.5"),
        (lambda: as_int(True, "k", lo=1), "k must be an integer >= 1, got True"),
        (lambda: as_real(NAN, "c", lo=0), "c must be a finite number >= 0, got nan"),
        (lambda: as_real("0.5", "c"), "c must be a finite number, got '0.5'"),
        (lambda: as_prob(1.5, "alpha"), "alpha must be a finite number >= 0 and <= 1, got 1.5"),
        (lambda: as_law([0.5, 0.6], "p"), r"p must sum to 1 \(within 1e-06\), sums to 1.1"),
        (lambda: as_law([1.5, -0.5], "p"), r"p\[1\] must be a finite number >= 0, got -0.5"),
        (lambda: as_token_ids(-1, "eos_token_id", 8), r"eos_token_id must be .* in 0..7 .*got -1"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(), tiny_llama(hidden_size=16, num_layers=1, num_heads=2, num_kv_heads=1, seed=1)


@pytest.mark.parametrize("eos, shown", [("2", "'2'"), (-1, "-1"), (64, "64"), (2.0, "2.0"), ([3, 99], "99"),
                                         (True, "True")])
def test_engines_refuse_a_bad_eos_token_id(pair, eos, shown):
    target, draft = pair
    runs = [lambda: autoregressive_generate(target, [[1, 2, 3]], 3, eos_token_id=eos),
            lambda: speculative_generate(target, draft, [[1, 2, 3]], 3, k=2, eos_token_id=eos),
            lambda: tree_generate(target, draft, [[1, 2, 3]], 3, eos_token_id=eos)]
    for run in runs:
        with pytest.raises(ValueError, match=rf"eos_token_id must be None, a token id or a list of token ids, each an "
                                             rf"integer in 0..63.*got .*{shown}"):
            run()


def test_engines_accept_every_form_of_eos(pair):
    target, draft = pair
    ref, _ = autoregressive_generate(target, [[1, 2, 3]], 6)
    stop = int(ref[0][2])
    for eos in (stop, np.int64(stop), torch.tensor(stop), [stop, 63], (stop,), torch.tensor([stop])):
        out, _ = speculative_generate(target, draft, [[1, 2, 3]], 6, k=2, eos_token_id=eos)
        assert out[0].tolist() == ref[0][: ref[0].tolist().index(stop) + 1].tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_tree_refuses_an_unknown_rule_at_every_temperature(pair, temperature):
    target, draft = pair
    with pytest.raises(ValueError, match=r"rule must be None \(the tree's own sibling rule\) or one of \('iid', "
                                         r"'distinct'\), got 'bogus'"):
        tree_generate(target, draft, [[1, 2, 3]], 3, temperature=temperature, rule="bogus",
                      generator=torch.Generator().manual_seed(0))


def test_theory_refuses_nan_and_bad_laws():
    cases = [
        (lambda: theory.best_k(0.8, NAN), "c must be a finite number >= 0, got nan"),
        (lambda: theory.best_k(NAN, 0.1), "alpha must be a finite number >= 0 and <= 1, got nan"),
        (lambda: theory.best_k(0.8, 0.1, k_max=2.5), "k_max must be an integer >= 1, got 2.5"),
        (lambda: theory.best_k(0.8, 0.1, verify_ratio=lambda n: NAN), r"verify_ratio\(2\) must be a finite number > 0"),
        (lambda: theory.speedup(0.8, 4, 0.1, verify_ratio=math.inf), "verify_ratio must be a finite number > 0, got inf"),
        (lambda: theory.speedup(0.8, 4.0, 0.1), "k must be an integer >= 1, got 4.0"),
        (lambda: theory.expected_tokens(0.8, 2.5), "k must be an integer >= 1, got 2.5"),
        (lambda: theory.speedup_bound(0.8, NAN), "c must be a finite number >= 0, got nan"),
        (lambda: theory.acceptance_rate([0.5, 0.7], [0.5, 0.5]), r"target_probs must sum to 1"),
        (lambda: theory.acceptance_rate([NAN, 1.0], [0.5, 0.5]), r"target_probs\[0\] must be a finite number >= 0"),
        (lambda: theory.acceptance_rate([1.2, -0.2], [0.5, 0.5]), r"target_probs\[1\] must be a finite number >= 0"),
        (lambda: theory.exact_emit_law([NAN, 1.0], [0.5, 0.5]), r"target_law\[0\] must be a finite number, got nan"),
        (lambda: theory.token_expected_accepted([0.5, 0.5], [0.5, 0.5], 1.5), "k must be an integer >= 1, got 1.5"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    # valid inputs the notebooks use keep working: numpy scalars, tensors, alpha = 0 and 1, Fractions
    assert theory.best_k(np.float64(0.8), np.float32(0.1)) == theory.best_k(0.8, 0.1)
    assert theory.expected_tokens(1, np.int64(3)) == 4.0 and theory.expected_tokens(0.0, 3) == 1.0
    p, q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64), torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    assert theory.acceptance_rate(p, q) == pytest.approx(0.7)
    assert theory.expected_accepted_bound([Fraction(1, 3), Fraction(2, 3)], [Fraction(2, 3), Fraction(1, 3)], 2) == \
        Fraction(12, 9)


def test_simulator_refuses_nan_and_non_integers():
    cases = [
        (lambda: simulate_generation(0.8, 4, 1.5), "n_steps must be an integer >= 1, got 1.5"),
        (lambda: simulate_generation(NAN, 4, 10), "alpha must be a finite number >= 0 and <= 1, got nan"),
        (lambda: simulate_generation([0.5, NAN], 2, 10), r"alpha\[1\] must be a finite number"),
        (lambda: simulate_generation(0.8, 4, 10, t_draft=NAN), "t_draft must be a finite number >= 0, got nan"),
        (lambda: tree_expected_tokens([0.5, NAN]), r"accept_by_depth\[1\] must be a finite number >= 0 and <= 1"),
        (lambda: tree_speedup([0.5], 3, NAN), "c must be a finite number >= 0, got nan"),
        (lambda: tree_speedup([0.5], 2.5, 0.1), "n_nodes must be an integer >= 1, got 2.5"),
        (lambda: spec_timing("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", k=4, alpha=NAN), "alpha must be a finite number"),
        (lambda: spec_timing("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", k=4, batch=NAN), "batch must be an integer >= 1"),
        (lambda: speedup_curve("H100 SXM", "Llama-3-8B", "Llama-3.2-1B", 0.8, k_max=2.5), "k_max must be an integer"),
        (lambda: Profile({1: 0.01}, t_draft=NAN, alpha=0.5), "t_draft must be a finite number >= 0, got nan"),
        (lambda: Profile({1: NAN}, t_draft=0.001, alpha=0.5), r"verify_curve\[1\] must be a finite number > 0"),
        (lambda: predict_speedup(Profile({1: 0.01, 4: 0.02}, 0.001, 0.5), 2.5), "k must be an integer >= 1, got 2.5"),
        (lambda: SpecStats(k=2.5), r"SpecStats k \(drafts per step\) must be an integer >= 0, got 2.5"),
        (lambda: truncated_geometric(0.5, 1.5), "k must be an integer >= 0, got 1.5"),
        (lambda: truncated_geometric(NAN, 2), "alpha must be a finite number"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    assert simulate_generation(np.float64(0.7), np.int64(3), np.int64(20), seed=0).accepted == \
        simulate_generation(0.7, 3, 20, seed=0).accepted
    assert simulate_generation(np.float32(0.5), 2, 5).k == 2 and SpecStats(k=np.int64(2)).k == 2
    assert Profile.from_dict({"verify_curve": {"1": 0.01, "4": 0.02}, "t_draft": 0.001, "alpha": 0.5}).T(4) == 0.02
