#!/usr/bin/env python3
"""Builds tiny random-weight DeepSeek-V2/V3 models (MLA attention, dense and MoE FFN) and their HF reference logits.

Four fixtures, all GGUF architecture deepseek2:
  deepseek2_tiny      DeepseekV2ForCausalLM, 2 dense layers, q through the low-rank path (q_lora_rank 24:
                      attn_q_a -> attn_q_a_norm -> attn_q_b), as DeepSeek-V2;
  deepseek2lite_tiny  DeepseekV2ForCausalLM, 2 dense layers, q projected directly (q_lora_rank None: attn_q), as
                      DeepSeek-V2-Lite;
  deepseek2moe_tiny   DeepseekV2ForCausalLM, 3 layers: 1 dense (first_k_dense_replace 1), then DeepSeekMoE layers:
                      8 routed experts of 16 in 4 groups, 2 groups kept (topk_method "group_limited_greedy": a group
                      scores its best softmax probability), 3 used per token, no renormalization (norm_topk_prob
                      False, the only value HF's DeepseekV2TopkRouter implements and DeepSeek-V2's), weights scaled by
                      routed_scaling_factor 2.5, 2 shared experts (one SwiGLU of 2 x 16); direct q;
  deepseek3_tiny      DeepseekV3ForCausalLM (the converter writes it as deepseek2 too), 3 layers, 1 dense, then MoE
                      layers with sigmoid scores, a random e_score_correction_bias (exp_probs_b: steers the choice
                      only), 8 experts in 4 groups scored by their best two (noaux_tc), 2 kept, 3 used,
                      norm_topk_prob True, routed_scaling_factor 2.5, 1 shared expert; low-rank q.
For each MoE fixture the generator checks that routing is not degenerate over the reference tokens: consecutive
tokens pick different experts, the group limit changes the choice for some (token, layer) pairs, the other
group-scoring rule (top-2 sum for V2, best expert for V3) would change it too, and for V3 the bias changes it.
MLA geometry: 4 heads, kv_lora_rank 16, qk_nope_head_dim 8, qk_rope_head_dim 8, v_head_dim 12 (v differs from the
nope width so a loader that confuses the k and v halves of kv_b fails), rope_theta 10000, no RoPE scaling.
rms_norm_eps is 1e-6 because HF builds q_a_layernorm and kv_a_layernorm with their default eps (1e-6) whatever the
config says, while llama.cpp uses attention.layer_norm_rms_epsilon for every norm: at 1e-6 both agree.

Each GGUF is written as llama.cpp's converter writes deepseek2 (conversion/deepseek.py DeepseekV2Model, read, not
copied; the vendored gguf-py is used so the MLA key names are llama.cpp's own):
  keys      TextModel's (context/embedding length, block count, feed_forward_length, head_count,
            head_count_kv = 1: MLA is stored as MQA over the latent, rope.freq_base, layer_norm_rms_epsilon)
            plus leading_dense_block_count, vocab_size, attention.q_lora_rank (only when set), attention.kv_lora_rank,
            attention.key_length = kv_lora_rank + qk_rope_head_dim, attention.value_length = kv_lora_rank,
            attention.key_length_mla = qk_nope + qk_rope, attention.value_length_mla = v_head_dim,
            expert_feed_forward_length, expert_shared_count, rope.dimension_count = qk_rope_head_dim; with
            MoE layers also (TextModel's) expert_count, expert_used_count, expert_group_count,
            expert_group_used_count, expert_gating_func (written from config.json's scoring_func, which the real
            DeepSeek-V2 ("softmax") and V3 ("sigmoid") configs carry; transformers' config classes drop it, so it
            is written here from the HF class), and DeepseekV2Model's expert_weights_scale and
            expert_weights_norm (only when true);
  tensors   HF names through gguf's DEEPSEEK2 name map; experts.gate_up_proj [E, 2F, H] split into
            ffn_gate_exps / ffn_up_exps (gate first), experts.down_proj as ffn_down_exps, mlp.gate as
            ffn_gate_inp, shared_experts.* as ffn_*_shexp, e_score_correction_bias as exp_probs_b.bias; kv_b_proj
            split per head into attn_k_b
            ([heads, kv_lora_rank, qk_nope], the k half transposed) and attn_v_b ([heads, v_head_dim, kv_lora_rank]),
            3-D; nothing permuted: HF rotates adjacent pairs (view_as_complex), llama.cpp's deepseek2 uses NORM RoPE.
Weights are float32; no tokenizer. Reference logits and JSON layout are those of tools/make_llama_fixture.py.

YaRN fixtures (YARN_SPECS; models/deepseek2.cc, models/rope_scaling.h), rope_type "yarn", factor 4,
original_max_position_embeddings 32 (MAX_POS = 4 x 32), a 28-token prompt plus 12 decode steps past it:
  deepseek2yarn      as DeepSeek-V2's own rope_scaling states it: beta_fast 32, beta_slow 1, mscale = mscale_all_dim =
                     0.707 (HF: cos/sin x mscale(4, 0.707) / mscale(4, 0.707) = 1, softmax scale x mscale(4, 0.707)^2);
                     q through the low-rank path;
  deepseek2liteyarn  factor and original context only (HF: cos/sin x 0.1 ln 4 + 1, softmax scale unchanged); q direct.
Their keys are what TextModel.set_gguf_parameters writes for "yarn" (rope.scaling.type, factor,
original_context_length, yarn_beta_fast / yarn_beta_slow / yarn_attn_factor / yarn_ext_factor when the config states
beta_fast / beta_slow / attention_factor / extrapolation_factor) plus DeepseekV2Model's
rope.scaling.yarn_log_multiplier = 0.1 x mscale_all_dim when stated; mscale itself is not written.

Usage: python3 tools/make_deepseek2_fixtures.py [--out-dir tests/data] [--only deepseek2yarn,...]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_llama_fixture import f32_list, run_reference  # noqa: E402

LLAMA_CPP = Path.home() / ".cache/decoded/llama-cpp-python/src-0.3.36/vendor/llama.cpp"
sys.path.insert(0, str(LLAMA_CPP / "gguf-py"))

try:
    import gguf
    import torch
    import transformers
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM
except ImportError as exc:
    sys.exit(f"make_deepseek2_fixtures: missing dependency ({exc}); pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent

VOCAB = 96
HIDDEN = 32
INTERMEDIATE = 64
MAX_POS = 128
BOS_ID = 1
N_HEADS = 4
KV_LORA = 16
QK_NOPE = 8
QK_ROPE = 8
V_HEAD = 12
RMS_EPS = 1e-6
ROPE_THETA = 10_000.0


@dataclass(frozen=True)
class MoeSpec:
    v3: bool              # DeepseekV3ForCausalLM (sigmoid, bias, top-2-sum groups) instead of V2 (softmax, max)
    dense_layers: int = 1
    n_experts: int = 8
    experts_used: int = 3
    n_group: int = 4
    topk_group: int = 2
    n_shared: int = 2
    expert_ffn: int = 16
    scaling: float = 2.5
    norm_topk_prob: bool = False


@dataclass(frozen=True)
class FixtureSpec:
    name: str
    seed: int
    q_lora_rank: int | None
    n_layers: int = 2
    prompt_len: int = 7
    decode_steps: int = 10
    moe: MoeSpec | None = None


SPECS = [
    FixtureSpec(name="deepseek2", seed=23, q_lora_rank=24),
    FixtureSpec(name="deepseek2lite", seed=29, q_lora_rank=None),
    FixtureSpec(name="deepseek2moe", seed=31, q_lora_rank=None, n_layers=3, moe=MoeSpec(v3=False)),
    FixtureSpec(name="deepseek3", seed=37, q_lora_rank=24, n_layers=3,
                moe=MoeSpec(v3=True, n_shared=1, norm_topk_prob=True)),
]


@dataclass(frozen=True)
class YarnFixtureSpec(FixtureSpec):
    rope_parameters: dict = field(default_factory=dict)


YARN_SPECS = [
    YarnFixtureSpec(name="deepseek2yarn", seed=41, q_lora_rank=24, prompt_len=28, decode_steps=12,
                    rope_parameters={"rope_type": "yarn", "rope_theta": ROPE_THETA, "factor": 4.0,
                                     "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                                     "mscale": 0.707, "mscale_all_dim": 0.707}),
    YarnFixtureSpec(name="deepseek2liteyarn", seed=43, q_lora_rank=None, prompt_len=28, decode_steps=12,
                    rope_parameters={"rope_type": "yarn", "rope_theta": ROPE_THETA, "factor": 4.0,
                                     "original_max_position_embeddings": 32}),
]


def write_rope_scaling(w, spec: FixtureSpec) -> None:
    """The rope scaling keys llama.cpp's converter writes for a YaRN config: TextModel's, then DeepseekV2Model's."""
    rp = getattr(spec, "rope_parameters", {})
    if rp.get("rope_type") != "yarn":
        return
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(rp["factor"])
    w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
    if (ext := rp.get("extrapolation_factor")) is not None:
        w.add_rope_scaling_yarn_ext_factor(ext)
    if (attn := rp.get("attention_factor", rp.get("attn_factor"))) is not None:
        w.add_rope_scaling_yarn_attn_factor(attn)
    if (beta_fast := rp.get("beta_fast")) is not None:
        w.add_rope_scaling_yarn_beta_fast(beta_fast)
    if (beta_slow := rp.get("beta_slow")) is not None:
        w.add_rope_scaling_yarn_beta_slow(beta_slow)
    if (mscale_all_dim := rp.get("mscale_all_dim")) is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * mscale_all_dim)


