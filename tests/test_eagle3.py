"""The EAGLE-3-style draft: the engine hands it the fused layers, training's unrolled steps are what inference
computes, greedy output stays the target's, and its weights round-trip through save / load."""

from __future__ import annotations

import pytest
import torch

from specdec_lesson.drafters.base import hidden_request
from specdec_lesson.drafters.eagle import EagleConfig, EagleDraft, EagleDrafter, _target_tables, load_draft, save_draft
from specdec_lesson.drafters.eagle3 import Eagle3Draft, default_aux_layers, eagle3_config
from specdec_lesson.models import tiny_llama
from specdec_lesson.speculative import autoregressive_generate, speculative_generate


def _target(seed: int):
    return tiny_llama(vocab_size=96, hidden_size=32, num_layers=4, seed=seed, dtype=torch.float32, eos_token_id=2)


def _draft(target, arch: str, seed: int = 0):
    torch.manual_seed(seed)
    d2t = torch.arange(0, 96, 2)
    if arch == "eagle3":
        cfg = eagle3_config(target, len(d2t), (1, 2, 3))
    else:
        cfg = EagleConfig.from_target(target, len(d2t))
    model = (Eagle3Draft if arch == "eagle3" else EagleDraft)(cfg, *_target_tables(target), d2t=d2t)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))  # away from the structured init, so every weight matters
    return model.eval()


def _features(target, ids: torch.Tensor, layers) -> torch.Tensor:
    out = target.model(input_ids=ids, output_hidden_states=True)
    if layers is None:
        return out.hidden_states[-1]
    return torch.cat([out.hidden_states[i] for i in layers], -1)


def test_default_layers_are_eagle3s():
    assert default_aux_layers(30) == (2, 15, 27)  # SmolLM2-135M: 30 layers
    assert all(1 <= i <= 2 for i in default_aux_layers(2))
    with pytest.raises(ValueError, match="aux_layers"):
        eagle3_config(_target(0), 8, (0, 9))


@pytest.mark.parametrize("arch", ["eagle", "eagle3"])
def test_unrolled_training_steps_are_what_inference_computes(arch):
    """Step 0 of ``forward_train`` over a sequence equals the drafter's prefill of it, and step 1 at the last position
    (fed its own predicted feature) equals the drafter's next draft step from that prefill."""
    target = _target(1)
    model = _draft(target, arch, seed=1)
    layers = model.target_hidden_layers
    g = torch.Generator().manual_seed(0)
    T = 9
    ids = torch.randint(3, 96, (1, T + 1), generator=g)  # x_0 .. x_T
    with torch.no_grad():
        feats = _features(target, ids, layers)  # [1, T+1, W]
        train = model.forward_train(feats[:, :T], ids[:, 1:], 2)  # steps 0 and 1, [1, T, H] each
    d = EagleDrafter(model, add_prompt_tokens=False)
    d.begin(ids[:, :T], torch.ones(1, T, dtype=torch.bool), feats[:, : T - 1])  # feeds (f_0..f_{T-2}, x_1..x_{T-1})
    assert torch.allclose(d.g_last, train[0][:, T - 2], atol=1e-5)
    with torch.inference_mode():
        nxt = d._step(d.g_last[:, None], ids[:, T:], torch.ones(1, 1, dtype=torch.bool))  # (own feature, x_T) at T-1
    assert torch.allclose(nxt[:, 0], train[1][:, T - 1], atol=1e-5)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_eagle3_greedy_speculative_equals_target(k):
    target = _target(2)
    drafter = EagleDrafter(_draft(target, "eagle3", seed=2))
    assert hidden_request(drafter) == (1, 2, 3)  # the engine asks the target for these residual streams
    prompts = [[5, 9, 11, 40, 7], [3, 4], [60, 61, 62, 63, 64, 65, 66, 67]]
    ref, _ = autoregressive_generate(target, prompts, 24)
    out, stats = speculative_generate(target, drafter, prompts, 24, k=k)
    assert all(torch.equal(a, b) for a, b in zip(ref, out))
    assert stats.target_forwards > 0


