#!/usr/bin/env python3
"""Builds tiny random-weight Qwen3, Qwen3-MoE, Phi-3, Llama-3-RoPE, GLM-4 and YaRN models and their HF reference logits.

The four fixtures cover what the llama-style layer (models/llama_style.cc) does beyond Llama 2 / Qwen2:
  qwen3_tiny         `Qwen3ForCausalLM`: per-head RMSNorm on q and k before RoPE, no biases, and a head size (16)
                     that differs from hidden / heads (32 / 4 = 8), so q is wider than the residual stream;
  qwen3moe_tiny      `Qwen3MoeForCausalLM`: Qwen3's attention with a routed-experts FFN in every layer (8 experts of
                     16, 2 used per token, norm_topk_prob), router and experts with distinct random weights so
                     consecutive tokens pick different experts;
  phi3_tiny          `Phi3ForCausalLM`: fused qkv_proj and gate_up_proj, NEOX RoPE, a sliding window of 6 that the
                     prompt plus decode steps cross, untied output;
  llama3rope_tiny    `LlamaForCausalLM` with rope_type "llama3" (factor 8, low/high frequency factors 1 / 4,
                     original context 64): of its 8 frequencies one is kept, two are smoothed and five divided by 8,
                     and the 16-token prompt plus 12 decode steps run the positions where that changes the angles;
  glm4_tiny          `Glm4ForCausalLM` (GLM-4-0414): partial rotary (factor 0.5: 8 of 16 head dims rotate, as
                     adjacent pairs 2i / 2i+1, HF's interleaved rotate_half), sandwich norms (post_self_attn_layernorm
                     on the attention output and post_mlp_layernorm on the MLP output, each before its residual add),
                     fused gate_up_proj, q/k/v biases, GQA 2:1, head size 16 over hidden 32 (q wider, as GLM-4-32B),
                     3 layers, untied output;
  qwen2yarn_tiny     `Qwen2ForCausalLM` with rope_type "yarn" as Qwen2.5 states it (factor 4,
                     original_max_position_embeddings 32, nothing else: HF's beta_fast 32 / beta_slow 1 and attention
                     factor 0.1 ln 4 + 1), q/k/v biases, untied; the 28-token prompt plus 12 decode steps run past the
                     original context;
  llamayarn_tiny     `LlamaForCausalLM` with rope_type "yarn" stating its own beta_fast 2 / beta_slow 0.1 (rope_theta
                     1000: of 8 frequencies one kept, four blended, three divided by 4) and attention_factor 1.25,
                     adjacent-pair RoPE (permuted q/k), tied.

Each GGUF is written as llama.cpp's convert_hf_to_gguf.py writes that architecture (conversion/llama.py, qwen.py,
phi.py; read, not copied):
  llama   the keys of TextModel plus vocab_size and rope.dimension_count, key/value_length from config.head_dim;
          q_proj / k_proj rows permuted per head for the adjacent-pair RoPE; `rope_freqs.weight` [head_dim / 2]
          holding, per frequency, the divisor the converter derives from the llama3 parameters (1 for the kept band,
          factor for the divided band, 1 / ((1 - smooth) / factor + smooth) in between, in float32 as it computes);
          no rope.scaling.* keys for llama3;
  qwen3   TextModel's keys (key/value_length from config.head_dim, no rope.dimension_count, no vocab_size); tensors
          unpermuted (NEOX), q_norm / k_norm as attn_q_norm / attn_k_norm;
  qwen3moe  as qwen3 plus Qwen2MoeModel's expert keys (expert_count, expert_used_count,
          expert_feed_forward_length; no expert_weights_norm: llama.cpp fixes it on for qwen3moe); HF 5.x's fused
          experts.gate_up_proj [E, 2F, H] split on dim -2 into ffn_gate_exps / ffn_up_exps (gate first),
          experts.down_proj [E, H, F] as ffn_down_exps, the router mlp.gate as ffn_gate_inp;
  yarn    (qwen2yarn, llamayarn) TextModel's rope scaling keys (conversion/base.py): rope.scaling.type = "yarn",
          rope.scaling.factor, rope.scaling.original_context_length, and rope.scaling.yarn_beta_fast /
          yarn_beta_slow / yarn_attn_factor / yarn_ext_factor only for what the config states (beta_fast,
          beta_slow, attention_factor, extrapolation_factor); qwen2 as TextModel writes it (no head_dim in the
          config: no key/value_length, no rope.dimension_count, no vocab_size), tensors unpermuted (NEOX);
  phi3    Phi3MiniModel's own keys (rope.dimension_count = partial_rotary_factor * hidden / heads,
          rope.scaling.original_context_length, attention.sliding_window, 0 when the config has none); qkv_proj as
          blk.N.attn_qkv ([q; k; v] rows) and gate_up_proj as blk.N.ffn_up ([gate; up] rows, 2 x FFN), unsplit;
  glm4    Glm4Model's keys (conversion/glm.py): TextModel's (key/value_length from config.head_dim) plus
          rope.dimension_count = head_dim * partial_rotary_factor; tensors unpermuted (llama.cpp runs GLM-4 with
          LLAMA_ROPE_TYPE_NORM, which is HF's interleaved pairing as stored), gate_up_proj as blk.N.ffn_up unsplit,
          post_self_attn_layernorm as blk.N.post_attention_norm, post_attention_layernorm as blk.N.ffn_norm and
          post_mlp_layernorm as blk.N.post_ffw_norm.
Weights are float32; the GGUF carries no tokenizer (the tests feed token ids). Each fixture stays under 200 KB.

Reference logits, prompt and JSON layout are those of tools/make_llama_fixture.py (prefill, then greedy decode one
token per forward through HF's cache, cross-checked against one uncached forward).

--check-llamacpp runs llama.cpp (llama-cpp-python, tools/install_llama_cpp.sh) on the committed fixtures instead: each
GGUF is rewritten to a temporary copy with the two keys llama.cpp needs to load a file without a tokenizer
(tokenizer.ggml.model = "none", <arch>.vocab_size), evaluated over prompt + decode ids with logits for every position,
and compared with the HF logits. Measured: qwen3 and llama3rope within 1.5e-5 at every position; glm4 within 3.7e-6
at every position (so llama.cpp reads this layout, unpermuted Q/K with its NORM pairing, as HF computes); phi3 within 3e-6
inside its window of 6 and off by up to 4.0 after it, because llama.cpp's phi3 loader disables the sliding window
the GGUF states while HF applies it; qwen2yarn within 4.0e-6; llamayarn off by 15.3, because llama.cpp's llama loader
ignores the yarn_beta_fast / yarn_beta_slow / yarn_attn_factor keys (it uses 32 / 1 and 0.1 ln(factor) + 1).
Usage: python3 tools/make_llama_variant_fixtures.py [--out-dir tests/data]
                                                     [--only qwen3,qwen3moe,phi3,llama3rope,glm4,qwen2yarn,llamayarn]
                                                     [--check-llamacpp]
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
from make_llama_fixture import f32_list, permute_for_norm_rope, run_reference  # noqa: E402

try:
    import gguf
    import torch
    import transformers
    from transformers import (Glm4Config, Glm4ForCausalLM, LlamaConfig, LlamaForCausalLM, Phi3Config,
                              Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                              Qwen3MoeConfig, Qwen3MoeForCausalLM)
except ImportError as exc:
    sys.exit(f"make_llama_variant_fixtures: missing dependency ({exc}); "
             "pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent

VOCAB = 96
HIDDEN = 32
INTERMEDIATE = 64
MAX_POS = 128
BOS_ID = 1


@dataclass(frozen=True)
class FixtureSpec:
    name: str     # the fixture is <name>_tiny
    arch: str     # GGUF general.architecture
    seed: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope_parameters: dict = field(default_factory=dict)
    rms_eps: float = 1e-5
    tied: bool = True
    sliding_window: int | None = None
    n_layers: int = 2
    prompt_len: int = 7
    decode_steps: int = 10
    n_experts: int = 0        # qwen3moe
    experts_used: int = 0
    expert_ffn: int = 0


# YaRN (models/rope_scaling.h): MAX_POS = factor x original context, as HF's validation expects.
YARN_SPECS = [
    FixtureSpec(name="qwen2yarn", arch="qwen2", seed=31, n_heads=2, n_kv_heads=1, head_dim=16, rms_eps=1e-6,
                tied=False, prompt_len=28, decode_steps=12,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32}),
    FixtureSpec(name="llamayarn", arch="llama", seed=37, n_heads=2, n_kv_heads=1, head_dim=16, rms_eps=1e-5,
                tied=True, prompt_len=28, decode_steps=12,
                rope_parameters={"rope_type": "yarn", "rope_theta": 1_000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 32, "beta_fast": 2.0, "beta_slow": 0.1,
                                 "attention_factor": 1.25}),
]


SPECS = [
    FixtureSpec(name="qwen3", arch="qwen3", seed=11, n_heads=4, n_kv_heads=2, head_dim=16, rms_eps=1e-6, tied=True,
                rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0}),
    FixtureSpec(name="qwen3moe", arch="qwen3moe", seed=19, n_heads=4, n_kv_heads=2, head_dim=16, rms_eps=1e-6,
                tied=True, rope_parameters={"rope_type": "default", "rope_theta": 1_000_000.0},
                n_experts=8, experts_used=2, expert_ffn=16),
    FixtureSpec(name="phi3", arch="phi3", seed=13, n_heads=2, n_kv_heads=1, head_dim=16, rms_eps=1e-5, tied=False,
                sliding_window=6, rope_parameters={"rope_type": "default", "rope_theta": 10_000.0}),
    FixtureSpec(name="llama3rope", arch="llama", seed=17, n_heads=2, n_kv_heads=1, head_dim=16, rms_eps=1e-5,
                tied=True, prompt_len=16, decode_steps=12,
                rope_parameters={"rope_type": "llama3", "rope_theta": 10_000.0, "factor": 8.0,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                 "original_max_position_embeddings": 64}),
    FixtureSpec(name="glm4", arch="glm4", seed=19, n_heads=4, n_kv_heads=2, head_dim=16, rms_eps=1e-5, tied=False,
                n_layers=3, prompt_len=9, decode_steps=10,
                rope_parameters={"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.5}),
] + YARN_SPECS


def build_model(spec: FixtureSpec):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                  num_hidden_layers=spec.n_layers, num_attention_heads=spec.n_heads,
                  num_key_value_heads=spec.n_kv_heads, max_position_embeddings=MAX_POS, rms_norm_eps=spec.rms_eps,
                  hidden_act="silu", tie_word_embeddings=spec.tied, bos_token_id=BOS_ID, eos_token_id=2,
                  rope_parameters=dict(spec.rope_parameters))
    if spec.arch == "qwen3":
        cfg = Qwen3Config(head_dim=spec.head_dim, attention_bias=False, use_sliding_window=False, **common)
        cls = Qwen3ForCausalLM
    elif spec.arch == "qwen3moe":
        cfg = Qwen3MoeConfig(head_dim=spec.head_dim, attention_bias=False, use_sliding_window=False,
                             num_experts=spec.n_experts, num_experts_per_tok=spec.experts_used,
                             moe_intermediate_size=spec.expert_ffn, norm_topk_prob=True, decoder_sparse_step=1,
                             mlp_only_layers=[], **common)
        cls = Qwen3MoeForCausalLM
    elif spec.arch == "phi3":
        assert spec.head_dim == HIDDEN // spec.n_heads, "Phi3 derives its head size from hidden / heads"
        cfg = Phi3Config(original_max_position_embeddings=MAX_POS, sliding_window=spec.sliding_window,
                         pad_token_id=0, **common)
        cls = Phi3ForCausalLM
    elif spec.arch == "qwen2":
        assert spec.head_dim == HIDDEN // spec.n_heads, "Qwen2 derives its head size from hidden / heads"
        cfg = Qwen2Config(use_sliding_window=False, **common)
        cls = Qwen2ForCausalLM
    elif spec.arch == "glm4":
        cfg = Glm4Config(head_dim=spec.head_dim, attention_bias=True, pad_token_id=0, **common)
        cls = Glm4ForCausalLM
    else:
        cfg = LlamaConfig(head_dim=spec.head_dim, attention_bias=False, mlp_bias=False, **common)
        cls = LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    model = cls(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    # Non-unit norm weights (including q/k norms), so a loader that drops one shows.
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name == "lm_head.weight" and spec.tied:
                continue
            if name.endswith("norm.weight"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 2.0, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim in (2, 3):  # 3-D: experts, [n_expert, out, in]
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[-1]))
            elif name.endswith("_proj.bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
    if spec.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


def router_indices(model, ids: list[int]) -> list[list[list[int]]]:
    """HF's selected experts [layer][position][slot] over one uncached forward of `ids`."""
    picked = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda _m, _i, out: picked.append(out[2].tolist()))
             for layer in model.model.layers]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]), use_cache=False)
    for h in hooks:
        h.remove()
    return picked