def build_model(spec: FixtureSpec):
    common = dict(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
        num_hidden_layers=spec.n_layers, num_attention_heads=N_HEADS, num_key_value_heads=N_HEADS,
        q_lora_rank=spec.q_lora_rank, kv_lora_rank=KV_LORA, qk_nope_head_dim=QK_NOPE, qk_rope_head_dim=QK_ROPE,
        v_head_dim=V_HEAD, max_position_embeddings=MAX_POS, rms_norm_eps=RMS_EPS, hidden_act="silu",
        tie_word_embeddings=False, attention_bias=False, bos_token_id=BOS_ID, eos_token_id=2,
        rope_parameters=dict(getattr(spec, "rope_parameters", None)
                             or {"rope_type": "default", "rope_theta": ROPE_THETA}))
    m = spec.moe
    if m is None:
        cfg = DeepseekV2Config(**common, moe_intermediate_size=INTERMEDIATE, first_k_dense_replace=spec.n_layers,
                               n_routed_experts=4, n_shared_experts=1)
        cls = DeepseekV2ForCausalLM
    else:
        moe = dict(moe_intermediate_size=m.expert_ffn, first_k_dense_replace=m.dense_layers,
                   n_routed_experts=m.n_experts, num_experts_per_tok=m.experts_used, n_shared_experts=m.n_shared,
                   n_group=m.n_group, topk_group=m.topk_group, routed_scaling_factor=m.scaling,
                   norm_topk_prob=m.norm_topk_prob)
        if m.v3:
            cfg = DeepseekV3Config(**common, **moe, rope_interleave=True)
            cls = DeepseekV3ForCausalLM
        else:
            cfg = DeepseekV2Config(**common, **moe, topk_method="group_limited_greedy")
            cls = DeepseekV2ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    model = cls(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 2.0, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim in (2, 3):  # 3-D: experts [n_expert, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
        for name, b in sorted(model.named_buffers()):
            if name.endswith("e_score_correction_bias"):
                # Of the order of the sigmoid scores' spread, so it changes some choices.
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)
    return model