def test_eagle3_save_load_round_trip(tmp_path):
    target = _target(3)
    model = _draft(target, "eagle3", seed=3)
    save_draft(model, tmp_path, "d3")
    back = load_draft(target, tmp_path, "d3")
    assert isinstance(back, Eagle3Draft) and back.target_hidden_layers == (1, 2, 3)
    for name, v in model.state_dict().items():
        assert torch.allclose(v.float(), back.state_dict()[name].float(), atol=2e-3 * (1 + float(v.abs().max()))), name


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _vllm_eagle3_step(t: dict, cfg: dict, aux: torch.Tensor, tokens: torch.Tensor, embed: torch.Tensor) -> torch.Tensor:
    """vLLM's EAGLE-3 Llama draft (llama_eagle3.py, norm after residual), written out from the exported tensors only:
    aux [T, n_aux*H], tokens [T] -> full-vocabulary logits [T, V] (-inf off the draft vocabulary)."""
    eps, nh, nkv, hd = cfg["rms_norm_eps"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    T = len(tokens)
    residual = aux @ t["fc.weight"].T  # combine_hidden_states
    x = torch.cat([_rms(embed[tokens], t["layers.0.input_layernorm.weight"], eps),
                   _rms(residual, t["layers.0.hidden_norm.weight"], eps)], -1)  # [T, 2H]
    q = (x @ t["layers.0.self_attn.q_proj.weight"].T).view(T, nh, hd).transpose(0, 1)
    k = (x @ t["layers.0.self_attn.k_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    v = (x @ t["layers.0.self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
    inv = 1.0 / cfg["rope_theta"] ** (torch.arange(0, hd, 2).float() / hd)
    ang = torch.arange(T).float()[:, None] * inv
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    rot = lambda z: z * cos + torch.cat([-z[..., hd // 2:], z[..., : hd // 2]], -1) * sin
    q, k = rot(q), rot(k).repeat_interleave(nh // nkv, 0)
    att = torch.softmax((q @ k.transpose(-1, -2)) / hd**0.5 + torch.full((T, T), float("-inf")).triu(1), -1)
    o = (att @ v.repeat_interleave(nh // nkv, 0)).transpose(0, 1).reshape(T, -1) @ t["layers.0.self_attn.o_proj.weight"].T
    residual = o + residual
    h = _rms(residual, t["layers.0.post_attention_layernorm.weight"], eps)
    mlp = (torch.nn.functional.silu(h @ t["layers.0.mlp.gate_proj.weight"].T) * (h @ t["layers.0.mlp.up_proj.weight"].T))
    out = _rms(mlp @ t["layers.0.mlp.down_proj.weight"].T + residual, t["norm.weight"], eps)
    sub = out @ t["lm_head.weight"].T  # [T, N]
    full = sub.new_full((T, cfg["vocab_size"]), float("-inf"))
    full[:, torch.arange(cfg["draft_vocab_size"]) + t["d2t"]] = sub  # vLLM's compute_logits
    return full


def test_eagle3_export_is_vllms_eagle3_layout():
    """The exported tensors, run through vLLM's EAGLE-3 forward written out by hand, give the draft's own logits."""
    from specdec_lesson.distill.export_vllm import EAGLE3_ARCH, export_tensors_eagle3

    target = _target(4)
    model = _draft(target, "eagle3", seed=4)
    tensors, config = export_tensors_eagle3(target, model)
    assert config["architectures"] == [EAGLE3_ARCH] and config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]
    ids = torch.randint(3, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        aux = _features(target, ids, (1, 2, 3))[0]  # [T, 3H]
        ours_sub = model.logits(model.forward_train(aux[None], ids, 1)[0])[0]  # [T, N]
        ours = ours_sub.new_full((12, 96), float("-inf")).index_copy_(1, model.d2t, ours_sub)
        theirs = _vllm_eagle3_step(tensors, config, aux, ids[0], target.get_input_embeddings().weight)
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    assert torch.allclose(ours[~torch.isinf(ours)], theirs[~torch.isinf(theirs)], atol=1e-4)
    with pytest.raises(ValueError, match="eagle3 draft"):
        export_tensors_eagle3(target, _draft(target, "eagle"))
