"""The benchmark's methods in one table: a method's name -> one ``Method`` entry.

An entry says what the method needs (the pair's draft, the shipped answer corpus, tree support, a Hugging Face
causal LM), whether it takes K (``--k``: one label per K), one step's largest proposal given the settings (the
context-fit check), how it runs one prompt, and its vLLM peer (``--engine vllm``).  The runner, the command line
and the vLLM engine read this table and match no method names, so a new method is one more entry in ``REGISTRY``
(``register``), with no change to the measuring loop.

``run(loaded, k, ids, settings, seed) -> (new token ids, stats dict or None)``: ``k`` is the label's K (None for a
method that takes none), ``ids`` the chat-formatted prompt, ``seed`` the call's seed (shared by every method; ours
draw from an explicit ``torch.Generator`` seeded with it, Hugging Face ``generate`` from the global RNG seeded
with it).  The entries of engine ``vllm`` run in the vLLM worker processes of ``vllm_engine``, which registers
itself in ``ENGINES`` when imported (the runner imports it, starting the workers, before any call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .loading import Loaded

__all__ = ["Method", "REGISTRY", "ENGINES", "register", "k_methods", "check_methods", "largest_step", "runs_on"]

RunOne = Callable[["Loaded", "int | None", "list[int]", Any, int], "tuple[list[int], dict | None]"]


def _k_or_one(s, k: int | None) -> int:
    return k or 1


@dataclass(frozen=True)
class Method:
    name: str
    run: RunOne  # (loaded, k, ids, settings, seed) -> (new token ids, stats dict or None)
    takes_k: bool = False  # one label per K of --k (name-k<K>); K is None otherwise
    needs_draft: bool = False  # the pair's draft model
    needs_corpus: bool = False  # the shipped answer corpus (the default target's own token ids): default pair only
    needs_tree: bool = False  # specdec_lesson.tree.tree_generate
    needs_hf_lm: bool = False  # a Hugging Face causal LM draft (or the target's self-draft), for generate
    max_step: Callable[[Any, int | None], int] = _k_or_one  # (settings, k) -> one step's largest proposal
    check: Callable[[Loaded], None] | None = None  # fails before any run, with its own error (e.g. the draft's kind)
    vllm_peer: str | None = None  # the vLLM method that runs the same algorithm (--engine vllm adds it)
    engine: str = "native"  # "vllm": a vLLM worker process (vllm_engine)
    vllm_speculative: str | None = None  # vLLM's speculative_config method (engine vllm): None, "ngram", "eagle"


REGISTRY: dict[str, Method] = {}
ENGINES: dict[str, Callable[..., tuple[list[int], dict]]] = {}  # engine -> run_one(loaded, method, k, ids, s, seed)


def register(method: Method) -> Method:
    """Add ``method`` to the table (after the others: labels and checks follow the table's order)."""
    if method.name in REGISTRY:
        raise ValueError(f"method {method.name!r} is registered already: give the new one another name")
    REGISTRY[method.name] = method
    return method


def k_methods() -> set[str]:
    """The names of the methods that take K."""
    return {name for name, m in REGISTRY.items() if m.takes_k}


def runs_on(engine: str, names: Iterable[str]) -> bool:
    """Whether any of ``names`` runs on ``engine`` (e.g. "vllm")."""
    return any((m := REGISTRY.get(n)) is not None and m.engine == engine for n in names)


# ------------------------------------------------------------------------------------ helpers
def _stats_dict(stats) -> dict:
    keys = ("k", "accepted", "rejections", "proposed", "emitted", "row_steps", "target_forwards", "draft_forwards",
            "time_prefill", "time_draft", "time_verify", "time_other")
    d = {key: getattr(stats, key) for key in keys if hasattr(stats, key)}  # rejections: metrics' alpha needs it
    d["accept_hist"] = list(stats.accept_hist)
    # raw verification outcomes by proposal length (before EOS / budget cuts): stats.acceptance_independence's sample
    d["verify_hist"] = {str(k): list(h) for k, h in sorted(getattr(stats, "verify_hist", {}).items())}
    return d


def _cut_eos(tokens: list[int], eos) -> list[int]:
    eos = set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


def _tree_generate():
    try:
        from .. import tree
    except ImportError:
        tree = None
    fn = getattr(tree, "tree_generate", None)
    if fn is None:
        raise ValueError("method 'tree' needs specdec_lesson.tree.tree_generate, which this checkout does not provide yet")
    return fn


def _hybrid_tree(s):
    """The tree ``hybrid-tree`` drafts: the default HybridTree (an EAGLE-2 tree of 6 nodes, depth 3; on a lookup
    step the draft's top 2 at depth 1) with ``hybrid_lookup_k`` lookup tokens."""
    from ..tree.hybrid import HybridTree

    return HybridTree(lookup_len=s.hybrid_lookup_k)


def _corpus_lookup(loaded: Loaded):
    """A fresh ``CorpusLookupDrafter`` over the shipped answer corpus; the index is built once per loaded pair."""
    from ..drafters.suffix import CorpusLookupDrafter, default_answer_index

    if getattr(loaded, "_answer_index", None) is None:
        loaded._answer_index = default_answer_index()
    return CorpusLookupDrafter(loaded._answer_index)


def _ours(generate: Callable) -> RunOne:
    """A run of our decoders: the prompt as a [1, L] tensor, sampling settings, a Generator seeded with ``seed``;
    ``generate(loaded, x, k, s, samp, gen)`` returns (tokens [1, L'], stats)."""
    def run(loaded: Loaded, k: int | None, ids: list[int], s, seed: int) -> tuple[list[int], dict | None]:
        import torch

        x = torch.tensor([ids], dtype=torch.long, device=loaded.device)  # [1, L]
        samp = dict(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p)
        gen = torch.Generator(device=loaded.device).manual_seed(seed)
        toks, stats = generate(loaded, x, k, s, samp, gen)
        return toks[0].tolist(), _stats_dict(stats)
    return run


def _ar(loaded, x, k, s, samp, gen):
    from ..speculative import autoregressive_generate

    return autoregressive_generate(loaded.target, x, s.max_new_tokens, **samp, generator=gen,
                                   eos_token_id=loaded.eos_token_id)


def _chain(drafter: Callable) -> RunOne:
    """``speculative_generate`` with K drafts per step from ``drafter(loaded, s)``, built afresh per call."""
    def generate(loaded, x, k, s, samp, gen):
        from ..speculative import speculative_generate

        return speculative_generate(loaded.target, drafter(loaded, s), x, s.max_new_tokens, k=k, **samp, generator=gen,
                                    eos_token_id=loaded.eos_token_id)
    return _ours(generate)


def _tree(loaded, x, k, s, samp, gen):  # the default StaticTree shape
    return _tree_generate()(loaded.target, loaded.draft, x, s.max_new_tokens, **samp, generator=gen,
                            eos_token_id=loaded.eos_token_id)


def _hybrid_tree_run(loaded, x, k, s, samp, gen):  # the draft's tree + the answer lookup's continuation, in one tree
    from ..tree.hybrid import HybridTreeDrafter

    drafter = HybridTreeDrafter(loaded.draft, lookup=_corpus_lookup(loaded))
    return _tree_generate()(loaded.target, drafter, x, s.max_new_tokens, tree=_hybrid_tree(s), **samp,
                            generator=gen, eos_token_id=loaded.eos_token_id)


def _adaptive_tree_run(loaded, x, k, s, samp, gen):  # the tree's depth and size chosen per step (tree.adaptive)
    from ..tree.adaptive import AdaptiveTree
    from ..tree.hybrid import HybridTreeDrafter

    _adaptive_costs(loaded)
    drafter = HybridTreeDrafter(loaded.draft, lookup=_corpus_lookup(loaded))
    tree = AdaptiveTree(loaded._adaptive_costs, lookup_len=s.hybrid_lookup_k)
    return _tree_generate()(loaded.target, drafter, x, s.max_new_tokens, tree=tree, **samp, generator=gen,
                            eos_token_id=loaded.eos_token_id)


def _adaptive_tree_check(loaded: Loaded) -> None:
    _drafts_trees(loaded)
    _adaptive_costs(loaded)


def _adaptive_tree_step(s, k) -> int:
    from ..tree.adaptive import AdaptiveTree

    return max(AdaptiveTree.depth, s.hybrid_lookup_k) + 1


def _hybrid(loaded, s):
    from ..drafters.hybrid import HybridDrafter

    return HybridDrafter(loaded.draft, lookup_k=s.hybrid_lookup_k)


def _hybrid_suffix(loaded, s):  # the lookup also searches the target's past answers (drafters.suffix)
    from ..drafters.hybrid import HybridDrafter

    return HybridDrafter(loaded.draft, lookup_k=s.hybrid_lookup_k, lookup=_corpus_lookup(loaded))


def _adaptive_model(loaded: Loaded):
    """The pair's draft as a Drafter (a causal LM draft as a ModelDrafter)."""
    from ..drafters import Drafter, ModelDrafter

    return loaded.draft if isinstance(loaded.draft, Drafter) else ModelDrafter(loaded.draft)


def _adaptive_costs(loaded: Loaded) -> None:
    """Measure this machine's step costs once per loaded pair, before any timed run (a few seconds): T(n) up to
    n = 17 (K <= 16 and the hybrid's lookup) and the draft's cost per step (drafters.adaptive.measure_step_costs)."""
    import torch

    from ..drafters.adaptive import measure_step_costs

    if getattr(loaded, "_adaptive_costs", None) is None:
        V = loaded.target.get_output_embeddings().weight.shape[0]
        ids = torch.randint(V, (1, 64), generator=torch.Generator().manual_seed(0)).to(loaded.device)  # [1, 64]
        c = loaded._adaptive_costs = measure_step_costs(loaded.target, _adaptive_model(loaded), ids, 4, max_width=17)
        ms = lambda x: f"{1e3 * x:.2f}"  # noqa: E731
        loaded.notes.append(  # what the policy was fed: a run on a host whose speed shifted can be read against it
            f"adaptive: step costs measured once before the timed runs (drafters.adaptive.measure_step_costs): T(1..8) "
            f"{' / '.join(ms(x) for x in c.verify[:8])} ms, T(17) {ms(c.verify[-1])} ms; the draft's first token "
            f"{ms(c.draft_first)} ms, each further one {ms(c.draft_next)} ms, overhead per drafting step {ms(c.overhead)} "
            f"ms, a plain step of the loop {ms(c.plain_step)} ms")


def _adaptive(loaded, x, k, s, samp, gen):
    """The hybrid (or the draft alone, when it cannot take lookup proposals) with K in 0..k chosen per step."""
    from ..drafters.adaptive import AdaptiveDrafter
    from ..speculative import speculative_generate

    _adaptive_costs(loaded)
    model = _adaptive_model(loaded)
    inner = _hybrid(loaded, s) if getattr(model, "accepts_foreign_proposals", False) else model
    return speculative_generate(loaded.target, AdaptiveDrafter(inner, loaded._adaptive_costs, k), x, s.max_new_tokens,
                                k=k, **samp, generator=gen, eos_token_id=loaded.eos_token_id)


def _prompt_lookup(loaded, s):
    from ..drafters import PromptLookupDrafter

    return PromptLookupDrafter(max_ngram=s.prompt_lookup_ngram)


def _hf(options: Callable | None = None) -> RunOne:
    """Hugging Face ``generate``; ``options(loaded, k, s)`` adds its assisted-decoding keywords.  Its sampling draws
    from the global RNG, seeded per call (same seed for every method)."""
    def run(loaded: Loaded, k: int | None, ids: list[int], s, seed: int) -> tuple[list[int], dict | None]:
        import torch

        x = torch.tensor([ids], dtype=torch.long, device=loaded.device)  # [1, L]
        eos = loaded.eos_token_id
        pad = (eos[0] if isinstance(eos, (list, tuple)) else eos) if eos is not None else 0
        kw: dict = dict(max_new_tokens=s.max_new_tokens, do_sample=s.temperature > 0, attention_mask=torch.ones_like(x),
                        eos_token_id=eos, pad_token_id=pad)
        if s.temperature > 0:
            kw.update(temperature=s.temperature, top_k=s.top_k or 0, top_p=s.top_p if s.top_p is not None else 1.0)
        else:
            kw.update(temperature=None, top_k=None, top_p=None)
        if options is not None:
            kw.update(options(loaded, k, s))
        torch.manual_seed(seed)
        out = loaded.target.generate(x, **kw)  # [1, L + new]
        return _cut_eos(out[0, x.shape[1]:].tolist(), loaded.eos_token_id), None
    return run


def _assistant(loaded, k, s) -> dict:
    assistant = loaded.hf_assistant(s.hf_assistant_layers)
    cfg = assistant.generation_config
    cfg.num_assistant_tokens, cfg.num_assistant_tokens_schedule = k, "constant"
    cfg.assistant_confidence_threshold = 0.0  # no early stop: exactly K drafts per round, like ours
    return {"assistant_model": assistant}


def _hf_prompt_lookup(loaded, k, s) -> dict:
    return {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": s.prompt_lookup_ngram}


def _on_engine(engine: str, name: str) -> RunOne:
    def run(loaded: Loaded, k: int | None, ids: list[int], s, seed: int) -> tuple[list[int], dict | None]:
        fn = ENGINES.get(engine)
        if fn is None:  # the engine's module was never imported, so none of its workers was started
            raise RuntimeError(f"no vLLM worker for {name} k={k}: prepare() was not called")
        return fn(loaded, name, k, ids, s, seed)
    return run


def _takes_lookups(loaded: Loaded) -> None:
    from ..drafters.hybrid import HybridDrafter

    HybridDrafter(loaded.draft)  # fails now, with its own error, if this draft cannot take lookup proposals


def _drafts_trees(loaded: Loaded) -> None:
    from ..tree.hybrid import HybridTreeDrafter

    HybridTreeDrafter(loaded.draft)  # fails now, with its own error, if this draft cannot draft trees


def _static_tree_step(s, k) -> int:
    from ..tree import StaticTree

    return StaticTree().max_depth + 1  # the default tree shape tree_generate runs


# ------------------------------------------------------------------------------------ the table
for _m in (
    Method("ar", _ours(_ar), vllm_peer="vllm"),
    Method("chain", _chain(lambda loaded, s: loaded.draft), takes_k=True, needs_draft=True, vllm_peer="vllm-eagle"),
    Method("hybrid", _chain(_hybrid), takes_k=True, needs_draft=True, check=_takes_lookups,
           max_step=lambda s, k: max(k or 1, s.hybrid_lookup_k)),
    Method("hybrid-suffix", _chain(_hybrid_suffix), takes_k=True, needs_draft=True, needs_corpus=True,
           check=_takes_lookups, max_step=lambda s, k: max(k or 1, s.hybrid_lookup_k)),
    Method("adaptive", _ours(_adaptive), takes_k=True, needs_draft=True, check=_adaptive_costs,
           max_step=lambda s, k: max(k or 1, s.hybrid_lookup_k)),
    Method("suffix", _chain(lambda loaded, s: _corpus_lookup(loaded)), takes_k=True, needs_corpus=True),
    Method("tree", _ours(_tree), needs_draft=True, needs_tree=True, max_step=_static_tree_step),
    Method("hybrid-tree", _ours(_hybrid_tree_run), needs_draft=True, needs_corpus=True, needs_tree=True,
           check=_drafts_trees, max_step=lambda s, k: _hybrid_tree(s).max_depth + 1),
    Method("adaptive-tree", _ours(_adaptive_tree_run), needs_draft=True, needs_corpus=True, needs_tree=True,
           check=_adaptive_tree_check, max_step=_adaptive_tree_step),
    Method("prompt-lookup", _chain(_prompt_lookup), takes_k=True, vllm_peer="vllm-ngram"),
    Method("hf", _hf()),
    Method("hf-assisted", _hf(_assistant), takes_k=True, needs_hf_lm=True),
    Method("hf-prompt-lookup", _hf(_hf_prompt_lookup), takes_k=True),
    Method("vllm", _on_engine("vllm", "vllm"), engine="vllm"),
    Method("vllm-ngram", _on_engine("vllm", "vllm-ngram"), takes_k=True, engine="vllm", vllm_speculative="ngram"),
    Method("vllm-eagle", _on_engine("vllm", "vllm-eagle"), takes_k=True, engine="vllm", vllm_speculative="eagle"),
):
    register(_m)


# ------------------------------------------------------------------------------------ checks
def largest_step(s, labels) -> int:
    """One step's largest proposal over ``labels`` ((label, method, k); K None counts one draft)."""
    return max([1] + [REGISTRY[m].max_step(s, k) for _, m, k in labels])


def check_methods(loaded: Loaded, names: Iterable[str]) -> None:
    """Everything the methods ``names`` need from this pair, checked before any run: one error naming the fix."""
    chosen = [m for name, m in REGISTRY.items() if name in set(names)]
    drafted = sorted(m.name for m in chosen if m.needs_draft)
    if loaded.draft is None and drafted:
        raise ValueError(f"methods {drafted} need a draft model, and this pair has "
                         "none (use --method ar,prompt-lookup,suffix,hf,hf-prompt-lookup, or another --pair)")
    if any(m.needs_corpus for m in chosen):
        from ..drafters.suffix import DEFAULT_CORPUS, load_answer_corpus

        load_answer_corpus()  # a missing or damaged corpus: its own error, naming the fix, before any run
        if loaded.info.get("pair") != "default":
            raise ValueError(f"methods suffix / hybrid-suffix / hybrid-tree / adaptive-tree search {DEFAULT_CORPUS.name}, "
                             "the default target's own answers (token ids of its tokenizer): use them with --pair default")
    hf_names = [m.name for m in chosen if m.needs_hf_lm]
    done: set = set()
    for m in chosen:  # in the table's order; each check once
        for key, fn in (("tree", _tree_generate if m.needs_tree else None),
                        (m.check, partial(m.check, loaded) if m.check is not None else None),
                        ("hf", partial(_hf_lm, loaded, hf_names) if m.needs_hf_lm else None)):
            if fn is not None and key not in done:
                done.add(key)
                fn()


def _hf_lm(loaded: Loaded, names: list[str]) -> None:
    assistant = loaded.hf_assistant()
    which = ", ".join(names)
    if assistant is None:
        raise ValueError(f"method '{which}' needs a Hugging Face causal LM draft, and this pair has none "
                         f"(draft: {type(loaded.draft).__name__})")
    if assistant is not loaded.draft and getattr(loaded.draft, "model", None) is assistant:
        loaded.notes.append(f"{which} uses the causal LM inside the pair's {type(loaded.draft).__name__} "
                            f"({type(assistant).__name__})")