def routing_report(spec: FixtureSpec, model, ids: list[int]) -> dict:
    """HF's choices per MoE layer and position, and how the routing rules change them, over one forward of ids."""
    m = spec.moe
    captured = []
    hooks = []
    for il, layer in enumerate(model.model.layers):
        if il < m.dense_layers:
            continue
        hooks.append(layer.mlp.gate.register_forward_hook(
            lambda mod, _inp, out: captured.append((mod, out[0].detach(), out[2].detach()))))
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    per = m.n_experts // m.n_group

    def select(choice: torch.Tensor, group_rule: str | None) -> list[set]:
        if group_rule is not None:
            grouped = choice.view(-1, m.n_group, per)
            gs = grouped.max(-1).values if group_rule == "max" else grouped.topk(2, -1)[0].sum(-1)
            keep = torch.zeros_like(gs).scatter_(1, gs.topk(m.topk_group, -1)[1], 1).bool()
            choice = choice.masked_fill(~keep.repeat_interleave(per, 1), float("-inf"))
        return [set(r) for r in choice.topk(m.experts_used, -1)[1].tolist()]

    rule, other = ("top2sum", "max") if m.v3 else ("max", "top2sum")
    report = {"router_indices": [], "tokens": 0, "group_limit_changes": 0, "other_group_rule_changes": 0,
              "bias_changes": 0, "consecutive_changes": 0}
    for mod, logits, picked in captured:
        probs = logits.sigmoid() if m.v3 else logits.softmax(-1)
        choice = probs + mod.e_score_correction_bias if m.v3 else probs
        hf = [set(r) for r in picked.tolist()]
        ours = select(choice, rule)
        if ours != hf:
            raise RuntimeError(f"[{spec.name}] the generator's reading of HF's router disagrees with HF")
        report["router_indices"].append([sorted(r) for r in hf])
        report["tokens"] += len(hf)
        report["group_limit_changes"] += sum(a != b for a, b in zip(hf, select(choice, None)))
        report["other_group_rule_changes"] += sum(a != b for a, b in zip(hf, select(choice, other)))
        if m.v3:
            report["bias_changes"] += sum(a != b for a, b in zip(hf, select(probs, rule)))
        report["consecutive_changes"] += sum(a != b for a, b in zip(hf, hf[1:]))
    print(f"[{spec.name}] routing over {report['tokens']} (token, layer) pairs: group limit changes "
          f"{report['group_limit_changes']}, the other group rule ({other}) would change "
          f"{report['other_group_rule_changes']}, bias changes {report['bias_changes']}, consecutive tokens "
          f"differ {report['consecutive_changes']}")
    if report["group_limit_changes"] == 0 or report["other_group_rule_changes"] == 0:
        raise RuntimeError(f"[{spec.name}] degenerate routing: the groups never change the choice; change the seed")
    if m.v3 and report["bias_changes"] == 0:
        raise RuntimeError(f"[{spec.name}] the selection bias never changes the choice; change the seed")
    if report["consecutive_changes"] < report["tokens"] // 2:
        raise RuntimeError(f"[{spec.name}] consecutive tokens mostly share their experts; change the seed")
    return report


