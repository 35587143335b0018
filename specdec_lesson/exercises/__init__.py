"""Exercises with checks, for every notebook of the course.

Each exercise asks the learner to write a function (or predict a number) in a cell and hands it to a check from
this package, which prints ``Exercise N.M passed: ...`` or raises an AssertionError saying what is wrong.  The
checks grade against the library's own reference functions (theory, verify, tree, kvcache, sim, stats, bench,
distill), never against hard-coded answers; the statistical ones state their false-alarm rate and power.

* :data:`EXERCISES` - ``{notebook file stem: [Exercise, ...]}``; an :class:`Exercise` holds ``id``, ``title``,
  ``check`` and, as data, the markdown ``prompt``, the ``starter`` cell and the ``solution`` cell;
* ``python -m specdec_lesson.exercises.insert`` writes each notebook's "## Exercises" section from it (solutions
  in place, so the test command runs them); ``--starters DIR`` writes learner copies with the starters instead.

Modules by topic: :mod:`.memory_wall` (00), :mod:`.rejection` and :mod:`.payoff` (01), :mod:`.decoding` (02),
:mod:`.rollback` and :mod:`.pages` (03), :mod:`.trees` (04), :mod:`.kernels` (05), :mod:`.simulator` (06),
:mod:`.benchmarks` (07), :mod:`.drafting` (08); :mod:`._core` holds what they share.
"""

from __future__ import annotations

from . import benchmarks, decoding, drafting, kernels, memory_wall, pages, payoff, rejection, rollback, simulator, trees
from ._core import Exercise
from .benchmarks import check_choose_k, check_pooled_alpha, check_predicted_speedup, verify_curves
from .decoding import check_alpha_tau, check_draft_step, check_verify
from .drafting import check_replay, check_soft_ce, check_subset_choice
from .kernels import check_accept_kernel, check_bug_is_caught, check_chunked_race, check_leading_accepts
from .memory_wall import check_compute_bound_batch, check_kv_crossover, check_memory_time
from .pages import check_blocks_to_free, check_positions
from .payoff import check_block_prediction, check_no_bonus_tokens
from .rejection import check_accept, check_residual, check_speculative_sample
from .rollback import check_draft_cache_prediction, check_target_keep
from .simulator import check_alpha_needed, check_last_batch, check_simulation, check_tree_tokens
from .trees import check_distinct_rule, check_iid_rule, check_node_count, check_tree_mask

__all__ = [
    "EXERCISES", "Exercise", "by_id", "verify_curves",
    "check_memory_time", "check_compute_bound_batch", "check_kv_crossover",
    "check_accept", "check_residual", "check_speculative_sample", "check_no_bonus_tokens", "check_block_prediction",
    "check_draft_step", "check_verify", "check_alpha_tau",
    "check_target_keep", "check_draft_cache_prediction", "check_blocks_to_free", "check_positions",
    "check_distinct_rule", "check_iid_rule", "check_tree_mask", "check_node_count",
    "check_leading_accepts", "check_accept_kernel", "check_bug_is_caught", "check_chunked_race",
    "check_alpha_needed", "check_last_batch", "check_tree_tokens", "check_simulation",
    "check_choose_k", "check_pooled_alpha", "check_predicted_speedup",
    "check_soft_ce", "check_replay", "check_subset_choice",
]

EXERCISES: dict[str, list[Exercise]] = {
    "00_memory_wall": memory_wall.EXERCISES,
    "01_rejection_sampling": rejection.EXERCISES + payoff.EXERCISES,
    "02_speculative_decoding": decoding.EXERCISES,
    "03_kv_cache_rollback": rollback.EXERCISES + pages.EXERCISES,
    "04_tree_verification": trees.EXERCISES,
    "05_triton_kernels": kernels.EXERCISES,
    "06_latency_simulator": simulator.EXERCISES,
    "07_benchmarks": benchmarks.EXERCISES,
    "08_training_a_draft": drafting.EXERCISES,
}


def by_id(ex_id: str) -> Exercise:
    """The exercise ``"N.M"``; ValueError naming the known ids otherwise."""
    for exercises in EXERCISES.values():
        for ex in exercises:
            if ex.id == ex_id:
                return ex
    known = ", ".join(ex.id for exs in EXERCISES.values() for ex in exs)
    raise ValueError(f"no exercise {ex_id!r}; the exercises are {known}")
