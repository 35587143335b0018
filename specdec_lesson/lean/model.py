"""A lean forward of a Hugging Face Llama: its weights, fused, and one function per forward.

What the Hugging Face forward spends on a one-token decode step besides the matrix products (a cache object, a
4D mask built per step, RoPE recomputed per step, three projections where one would do, hooks and output records)
is small next to the 540 MB of weights SmolLM2-135M reads per token, but it is paid 30 times per forward.  Here:

* Q, K and V are ONE matrix per layer ``[(heads + 2 kv_heads) * head_dim, hidden]`` and gate / up are ONE
  ``[2 * intermediate, hidden]`` (concatenated copies; o_proj, down_proj, the norms and the embedding are shared
  with the Hugging Face model, not copied);
* RoPE's cos / sin are tables over every position, computed once (bit-equal to Hugging Face's per-step ones);
* attention is one ``scaled_dot_product_attention`` per layer over the static cache (:mod:`.cache`): the
  kv_heads x group queries sharing a KV head are laid out as ``group * n`` query rows, so K and V are never
  repeated; a one-token step of equal-length rows needs no mask at all;
* per forward width (rows = batch x new tokens) the products use the plain weights or oneDNN pre-packed ones
  (:mod:`specdec_lesson.fastcpu`), as the Hugging Face model does: widths up to ``plain_rows_max`` plain.

:func:`check_supported` names what this forward cannot run (one ``UnsupportedModelError``); callers then use the
Hugging Face path.  ``lean_model(model)`` builds the lean copy once per model and rebuilds it when a weight changed.

Per forward width the lean copy inherits the model's plain / pre-packed threshold (``profiling.tune_dispatch``,
which times the Hugging Face forward); its fused matrices have other shapes, so :func:`tune_lean_dispatch` can time
the lean forward itself with both kinds of weights and keep its own threshold.
"""

from __future__ import annotations

import time
import warnings
import weakref

import torch
import torch.nn.functional as F

from ..fastcpu import PackedLinear, _pack, _packed_linear, _weight_key, packed_linear_available, plain_rows
from ..profiling import NOISY_SPREAD, _status, needs_more_rounds, noisy_probe_note, probe_cost, relative_spread
from .cache import StaticKVCache, Step

__all__ = ["UnsupportedModelError", "check_supported", "LeanLlama", "lean_model", "lean_verify_curve", "tune_lean_dispatch"]

_ROPE_TYPES = ("default", "linear", "llama3")  # static inv_freq tables (dynamic / yarn-style updates are not)
_HALF = (torch.float16, torch.bfloat16)


class UnsupportedModelError(ValueError):
    """The lean forward cannot run this model; use the Hugging Face path (``lean=False``)."""


def check_supported(model) -> None:
    """Raise ONE :class:`UnsupportedModelError` naming why the lean forward cannot run ``model``, else return."""
    from transformers import LlamaForCausalLM
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    fix = "; the engine uses the Hugging Face forward for it (lean=False)"
    if type(model) is not LlamaForCausalLM:
        raise UnsupportedModelError(f"the lean forward runs LlamaForCausalLM models only, got {type(model).__name__}{fix}")
    cfg = model.config
    problem = None
    rope = getattr(model.model.rotary_emb, "rope_type", None)
    layers = list(model.model.layers)
    params = list(model.parameters())
    linear = (torch.nn.Linear, PackedLinear)
    if cfg.hidden_act != "silu":
        problem = f"hidden_act {cfg.hidden_act!r} (only 'silu')"
    elif rope not in _ROPE_TYPES:
        problem = f"rope_type {rope!r} (only {', '.join(_ROPE_TYPES)})"
    elif len(layers) != cfg.num_hidden_layers or any(type(la) is not LlamaDecoderLayer for la in layers):
        problem = "its decoder layers are not the num_hidden_layers LlamaDecoderLayers of its config"
    elif any(hasattr(m, "_hf_hook") for m in model.modules()):
        problem = "accelerate hooks (device_map / offloading) on its modules"
    elif any(type(m) not in linear for la in layers for m in (*_attn_linears(la), *_mlp_linears(la))) or \
            type(model.lm_head) not in linear:
        problem = "projections that are not plain (or pre-packed) nn.Linear modules (quantized, LoRA, ...)"
    elif len({(p.device, p.dtype) for p in params}) != 1 or not params[0].is_floating_point():
        problem = "parameters of several devices or dtypes, or not floating point"
    if problem is not None:
        raise UnsupportedModelError(f"the lean forward cannot run this LlamaForCausalLM: {problem}{fix}")


def _attn_linears(layer):
    a = layer.self_attn
    return a.q_proj, a.k_proj, a.v_proj, a.o_proj