def write_gguf(path: Path, spec: FixtureSpec, model) -> list[dict]:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "deepseek2")
    w.add_name(f"{spec.name}-tiny")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(1)
    w.add_rope_freq_base(ROPE_THETA)
    w.add_layer_norm_rms_eps(RMS_EPS)
    m = spec.moe
    w.add_leading_dense_block_count(cfg.num_hidden_layers if m is None else m.dense_layers)
    w.add_vocab_size(VOCAB)
    if spec.q_lora_rank is not None:
        w.add_q_lora_rank(spec.q_lora_rank)
    w.add_kv_lora_rank(KV_LORA)
    w.add_key_length(KV_LORA + QK_ROPE)
    w.add_value_length(KV_LORA)
    w.add_key_length_mla(QK_NOPE + QK_ROPE)
    w.add_value_length_mla(V_HEAD)
    if m is None:
        w.add_expert_feed_forward_length(INTERMEDIATE)
        w.add_expert_shared_count(0)
    else:
        w.add_expert_count(m.n_experts)
        w.add_expert_used_count(m.experts_used)
        w.add_expert_group_count(m.n_group)
        w.add_expert_group_used_count(m.topk_group)
        w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if m.v3 else gguf.ExpertGatingFuncType.SOFTMAX)
        w.add_expert_feed_forward_length(m.expert_ffn)
        w.add_expert_shared_count(m.n_shared)
        w.add_expert_weights_scale(m.scaling)
        if m.norm_topk_prob:
            w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(QK_ROPE)
    write_rope_scaling(w, spec)

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DEEPSEEK2, cfg.num_hidden_layers)
    table = []

    def add(hf_name: str, data: np.ndarray) -> None:
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        w.add_tensor(gg_name, np.ascontiguousarray(data.astype(np.float32)))
        table.append({"name": gg_name, "hf_name": hf_name, "shape": list(data.shape)})

    for hf_name, p in model.state_dict().items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        data = p.detach().float().numpy().copy()
        if hf_name.endswith("mlp.experts.gate_up_proj"):
            n_ff = data.shape[-2] // 2
            base = hf_name.removesuffix(".gate_up_proj")
            add(base + ".gate_proj.weight", data[:, :n_ff, :])
            add(base + ".up_proj.weight", data[:, n_ff:, :])
            continue
        if hf_name.endswith("mlp.experts.down_proj"):
            add(hf_name + ".weight", data)
            continue
        if hf_name.endswith("e_score_correction_bias"):
            add(hf_name.replace("e_score_correction_bias", "e_score_correction.bias"), data)
            continue
        if hf_name.endswith("kv_b_proj.weight"):
            kv_b = data.reshape(N_HEADS, QK_NOPE + V_HEAD, KV_LORA)
            k_b = kv_b[:, :QK_NOPE, :].transpose(0, 2, 1)  # [heads, kv_lora, qk_nope]
            v_b = kv_b[:, QK_NOPE:, :]                      # [heads, v_head, kv_lora]
            add(hf_name.replace("kv_b_proj", "k_b_proj"), k_b)
            add(hf_name.replace("kv_b_proj", "v_b_proj"), v_b)
            continue
        add(hf_name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table


def make_fixture(spec: FixtureSpec, out_dir: Path) -> None:
    rng = np.random.default_rng(spec.seed)
    prompt = [BOS_ID] + [int(x) for x in rng.integers(3, VOCAB, size=spec.prompt_len - 1)]
    model = build_model(spec)
    ref = run_reference(model, prompt, spec.decode_steps)
    if ref["uncached_max_abs_diff"] > 1e-4:
        raise RuntimeError(f"[{spec.name}] HF cached vs uncached logits differ by {ref['uncached_max_abs_diff']}")
    gguf_path = out_dir / f"{spec.name}_tiny.gguf"
    table = write_gguf(gguf_path, spec, model)
    top2 = np.sort(ref["logits"], axis=1)[:, -2:]
    m = spec.moe
    moe_config = {}
    if m is not None:
        report = routing_report(spec, model, prompt + ref["generated_ids"][:spec.decode_steps])
        moe_config = {"hf_class": type(model).__name__, "moe_intermediate_size": m.expert_ffn,
                      "n_routed_experts": m.n_experts, "num_experts_per_tok": m.experts_used, "n_group": m.n_group,
                      "topk_group": m.topk_group, "topk_method": "noaux_tc" if m.v3 else "group_limited_greedy",
                      "scoring_func": "sigmoid" if m.v3 else "softmax", "n_shared_experts": m.n_shared,
                      "routed_scaling_factor": m.scaling, "norm_topk_prob": m.norm_topk_prob, **report}
    doc = {
        "name": spec.name,
        "description": (f"tiny random-weight {type(model).__name__} (MLA, "
                        f"{'all layers dense' if m is None else 'a dense layer then DeepSeekMoE layers'}); HF "
                        "transformers reference logits (f32, eager attention, HF cache, one token per decode forward)"),
        "generator": "tools/make_deepseek2_fixtures.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "gguf_file": gguf_path.name,
        "config": {"architecture": "deepseek2", "vocab_size": VOCAB, "hidden_size": HIDDEN,
                   "intermediate_size": INTERMEDIATE, "num_hidden_layers": spec.n_layers,
                   "num_attention_heads": N_HEADS, "q_lora_rank": spec.q_lora_rank, "kv_lora_rank": KV_LORA,
                   "qk_nope_head_dim": QK_NOPE, "qk_rope_head_dim": QK_ROPE, "v_head_dim": V_HEAD,
                   "rope_theta": ROPE_THETA, "rms_norm_eps": RMS_EPS,
                   "first_k_dense_replace": spec.n_layers if m is None else m.dense_layers,
                   "tie_word_embeddings": False, "seed": spec.seed, **moe_config,
                   **({"rope_parameters": spec.rope_parameters} if hasattr(spec, "rope_parameters") else {})},
        "tensors": table,
        "prompt_ids": prompt,
        "decode_ids": ref["generated_ids"][:spec.decode_steps],
        "generated_ids": ref["generated_ids"],
        "layout": ("logits[0] = prefill row at the last prompt position; logits[k] (k=1..decode_steps) = decode "
                   "step k, which feeds generated_ids[k-1] at position len(prompt)+k-1; prefill_logits[i] = prompt "
                   "position i"),
        "min_top1_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
        "uncached_max_abs_diff": ref["uncached_max_abs_diff"],
        "logits": f32_list(ref["logits"]),
        "prefill_logits": f32_list(ref["prefill_logits"]),
    }
    json_path = out_dir / f"{spec.name}_tiny.json"
    json_path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"[{spec.name}] wrote {gguf_path} ({gguf_path.stat().st_size} B), {json_path} "
          f"({json_path.stat().st_size} B); prompt={prompt} generated={ref['generated_ids']} "
          f"gap={doc['min_top1_top2_gap']:.4f} uncached_diff={ref['uncached_max_abs_diff']:.2e}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "data")
    ap.add_argument("--only", nargs="*", help="fixture names to build (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for spec in SPECS + YARN_SPECS:
        if not args.only or spec.name in args.only:
            make_fixture(spec, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
