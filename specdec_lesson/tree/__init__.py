"""Token trees, in one direction: structure and masks -> lossless verification -> generation.

* :mod:`.structure` - :class:`TokenTree`, static and dynamic (EAGLE-2) construction, :func:`tree_mask`;
* :mod:`.verify` - multi-round speculative sampling over siblings (``"iid"`` / ``"distinct"`` rules),
  one walk driven by torch random numbers or enumerated exactly with Fractions;
* :mod:`.adaptive` - :class:`AdaptiveTree`: each step's depth and node count chosen from the run's acceptance and
  the machine's costs (expected tokens per second);
* :mod:`.hybrid` - :class:`HybridTree`: the draft's tree plus a lookup continuation grafted below the root;
* :mod:`.exact` - exact and Monte Carlo laws of whole tree runs on toy Markov models (for the proofs);
* :mod:`.generate` - :func:`tree_generate`, the engine on Hugging Face models.
"""

from .adaptive import AdaptiveTree, TreeAcceptance, best_node_count, build_adaptive_tree
from .exact import sample_tree_toy, tree_joint, tree_step_law
from .generate import tree_generate
from .hybrid import HybridTree, HybridTreeDrafter, build_hybrid_tree
from .structure import DynamicTree, Expand, StaticTree, TokenTree, build_tree, tree_mask
from .verify import (
    RULES,
    FractionRules,
    TorchRules,
    tree_outcome_law,
    verify_tree,
    verify_tree_from_randoms,
    verify_tree_greedy,
    walk_tree,
)

__all__ = [
    "TokenTree", "StaticTree", "DynamicTree", "Expand", "build_tree", "tree_mask", "tree_generate",
    "HybridTree", "HybridTreeDrafter", "build_hybrid_tree", "AdaptiveTree", "TreeAcceptance", "build_adaptive_tree",
    "best_node_count",
    "RULES", "TorchRules", "FractionRules", "walk_tree", "verify_tree", "verify_tree_from_randoms",
    "verify_tree_greedy", "tree_outcome_law", "tree_step_law", "tree_joint", "sample_tree_toy",
]