def _mlp_linears(layer):
    m = layer.mlp
    return m.gate_proj, m.up_proj, m.down_proj


def _cat_bias(mods) -> torch.Tensor | None:
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return None
    return torch.cat([b.detach() if b is not None else m.weight.new_zeros(m.out_features) for m, b in zip(mods, biases)])


class _Proj:
    """One projection: the plain weight [out, in] (and bias), and optionally its oneDNN pre-packed copy."""

    __slots__ = ("weight", "bias", "packed")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None) -> None:
        self.weight, self.bias, self.packed = weight, bias, packed

    @classmethod
    def fused(cls, mods, pack: bool) -> _Proj:
        w = torch.cat([m.weight.detach() for m in mods]) if len(mods) > 1 else mods[0].weight.detach()
        if len(mods) == 1 and isinstance(mods[0], PackedLinear) and pack:
            return cls(w, _cat_bias(mods), mods[0].packed_weight())  # share the Hugging Face module's packed copy
        return cls(w, _cat_bias(mods), _pack(w) if pack else None)

    def __call__(self, x: torch.Tensor, plain: bool) -> torch.Tensor:
        if plain or self.packed is None:
            return F.linear(x, self.weight, self.bias)
        return _packed_linear(x, self.packed, self.bias)


class _Layer:
    __slots__ = ("ln1", "qkv", "o", "ln2", "gate_up", "down")


def _source_key(model) -> tuple:
    """Changes when any weight of ``model`` changes (in place or replaced) or its packing does."""
    packed = sum(isinstance(m, PackedLinear) for m in model.modules())
    return (*(_weight_key(p) for p in model.parameters()), packed)


