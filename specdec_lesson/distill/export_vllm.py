"""The shipped EAGLE draft as a checkpoint folder vLLM's EAGLE proposer loads.

``export_vllm(target, out)`` writes ``config.json`` (a Llama config: architecture
``SpecdecEagleForCausalLM``, one decoder layer, ``draft_vocab_size`` = the subset size) and
``model.safetensors`` (float32, Hugging Face Llama names)::

    fc.weight [H, 2H], fc.bias [H]                     input order [target feature ; token embedding]
    layers.0.input_layernorm.weight                    norm_in
    layers.0.self_attn.{q,k,v}_proj.weight             qkv split by heads (q: nh*hd, k, v: nkv*hd rows)
    layers.0.self_attn.o_proj.weight                   o
    layers.0.post_attention_layernorm.weight           norm_mlp
    layers.0.mlp.{gate,up}_proj.weight, down_proj      gate_up split in halves (gate first), down
    norm.weight                                        norm_out
    lm_head.weight [N, H]                              rows d2t of the target's (tied) output embedding
    d2t [N]                                            draft id -> target id

The embedding is not exported (vLLM shares the target's, as the course's draft does).  vLLM's own
``EagleLlamaForCausalLM`` cannot hold this draft unchanged: it has no ``fc`` bias, no input norm on
its first layer, no final norm and no vocabulary subset (``vllm/model_executor/models/llama_eagle.py``),
so the folder names the architecture ``SpecdecEagleForCausalLM``, which
``specdec_lesson/bench/vllm_worker.py`` registers in vLLM (``specdec_eagle_class``: vLLM's EAGLE-1
model with those four parts).  Run it with ``speculative_config={"method": "eagle", "model": FOLDER,
"num_speculative_tokens": K}`` in a process that registered the class (the worker does).

One difference from ``EagleDrafter`` remains: ours adds the prompt's own tokens to the draft
vocabulary per call (``add_prompt_tokens``); vLLM's head is fixed, so the export drafts over the
shipped subset only (``EagleDrafter(model, add_prompt_tokens=False)`` is its exact native twin).

CLI: ``python -m specdec_lesson.distill.export_vllm [--out FOLDER]`` (default: the cache folder
``ensure_exported`` uses, ``<cache_root>/vllm-eagle-smollm2``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import torch

__all__ = ["ARCH", "EAGLE3_ARCH", "export_vllm", "export_tensors_eagle3", "ensure_exported", "default_export_dir", "main"]

ARCH = "SpecdecEagleForCausalLM"
_MANIFEST = "specdec_export.json"
_EXPORT_VERSION = 1


def _draft_files(draft_dir: str | Path | None, name: str) -> tuple[Path, Path]:
    from ..drafters.eagle import DEFAULT_DRAFT_DIR

    folder = Path(draft_dir) if draft_dir is not None else DEFAULT_DRAFT_DIR
    st, js = folder / f"{name}.safetensors", folder / f"{name}.json"
    if not st.is_file() or not js.is_file():
        raise FileNotFoundError(f"no draft weights {name}.safetensors/.json in {folder}")
    return st, js


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def default_export_dir() -> Path:
    from ..models import cache_root

    return cache_root() / "vllm-eagle-smollm2"


def _layer_tensors(sd: dict, nh: int, nkv: int, hd: int) -> dict:
    """The decoder layer and final norm of a draft state dict under HF Llama names (qkv and gate_up split)."""
    q, k, v = sd["qkv.weight"].split([nh * hd, nkv * hd, nkv * hd], 0)
    gate, up = sd["gate_up.weight"].chunk(2, 0)
    return {
        "layers.0.input_layernorm.weight": sd["norm_in"],
        "layers.0.self_attn.q_proj.weight": q, "layers.0.self_attn.k_proj.weight": k, "layers.0.self_attn.v_proj.weight": v,
        "layers.0.self_attn.o_proj.weight": sd["o.weight"], "layers.0.post_attention_layernorm.weight": sd["norm_mlp"],
        "layers.0.mlp.gate_proj.weight": gate, "layers.0.mlp.up_proj.weight": up,
        "layers.0.mlp.down_proj.weight": sd["down.weight"], "norm.weight": sd["norm_out"],
    }


def export_tensors(target, draft_dir: str | Path | None = None, name: str = "eagle_smollm2") -> tuple[dict, dict, dict]:
    """(tensors by checkpoint name, config.json dict, the draft's own JSON) of the export, in memory."""
    from safetensors.torch import load_file

    st, js = _draft_files(draft_dir, name)
    meta = json.loads(js.read_text())
    c = meta["config"]
    sd = {k: v.to(torch.float32) if v.is_floating_point() else v.long() for k, v in load_file(str(st)).items()}
    H, nh, nkv, hd, inter = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"], c["intermediate"]
    d2t = sd["d2t"]  # [N]
    out_embed = target.get_output_embeddings().weight.detach().to(torch.float32).cpu()  # [V, H]
    V = out_embed.shape[0]
    if tuple(sd["fc.weight"].shape) != (H, 2 * H) or int(d2t.max()) >= V:
        raise ValueError(f"the draft {st} does not fit this target (fc {tuple(sd['fc.weight'].shape)}, vocabulary {V})")
    tensors = {"fc.weight": sd["fc.weight"], "fc.bias": sd["fc.bias"], **_layer_tensors(sd, nh, nkv, hd),
               "lm_head.weight": out_embed[d2t], "d2t": d2t}
    tc = target.config
    config = {
        "architectures": [ARCH], "model_type": "llama", "hidden_size": H, "num_attention_heads": nh,
        "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": inter, "num_hidden_layers": 1,
        "hidden_act": "silu", "rms_norm_eps": c["eps"], "rope_theta": c["rope_theta"],
        "rope_parameters": {"rope_theta": c["rope_theta"], "rope_type": "default"},
        "max_position_embeddings": int(getattr(tc, "max_position_embeddings", 8192)), "vocab_size": V,
        "draft_vocab_size": int(d2t.numel()), "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False,
        "bos_token_id": getattr(tc, "bos_token_id", None), "eos_token_id": getattr(tc, "eos_token_id", None),
        "pad_token_id": getattr(tc, "pad_token_id", None), "dtype": "float32",
    }
    return tensors, config, meta


EAGLE3_ARCH = "LlamaForCausalLMEagle3"  # vLLM's own EAGLE-3 Llama draft (vllm/model_executor/models/llama_eagle3.py)


def export_tensors_eagle3(target, model) -> tuple[dict, dict]:
    """(tensors, config.json dict) of an ``Eagle3Draft`` in vLLM's native EAGLE-3 layout, no registration needed::

        fc.weight [H, n_aux * H]                            input order = aux_layers (low, mid, high)
        layers.0.input_layernorm.weight                     norm_in (on the token embedding)
        layers.0.hidden_norm.weight                         norm_hidden (on the fused or fed-back feature)
        layers.0.self_attn.{q,k,v}_proj.weight [*, 2H]      input order [embedding ; feature]
        layers.0.self_attn.o_proj, post_attention_layernorm, mlp.{gate,up,down}_proj, norm.weight
        lm_head.weight [N, H]                               rows d2t of the target's output embedding
        d2t [N]                                             OFFSETS: target id - draft id (vLLM adds arange(N))

    and ``eagle_config.eagle_aux_hidden_state_layer_ids`` = the draft's ``aux_layers``.  Run it with
    ``speculative_config={"method": "eagle3", "model": FOLDER, ...}``."""
    c = model.cfg
    if c.get("arch") != "eagle3":
        raise ValueError(f"export_tensors_eagle3 takes an eagle3 draft, got arch {c.get('arch', 'eagle')!r}")
    sd = {k: v.detach().to(torch.float32).cpu() if v.is_floating_point() else v.cpu() for k, v in model.state_dict().items()}
    H, nh, nkv, hd = c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]
    d2t = sd["d2t"].long()  # [N] draft id -> target id
    out_embed = target.get_output_embeddings().weight.detach().to(torch.float32).cpu()  # [V, H]
    tensors = {"fc.weight": sd["fc.weight"], "layers.0.hidden_norm.weight": sd["norm_hidden"],
               **_layer_tensors(sd, nh, nkv, hd), "lm_head.weight": out_embed[d2t], "d2t": d2t - torch.arange(len(d2t))}
    tc = target.config
    config = {
        "architectures": [EAGLE3_ARCH], "model_type": "llama", "hidden_size": H, "target_hidden_size": H,
        "num_attention_heads": nh, "num_key_value_heads": nkv, "head_dim": hd, "intermediate_size": c["intermediate"],
        "num_hidden_layers": 1, "hidden_act": "silu", "rms_norm_eps": c["eps"], "rope_theta": c["rope_theta"],
        "rope_parameters": {"rope_theta": c["rope_theta"], "rope_type": "default"},
        "max_position_embeddings": int(getattr(tc, "max_position_embeddings", 8192)),
        "vocab_size": out_embed.shape[0], "draft_vocab_size": len(d2t), "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(c["aux_layers"]), "use_aux_hidden_state": True},
        "bos_token_id": getattr(tc, "bos_token_id", None), "eos_token_id": getattr(tc, "eos_token_id", None),
        "dtype": "float32",
    }
    return tensors, config


