"""Verification of a drafted chain, exact in distribution:

* :mod:`.chain` - the token-level rule (Leviathan et al. 2023, Alg. 1): accept / residual / bonus, batched, in
  at least fp32 whatever the laws' dtype;
* :mod:`.block` - block verification (Sun et al. 2024): the same random numbers, never fewer accepted drafts
  in expectation, with its Fraction-exact twin.
"""

from .block import (
    VERIFY_RULES,
    block_outcome_law,
    block_thresholds,
    block_thresholds_exact,
    expected_accepted_given_drafts,
    token_outcome_law,
    verify_block,
    verify_block_from_randoms,
)
from .chain import (
    HALF_DTYPES,
    as_verify_law,
    check_verify_inputs,
    draw_verify_randoms,
    prepare_verify_inputs,
    race_sample,
    verify_chain,
    verify_chain_from_randoms,
    verify_dtype,
)

__all__ = [
    "verify_chain",
    "verify_chain_from_randoms",
    "draw_verify_randoms",
    "check_verify_inputs",
    "prepare_verify_inputs",
    "verify_dtype",
    "as_verify_law",
    "race_sample",
    "HALF_DTYPES",
    "VERIFY_RULES",
    "block_thresholds",
    "verify_block_from_randoms",
    "verify_block",
    "block_thresholds_exact",
    "expected_accepted_given_drafts",
    "block_outcome_law",
    "token_outcome_law",
]
