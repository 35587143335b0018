"""The vLLM side of ``--engine vllm``: one ``vllm.LLM`` in the vLLM venv, driven by JSON lines.

Run by file path with the vLLM venv's interpreter (never imported by the course's own venv, and it
imports nothing of ``specdec_lesson``: only vllm, the standard library and json)::

    .venv-vllm/bin/python specdec_lesson/bench/vllm_worker.py

Protocol: one JSON object per line on stdin, one JSON reply per line on stdout; everything else
(vLLM's logs, its children's output) goes to stderr.  On start the worker sends
``{"event": "ready", "vllm": VERSION, ...}`` once ``import vllm`` succeeded.  Requests:

* ``{"op": "load", "model": PATH, "speculative_config": {...} or null, "dtype": "float32", ...}``
  builds the engine (keys: ``max_model_len``, ``seed``, ``enforce_eager``, ``extra``: more ``LLM``
  keyword arguments; ``register_specdec_eagle``: make ``SpecdecEagleForCausalLM`` known first);
* ``{"op": "generate", "prompt_token_ids": [...], "max_tokens": N, "temperature": 0.0, "top_k",
  "top_p", "seed", "stop_token_ids"}`` -> ``{"token_ids": [...], "wall_s": s, "spec": counters}``:
  ``wall_s`` is the time of the ``LLM.generate`` call alone (no JSON transport), ``spec`` the change
  of vLLM's speculative-decoding counters over the call (drafts, draft tokens, accepted tokens,
  accepted per position), or null without speculation;
* ``{"op": "close"}`` (or the end of stdin) shuts the engine down and exits.

Every reply has ``"ok": true`` or ``"ok": false, "error": "one line"``.  ``__main__`` is guarded:
vLLM spawns its engine-core process, which re-imports this file.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

_SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


def _one_line(exc: BaseException) -> str:
    msg = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {msg}" if msg else type(exc).__name__


def _spec_snapshot(llm) -> dict | None:
    try:
        metrics = llm.get_metrics()
    except Exception:  # stats disabled or an older vLLM
        return None
    snap: dict = {}
    for m in metrics:
        if m.name in _SPEC_COUNTERS:
            snap[_SPEC_COUNTERS[m.name]] = snap.get(_SPEC_COUNTERS[m.name], 0) + int(m.value)
        elif m.name == _PER_POS:
            vals = [int(v) for v in m.values]
            old = snap.get("accepted_per_pos", [])
            snap["accepted_per_pos"] = [a + b for a, b in zip(vals, old + [0] * len(vals))] if old else vals
    return snap or None


def _diff(after: dict | None, before: dict | None) -> dict | None:
    if not after:
        return None
    before = before or {}
    out = {k: v - before.get(k, 0) for k, v in after.items() if k != "accepted_per_pos"}
    pos, old = after.get("accepted_per_pos", []), before.get("accepted_per_pos", [])
    out["accepted_per_pos"] = [a - (old[i] if i < len(old) else 0) for i, a in enumerate(pos)]
    return out


ARCH = "SpecdecEagleForCausalLM"  # the exported config's architecture; method "eagle" makes it "Eagle" + ARCH


def specdec_eagle_class():
    """The course's EAGLE draft (``specdec_lesson/drafters/eagle.py``) as a vLLM EAGLE draft model.

    vLLM's own ``EagleLlamaForCausalLM`` (``llama_eagle.py``) differs from it in four places: its
    ``fc`` has no bias, its first layer's ``input_layernorm`` is an identity, it has no final norm
    (it returns ``hidden + residual``) and it scores the full vocabulary with the target's head.  This
    class is that model with the course's choices: ``x = fc([f; e(token)]) + b``, one standard Llama
    decoder layer (input norm, attention, post-attention norm, MLP), the final norm ``g = norm(x)``
    fed back as the next step's feature, and logits ``g @ E[d2t].T`` over the draft vocabulary,
    scattered into the full vocabulary with -inf elsewhere (as ``Eagle3LlamaForCausalLM`` does)."""
    import torch
    from torch import nn
    from vllm.compilation.decorators import support_torch_compile
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import ReplicatedLinear
    from vllm.model_executor.layers.logits_processor import LogitsProcessor
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    from vllm.model_executor.models.llama import LlamaDecoderLayer
    from vllm.model_executor.models.llama_eagle import EagleLlamaForCausalLM
    from vllm.model_executor.models.llama_eagle import LlamaModel as EagleLlamaModel
    from vllm.model_executor.models.utils import AutoWeightsLoader, maybe_prefix, process_eagle_weight

    # as vLLM's own EAGLE models: compiled when compilation is on (a GPU without enforce_eager), a no-op otherwise
    @support_torch_compile(dynamic_arg_dims={"input_ids": 0, "positions": -1, "hidden_states": 0, "inputs_embeds": 0})
    class SpecdecEagleModel(nn.Module):
        def __init__(self, *, vllm_config, prefix: str = "", start_layer_id: int = 0) -> None:
            super().__init__()
            cfg = vllm_config.speculative_config.draft_model_config.hf_config
            self.config = cfg
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size,
                                                       prefix=maybe_prefix(prefix, "embed_tokens"))
            self.fc = ReplicatedLinear(2 * cfg.hidden_size, cfg.hidden_size, bias=True,
                                       params_dtype=vllm_config.model_config.dtype, prefix=maybe_prefix(prefix, "fc"),
                                       return_bias=False)
            self.layers = nn.ModuleList([
                LlamaDecoderLayer(vllm_config, prefix=maybe_prefix(prefix, f"layers.{i + start_layer_id}"), config=cfg)
                for i in range(cfg.num_hidden_layers)])
            self.norm = RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

        def embed_input_ids(self, input_ids):
            return self.embed_tokens(input_ids)

        def forward(self, input_ids, positions, hidden_states, inputs_embeds=None):
            emb = self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
            x = self.fc(torch.cat((hidden_states, emb), dim=-1))  # the course's order: [feature ; embedding]
            residual = None
            for layer in self.layers:
                x, residual = layer(positions, x, residual)
            g, _ = self.norm(x, residual)
            return g, g  # logits from g, and g is the next step's input feature

        def load_weights(self, weights):
            return AutoWeightsLoader(self).load_weights(weights, mapper=EagleLlamaModel.hf_to_vllm_mapper)

    class EagleSpecdecEagleForCausalLM(EagleLlamaForCausalLM):
        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            nn.Module.__init__(self)
            cfg = vllm_config.speculative_config.draft_model_config.hf_config
            self.config = cfg
            n_sub = int(getattr(cfg, "draft_vocab_size", None) or cfg.vocab_size)
            self.config.draft_vocab_size = n_sub
            start = vllm_config.model_config.get_num_layers(vllm_config.parallel_config)
            self.model = SpecdecEagleModel(vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"), start_layer_id=start)
            self.lm_head = ParallelLMHead(n_sub, cfg.hidden_size, prefix=maybe_prefix(prefix, "lm_head"))
            self.logits_processor = LogitsProcessor(n_sub, scale=1.0)
            self.d2t = nn.Parameter(torch.arange(n_sub, dtype=torch.long), requires_grad=False)  # draft id -> target id
            self.has_own_lm_head = False
            self.has_own_embed_tokens = False

        def compute_logits(self, hidden_states):
            sub = self.logits_processor(self.lm_head, hidden_states)  # [T, N]
            if sub is None:
                return None
            full = sub.new_full((sub.shape[0], self.config.vocab_size), float("-inf"))
            full[:, self.d2t] = sub
            return full  # [T, V]

        def load_weights(self, weights):
            rest = []
            for name, w in weights:
                if name == "d2t":
                    self.d2t.data.copy_(w.to(torch.long))
                    continue
                if not name.startswith("lm_head"):
                    name = "model." + name
                process_eagle_weight(self, name)
                rest.append((name, w))
            loaded = AutoWeightsLoader(self).load_weights(rest)
            return set(loaded) | {"d2t"}

    return EagleSpecdecEagleForCausalLM


def register_specdec_eagle() -> None:
    """Make ``SpecdecEagleForCausalLM`` (and the ``Eagle`` name vLLM's EAGLE config gives it) known to
    vLLM's model registry, in this process; the worker also does it in vLLM's spawned processes."""
    from vllm import ModelRegistry

    cls = specdec_eagle_class()
    for name in (ARCH, "Eagle" + ARCH):
        if name not in ModelRegistry.get_supported_archs():
            ModelRegistry.register_model(name, cls)


if __name__ == "__mp_main__" and os.environ.get("SPECDEC_VLLM_EAGLE") == "1":
    register_specdec_eagle()  # vLLM's engine-core and model-worker processes are spawned and re-import this file


class Worker:
    def __init__(self, send) -> None:
        self.send = send
        self.llm = None
        self.vllm = None
        self.spec = False

    def load(self, req: dict) -> dict:
        import vllm

        if self.llm is not None:
            raise RuntimeError("this worker already holds an engine (one LLM per worker)")
        if req.get("register_specdec_eagle"):
            os.environ["SPECDEC_VLLM_EAGLE"] = "1"  # inherited by vLLM's spawned processes
            register_specdec_eagle()
        kw = dict(model=req["model"], dtype=req.get("dtype", "auto"), max_model_len=int(req.get("max_model_len", 2048)),
                  seed=int(req.get("seed", 0)), enforce_eager=bool(req.get("enforce_eager", True)),
                  disable_log_stats=False)
        spec = req.get("speculative_config")
        if spec:
            kw["speculative_config"] = spec
        kw.update(req.get("extra") or {})
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**kw)
        self.vllm = vllm
        self.spec = bool(spec)
        return {"load_s": time.perf_counter() - t0}

    def generate(self, req: dict) -> dict:
        if self.llm is None:
            raise RuntimeError("no engine loaded (send a load request first)")
        kw = dict(max_tokens=int(req["max_tokens"]), temperature=float(req.get("temperature", 0.0)), detokenize=False)
        if req.get("seed") is not None:
            kw["seed"] = int(req["seed"])
        if req.get("top_k") is not None:
            kw["top_k"] = int(req["top_k"])
        if req.get("top_p") is not None:
            kw["top_p"] = float(req["top_p"])
        if req.get("stop_token_ids"):
            kw["stop_token_ids"] = [int(t) for t in req["stop_token_ids"]]
        params = self.vllm.SamplingParams(**kw)
        prompt = {"prompt_token_ids": [int(t) for t in req["prompt_token_ids"]]}
        before = _spec_snapshot(self.llm) if self.spec else None
        t0 = time.perf_counter()
        out = self.llm.generate([prompt], params, use_tqdm=False)
        wall = time.perf_counter() - t0
        comp = out[0].outputs[0]
        spec = _diff(_spec_snapshot(self.llm), before) if self.spec else None
        return {"token_ids": list(comp.token_ids), "finish_reason": comp.finish_reason, "wall_s": wall, "spec": spec}

    def close(self) -> None:
        llm, self.llm = self.llm, None
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    # the script's folder holds the course's bench modules (tasks.py, metrics.py, ...): keep them
    # from shadowing anything vLLM imports; the one module we need here is added back explicitly
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    proto = os.fdopen(os.dup(1), "w", buffering=1)  # the protocol channel: the original stdout
    os.dup2(2, 1)  # fd 1 (vLLM's logs, children's prints) -> stderr
    sys.stdout = sys.stderr

    def send(obj: dict) -> None:
        proto.write(json.dumps(obj) + "\n")
        proto.flush()

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    try:
        import vllm
    except BaseException as exc:  # ImportError, or an extension failing to load (e.g. an instruction set)
        send({"event": "ready", "ok": False, "error": f"import vllm failed: {_one_line(exc)}"})
        return 1
    send({"event": "ready", "ok": True, "vllm": vllm.__version__, "python": sys.version.split()[0], "pid": os.getpid()})
    worker = Worker(send)
    try:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                req = json.loads(line)
                op = req.get("op")
                if op == "close":
                    worker.close()
                    send({"ok": True})
                    break
                if op == "load":
                    reply = worker.load(req)
                elif op == "generate":
                    reply = worker.generate(req)
                elif op == "ping":
                    reply = {}
                else:
                    raise ValueError(f"unknown op {op!r}")
                send({"ok": True, **reply})
            except Exception as exc:
                traceback.print_exc(file=sys.stderr)
                send({"ok": False, "error": _one_line(exc)})
    finally:
        worker.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
