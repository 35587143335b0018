"""Draft sources behind one interface (:class:`Drafter`).

* :mod:`.base` - the protocol: ``begin`` / ``propose`` / ``commit``;
* :mod:`.model` - a small causal LM with its own KV cache;
* :mod:`.lookup` - prompt lookup (n-gram), model-free;
* :mod:`.eagle` - the EAGLE-style feature-level draft trained for the default target;
* :mod:`.eagle3` - its EAGLE-3 variant: features fused from three target layers;
* :mod:`.hybrid` - prompt lookup where the context repeats, a model elsewhere;
* :mod:`.suffix` - lookup over the target's own past answers (a corpus index), model-free;
* :mod:`.derived` - drafts made from the target itself (a noisy copy, its first layers), for teaching;
* :mod:`.pair` - the offline default pair (target + shipped draft); imported by nothing below it.
"""

from .base import Drafter
from .derived import noisy_copy, self_draft
from .eagle import EagleConfig, EagleDraft, EagleDrafter, load_default_draft, load_draft, save_draft
from .eagle3 import Eagle3Draft
from .hybrid import HybridDrafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter
from .suffix import CorpusLookupDrafter, SuffixIndex

__all__ = [
    "Drafter", "ModelDrafter", "PromptLookupDrafter", "EagleConfig", "EagleDraft", "Eagle3Draft", "EagleDrafter", "HybridDrafter",
    "load_draft", "save_draft", "load_default_draft", "noisy_copy", "self_draft", "CorpusLookupDrafter", "SuffixIndex",
]