def export_vllm(target, out: str | Path, *, draft_dir: str | Path | None = None, name: str = "eagle_smollm2") -> Path:
    """Write the vLLM checkpoint folder ``out`` for the draft ``name`` of ``target`` (written to a
    temporary folder and renamed when complete).  Returns ``out``."""
    from safetensors.torch import save_file

    st, _ = _draft_files(draft_dir, name)
    tensors, config, meta = export_tensors(target, draft_dir, name)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}-{time.time_ns()}"
    try:
        tmp.mkdir()
        save_file({n: t.contiguous() for n, t in tensors.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=1))
        manifest = {"version": _EXPORT_VERSION, "source": str(st), "source_sha256": _sha256(st),
                    "config": meta["config"], "training": meta.get("training")}
        (tmp / _MANIFEST).write_text(json.dumps(manifest, indent=1))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def ensure_exported(target, out: str | Path | None = None, *, draft_dir: str | Path | None = None,
                    name: str = "eagle_smollm2") -> Path:
    """The export folder, (re)written when missing, from another export version or from other draft weights."""
    out = Path(out) if out is not None else default_export_dir()
    st, _ = _draft_files(draft_dir, name)
    try:
        m = json.loads((out / _MANIFEST).read_text())
        if (m.get("version") == _EXPORT_VERSION and m.get("source_sha256") == _sha256(st)
                and (out / "model.safetensors").is_file() and (out / "config.json").is_file()):
            return out
    except (OSError, json.JSONDecodeError):
        pass
    return export_vllm(target, out, draft_dir=draft_dir, name=name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specdec_lesson.distill.export_vllm", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="checkpoint folder (default: the cache folder the bench uses)")
    a = ap.parse_args(argv)
    from ..models import load_default_target

    target, _ = load_default_target(verbose=False)
    path = export_vllm(target, a.out or default_export_dir())
    print(f"vLLM EAGLE checkpoint written to {path} (architecture {ARCH}; vllm_worker.py registers it in vLLM)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