def llama3_rope_factors(spec: FixtureSpec) -> np.ndarray:
    """Per-frequency divisors as llama.cpp's converter derives them for rope_type "llama3" (torch float32)."""
    rp = spec.rope_parameters
    dim = spec.head_dim
    freqs = 1.0 / (rp["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
    old_ctx = rp["original_max_position_embeddings"]
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_ctx / hi:
            out.append(torch.tensor(1.0))
        elif wavelen > old_ctx / lo:
            out.append(torch.tensor(factor))
        else:
            smooth = (old_ctx / wavelen - lo) / (hi - lo)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.stack([t.to(torch.float32) for t in out]).numpy()


def write_rope_scaling(w, spec: FixtureSpec) -> None:
    """TextModel.set_gguf_parameters' rope scaling keys for rope_type "yarn" (what the config states, nothing more)."""
    rp = spec.rope_parameters
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


def write_gguf(path: Path, spec: FixtureSpec, model, loadable_by_llamacpp: bool = False) -> tuple[list[dict], dict]:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), spec.arch)
    if loadable_by_llamacpp:
        w.add_tokenizer_model("none")
        if spec.arch != "llama":
            w.add_vocab_size(VOCAB)
    w.add_name(f"{spec.name}-tiny")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_rope_freq_base(spec.rope_parameters["rope_theta"])
    write_rope_scaling(w, spec)
    extra = {}
    if spec.arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(cfg.original_max_position_embeddings)
        w.add_rope_dimension_count(int(cfg.rope_parameters.get("partial_rotary_factor", 1.0) * cfg.hidden_size)
                                   // cfg.num_attention_heads)
        w.add_sliding_window(cfg.sliding_window or 0)
    elif spec.arch == "qwen2":
        pass  # no head_dim in a Qwen2 config, so TextModel writes no key/value length
    else:
        # Both configs carry head_dim, which TextModel writes as key and value length.
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    if spec.arch == "llama":
        w.add_vocab_size(VOCAB)
        w.add_rope_dimension_count(spec.head_dim)
    if spec.arch == "glm4":
        w.add_rope_dimension_count(int(spec.head_dim * cfg.rope_parameters.get("partial_rotary_factor", 0.5)))
    if spec.arch == "qwen3moe":
        w.add_expert_count(spec.n_experts)
        w.add_expert_used_count(spec.experts_used)
        w.add_expert_feed_forward_length(spec.expert_ffn)

    arch_id = {"llama": gguf.MODEL_ARCH.LLAMA, "qwen2": gguf.MODEL_ARCH.QWEN2, "qwen3": gguf.MODEL_ARCH.QWEN3,
               "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE,
               "phi3": gguf.MODEL_ARCH.PHI3, "glm4": gguf.MODEL_ARCH.GLM4}[spec.arch]
    name_map = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    table = []
    if spec.rope_parameters.get("rope_type") == "llama3":
        factors = llama3_rope_factors(spec)
        w.add_tensor("rope_freqs.weight", factors)
        table.append({"name": "rope_freqs.weight", "hf_name": "(derived from rope_parameters)",
                      "shape_hf": list(factors.shape)})
        extra["rope_freqs"] = [float(str(v)) for v in factors]
    tensors = []
    for hf_name, p in model.state_dict().items():
        if hf_name.endswith("mlp.experts.gate_up_proj"):
            n_ff = p.shape[-2] // 2
            base = hf_name.removesuffix(".gate_up_proj")
            tensors.append((base + ".gate_proj.weight", p[..., :n_ff, :]))
            tensors.append((base + ".up_proj.weight", p[..., n_ff:, :]))
        elif hf_name.endswith("mlp.experts.down_proj"):
            tensors.append((hf_name + ".weight", p))
        else:
            tensors.append((hf_name, p))
    for hf_name, p in tensors:
        if hf_name == "lm_head.weight" and spec.tied:
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        data = p.detach().float().numpy().copy().astype(np.float32)
        if spec.arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = permute_for_norm_rope(data, spec.n_heads)
        elif spec.arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = permute_for_norm_rope(data, spec.n_kv_heads)
        w.add_tensor(gg_name, data)
        table.append({"name": gg_name, "hf_name": hf_name, "shape_hf": list(data.shape)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table, extra


def make_fixture(spec: FixtureSpec, out_dir: Path) -> None:
    rng = np.random.default_rng(spec.seed)
    prompt = [BOS_ID] + [int(x) for x in rng.integers(3, VOCAB, size=spec.prompt_len - 1)]
    model = build_model(spec)
    ref = run_reference(model, prompt, spec.decode_steps)
    if ref["uncached_max_abs_diff"] > 1e-4:
        raise RuntimeError(f"[{spec.name}] HF cached vs uncached logits differ by {ref['uncached_max_abs_diff']}")
    gguf_path = out_dir / f"{spec.name}_tiny.gguf"
    table, extra = write_gguf(gguf_path, spec, model)
    if spec.n_experts:
        extra["router_indices"] = router_indices(model, prompt + ref["generated_ids"][:spec.decode_steps])
    top2 = np.sort(ref["logits"], axis=1)[:, -2:]
    doc = {
        "name": spec.name,
        "description": (f"tiny random-weight {type(model).__name__}; HF transformers reference logits (f32, eager "
                        "attention, HF cache, one token per decode forward)"),
        "generator": "tools/make_llama_variant_fixtures.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "gguf_file": gguf_path.name,
        "config": {"architecture": spec.arch, "vocab_size": VOCAB, "hidden_size": HIDDEN,
                   **({"num_experts": spec.n_experts, "num_experts_per_tok": spec.experts_used,
                       "moe_intermediate_size": spec.expert_ffn, "norm_topk_prob": True} if spec.n_experts else {}),
                   "intermediate_size": INTERMEDIATE, "num_hidden_layers": spec.n_layers,
                   "num_attention_heads": spec.n_heads, "num_key_value_heads": spec.n_kv_heads,
                   "head_dim": spec.head_dim, "rope_parameters": spec.rope_parameters, "rms_norm_eps": spec.rms_eps,
                   "tie_word_embeddings": spec.tied, "sliding_window": spec.sliding_window, "seed": spec.seed,
                   **extra},
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


def check_llamacpp(spec: FixtureSpec, out_dir: Path) -> None:
    import tempfile

    import llama_cpp

    ref = json.loads((out_dir / f"{spec.name}_tiny.json").read_text())
    model = build_model(spec)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{spec.name}_llamacpp.gguf"
        write_gguf(path, spec, model, loadable_by_llamacpp=True)
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False,
                              type_k=0, type_v=0, flash_attn=False)
        ids = ref["prompt_ids"] + ref["decode_ids"]
        llm.eval(ids)
        got = np.array(llm.scores[:len(ids)], dtype=np.float64)
        del llm
    want = np.array(ref["prefill_logits"] + ref["logits"][1:], dtype=np.float64)
    per_pos = np.abs(got - want).max(axis=1)
    window = spec.sliding_window or len(ids)
    print(f"[{spec.name}] max |llama.cpp - HF| = {per_pos[:window].max():.3g} over positions 0..{window - 1}"
          + (f", {per_pos[window:].max():.3g} after (llama.cpp ignores the window)" if window < len(ids) else ""))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "data")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--check-llamacpp", action="store_true",
                    help="compare llama.cpp on the committed fixtures with their HF logits instead of writing them")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {s for s in args.only.split(",") if s}
    for spec in SPECS:
        if not wanted or spec.name in wanted:
            if args.check_llamacpp:
                check_llamacpp(spec, args.out_dir)
            else:
                make_fixture(spec, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