class LeanLlama:
    """The lean forward of one ``LlamaForCausalLM`` (build it with :func:`lean_model`)."""

    def __init__(self, model) -> None:
        check_supported(model)
        cfg, inner = model.config, model.model
        attn = inner.layers[0].self_attn
        self.num_layers = cfg.num_hidden_layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim, self.hidden = attn.head_dim, cfg.hidden_size
        self.inter = cfg.intermediate_size
        self.eps = cfg.rms_norm_eps
        p = next(model.parameters())
        self.dtype, self.device = p.dtype, p.device
        hf_packed = [m for m in model.modules() if isinstance(m, PackedLinear)]
        pack = bool(hf_packed) and self.dtype == torch.float32 and self.device.type == "cpu" and packed_linear_available()
        self.packed = pack  # pre-packed copies exist (the Hugging Face model was pre-packed)
        self.plain_rows_max = max((m.plain_rows_max for m in hf_packed), default=0)  # its dispatch (tune_dispatch)
        self.tuned: dict | None = None  # set by dispatch.tune_lean_dispatch: then this copy keeps its own threshold
        self.embed = inner.embed_tokens.weight.detach()  # [V, H]
        self.layers = []
        for la in inner.layers:
            q, k, v, o = _attn_linears(la)
            gate, up, down = _mlp_linears(la)
            lay = _Layer()
            lay.ln1, lay.ln2 = la.input_layernorm.weight.detach(), la.post_attention_layernorm.weight.detach()
            lay.qkv, lay.o = _Proj.fused((q, k, v), pack), _Proj.fused((o,), pack)
            lay.gate_up, lay.down = _Proj.fused((gate, up), pack), _Proj.fused((down,), pack)
            self.layers.append(lay)
        self.norm = inner.norm.weight.detach()
        self.lm_head = _Proj.fused((model.lm_head,), pack)  # tied: the embedding's own tensor, no copy
        rot = inner.rotary_emb
        self._inv_freq, self._rope_scale = rot.inv_freq.detach().float(), float(rot.attention_scaling)
        self._tables(max(cfg.max_position_embeddings, 1))
        self.key = _source_key(model)

    def _tables(self, size: int) -> None:
        """cos / sin [size, head_dim] exactly as Hugging Face computes them per step (fp32, then the model dtype);
        ``sin`` has the sign of rotate_half folded in: rope(x) = x * cos + swap_halves(x) * sin."""
        freqs = torch.arange(size, device=self._inv_freq.device).float()[:, None] * self._inv_freq[None, :]  # [S, D/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [S, D]
        self.cos = (emb.cos() * self._rope_scale).to(self.device, self.dtype)
        sin = (emb.sin() * self._rope_scale).to(self.device, self.dtype)
        half = self.head_dim // 2
        self.sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)  # [S, D]

    def new_cache(self, batch: int, capacity: int, device=None) -> StaticKVCache:
        return StaticKVCache(self.num_layers, batch, self.kv_heads, self.head_dim, capacity, self.dtype,
                             device or self.device)

    def _norm(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if x.dtype in _HALF:  # as Hugging Face: normalise in fp32, scale in the model dtype
            return w * F.rms_norm(x.float(), (self.hidden,), eps=self.eps).to(x.dtype)
        return F.rms_norm(x, (self.hidden,), w, self.eps)

    def _rope(self, step: Step, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        if step.start is not None:  # every row at positions start..start+n-1
            end = step.start + n
            if end > self.cos.shape[0]:
                self._tables(2 * end)
            return self.cos[step.start:end, None], self.sin[step.start:end, None]  # [n, 1, D]
        top = int(step.positions.max()) + 1
        if top > self.cos.shape[0]:
            self._tables(2 * top)
        return self.cos[step.positions][:, :, None], self.sin[step.positions][:, :, None]  # [B, n, 1, D]

    def forward(self, ids: torch.Tensor, cache: StaticKVCache, step: Step, output_hidden: bool | tuple[int, ...] = False,
                logits_to_keep: int = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``ids [B, n]`` written into ``cache`` as ``step`` (:meth:`StaticKVCache.plan`) says; returns
        ``(logits [B, n or logits_to_keep, V], hidden)`` like ``SlotCache.forward``: ``output_hidden=True`` the last
        hidden state after the final norm [B, n, H], a tuple of indices i the residual streams entering layer i
        (Hugging Face ``hidden_states[i]``; index num_layers is the final normed state) concatenated."""
        B, n = ids.shape
        nh, nkv, D = self.heads, self.kv_heads, self.head_dim
        g = nh // nkv
        want = self._wanted(output_hidden)
        saved: dict[int, torch.Tensor] = {}
        plain = B * n <= self.plain_rows_max
        cos, sin = self._rope(step, n)
        mask = step.mask
        if mask is not None and g > 1:  # query rows are ordered (group, token): [B, 1, g * n, P]
            mask = mask[:, :, None].expand(B, 1, g, n, mask.shape[-1]).reshape(B, 1, g * n, mask.shape[-1])
        half = D // 2
        x = F.embedding(ids, self.embed)  # [B, n, H]
        for i, lay in enumerate(self.layers):
            if i in want:
                saved[i] = x
            qkv = lay.qkv(self._norm(x, lay.ln1), plain).view(B, n, nh + 2 * nkv, D)  # [B, n, nh + 2 nkv, D]
            qk = qkv[:, :, : nh + nkv]
            qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), dim=-1) * sin  # RoPE, [B, n, nh + nkv, D]
            keys, values = cache.write(i, qk[:, :, nh:], qkv[:, :, nh + nkv:], step)  # [B, nkv, P, D] each
            q = qk[:, :, :nh].view(B, n, nkv, g, D).permute(0, 2, 3, 1, 4).reshape(B, nkv, g * n, D)
            att = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)  # [B, nkv, g * n, D]
            att = att.view(B, nkv, g, n, D).permute(0, 3, 1, 2, 4).reshape(B, n, nh * D)  # [B, n, nh * D]
            x = x + lay.o(att, plain)
            gu = lay.gate_up(self._norm(x, lay.ln2), plain)  # [B, n, 2 I]
            x = x + lay.down(F.silu(gu[..., : self.inter]) * gu[..., self.inter:], plain)
        x = self._norm(x, self.norm)  # [B, n, H]
        cache.advance(step)
        if self.num_layers in want:
            saved[self.num_layers] = x
        kept = x[:, -logits_to_keep:] if logits_to_keep else x
        logits = self.lm_head(kept, kept.shape[0] * kept.shape[1] <= self.plain_rows_max)  # [B, m, V]
        if output_hidden is True:
            return logits, x
        return logits, (torch.cat([saved[i] for i in want], -1) if want else None)

    def _wanted(self, output_hidden) -> list[int]:
        if output_hidden is False or output_hidden is None or output_hidden is True:
            return []
        top = self.num_layers + 1
        if any(not -top <= i < top for i in output_hidden):
            raise ValueError(f"output_hidden layer indices must lie in -{top}..{top - 1}, got {tuple(output_hidden)}")
        return [i % top for i in output_hidden]


_LEAN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def lean_model(model) -> LeanLlama:
    """The lean forward of ``model`` (built at the first call, about a second for SmolLM2 when pre-packed; rebuilt
    when a weight was changed or replaced, or its linears were packed or unpacked since).  Raises
    :class:`UnsupportedModelError` (one sentence) for a model it cannot run.  The plain/pre-packed threshold is
    re-read from the model's ``PackedLinear`` modules at every call (``profiling.tune_dispatch`` sets it), unless
    :func:`~specdec_lesson.lean.dispatch.tune_lean_dispatch` measured the lean forward's own."""
    check_supported(model)
    lean = _LEAN.get(model)
    if lean is None or lean.key != _source_key(model):
        lean = _LEAN[model] = LeanLlama(model)
    elif lean.tuned is None:
        lean.plain_rows_max = plain_rows(model)
    return lean


@torch.inference_mode()
def lean_verify_curve(model, ns: list[int], context: int = 128, rounds: int = 1, warmup: bool = True) -> dict[int, list[float]]:
    """Seconds of ONE lean forward of ``model`` (a Llama, or a :class:`LeanLlama` timed as it is set) over n new
    tokens (batch 1, all n logits) after a ``context``-token cache, for each n in ``ns``: ``{n: [seconds per
    round]}``.  Between calls the cache is rolled back by setting its length to ``context`` again (nothing is copied)."""
    lean = model if isinstance(model, LeanLlama) else lean_model(model)
    vocab = lean.embed.shape[0]
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, context), generator=g).to(lean.device)  # [1, context]
    new = torch.randint(0, vocab, (1, max(ns)), generator=g).to(lean.device)  # [1, n_max]
    cache = lean.new_cache(1, context + max(ns))
    lean.forward(prompt, cache, cache.plan(context), logits_to_keep=1)
    sync = torch.cuda.synchronize if lean.device.type == "cuda" else (lambda: None)
    times: dict[int, list[float]] = {n: [] for n in ns}
    for r in range(rounds + int(warmup)):
        for n in ns:
            sync()
            t0 = time.perf_counter()
            lean.forward(new[:, :n], cache, cache.plan(n))
            sync()
            if r or not warmup:
                times[n].append(time.perf_counter() - t0)
            cache.set_lengths([context])
    return times


def _more_rounds(runs: dict[str, dict[int, list[float]]], repeats: int, top: int) -> bool:
    why = next((w for w in (needs_more_rounds(d) for d in runs.values()) if w), None)
    if why:
        _status(f"the lean forward's dispatch probe's {repeats} rounds {why}: taking {top - repeats} more and keeping "
                "each width's fastest ...")
    return why is not None


def tune_lean_dispatch(model, widths: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 8), context: int = 128,
                       repeats: int = 5) -> dict:
    """Like ``profiling.tune_dispatch``, on the lean forward of ``model`` (whose linears must be pre-packed, else
    there is nothing to choose): sets the lean copy's ``plain_rows_max`` to the largest n such that plain weights
    are faster at every width up to n, and keeps it (``lean_model`` stops inheriting the model's threshold).
    Returns ``{"plain_ms", "packed_ms", "plain_rows_max", "best_ms", "spread", "noisy"}`` (ms, each width's the
    fastest of the interleaved rounds: ``profiling.probe_cost``).  ``repeats`` rounds, and 3 x repeats more when
    either kind's rounds disagree or dip (``profiling.needs_more_rounds``), as ``lean.path.engine_verify_curve``."""
    lean = lean_model(model)
    if not lean.packed:
        return {"plain_ms": {}, "packed_ms": {}, "plain_rows_max": 0, "best_ms": {}, "spread": 0.0, "noisy": False}
    ns = sorted(set(widths))
    big = max(ns) + 1
    runs: dict[str, dict[int, list[float]]] = {"plain": {n: [] for n in ns}, "packed": {n: [] for n in ns}}

    def take(count: int, first: bool) -> None:
        for i in range(count):  # interleaved: a slow moment of the machine hits both kinds alike
            for kind, rows in (("plain", big), ("packed", 0)):
                lean.plain_rows_max = rows
                for n, ts in lean_verify_curve(lean, ns, context, warmup=first and i == 0).items():
                    runs[kind][n] += [t * 1e3 for t in ts]

    take(repeats, True)
    spread = relative_spread(v for d in runs.values() for v in d.values())  # of the first rounds, as tune_dispatch's
    if repeats > 0 and _more_rounds(runs, repeats, 4 * repeats):
        take(3 * repeats, False)
    cost = {kind: {n: probe_cost(v) for n, v in d.items()} for kind, d in runs.items()}
    r = 0
    for n in ns:  # the widths up to r all run faster plain
        if cost["plain"][n] >= cost["packed"][n]:
            break
        r = n
    best = {n: min(cost["plain"][n], cost["packed"][n]) if n <= r else cost["packed"][n] for n in ns}
    noisy = spread > NOISY_SPREAD
    if noisy:
        warnings.warn(f"tune_lean_dispatch: {noisy_probe_note(spread)}", stacklevel=2)
    result = {"plain_ms": cost["plain"], "packed_ms": cost["packed"], "plain_rows_max": r, "best_ms": best,
              "spread": round(spread, 4), "noisy": noisy}
    lean.plain_rows_max, lean.tuned = r, result
    return result
