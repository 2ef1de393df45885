#!/usr/bin/env python3
"""Builds tiny random-weight Phi-2 and SmolLM3 models and their Hugging Face reference logits.

The siblings of tools/make_llama_fixture.py (whose reference run, Q/K permutation and JSON helpers this script
imports), for the two families that are not plain Llama layers:

  phi2     `PhiForCausalLM`: one LayerNorm (with bias) feeding attention and MLP in parallel, q/k/v/dense biases,
           GELU (gelu_new) MLP with biases, partial rotary (partial_rotary_factor 0.5: 8 of 16 head dims rotate),
           final LayerNorm with bias, untied output with bias. Written as llama.cpp's convert_hf_to_gguf.py
           (conversion/phi.py, Phi2Model) writes it: its own key set (feed_forward_length = 4 * hidden,
           head_count_kv = head_count, attention.layernorm_epsilon, rope.dimension_count = rotated dims per head,
           no rope.freq_base), tensors unpermuted (llama.cpp runs phi2 with NEOX RoPE). Two files from one model:
           phi2_tiny.gguf with separate attn_q/attn_k/attn_v (what the converter writes for today's HF checkpoints)
           and phi2_tiny_fused.gguf with the fused attn_qkv weight and bias (what it writes for the original
           checkpoints' transformer.h.N.mixer.Wqkv, rows [Q; K; V]). Both share phi2_tiny.json.
  smollm3  `SmolLM3ForCausalLM`: the Llama layer (GQA, SwiGLU, RMSNorm, tied output) with no RoPE on every 4th
           layer (HF no_rope_layers from no_rope_layer_interval = 4; 5 layers, so layer 3 is NoPE and layer 4
           rotates again). Written as the converter's SmolLM3Model (a LlamaModel) writes it: Llama keys, Q/K rows
           permuted for llama.cpp's adjacent-pair RoPE. The GGUF carries no NoPE key: llama.cpp's loader fixes
           the interval at 4 (llama_model_smollm3: n_no_rope_layer_step = 4).

Every weight is drawn (non-unit norm weights, non-zero biases) so a loader that drops one is visibly wrong.
The models are small enough that each .gguf stays below 200 KB (f32 throughout).
Interpreter: `python3` with tools/requirements-reference.txt installed.
Usage: python3 tools/make_phi2_smollm3_fixtures.py [--out-dir tests/data] [--only phi2,smollm3]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_llama_fixture import BOS_ID, f32_list, permute_for_norm_rope, run_reference  # noqa: E402

try:
    import gguf
    import torch
    import transformers
    from transformers import PhiConfig, PhiForCausalLM, SmolLM3Config, SmolLM3ForCausalLM
except ImportError as exc:
    sys.exit(f"make_phi2_smollm3_fixtures: missing dependency ({exc}); "
             "pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent
VOCAB = 96
MAX_POS = 128
PROMPT_LEN = 7
DECODE_STEPS = 10

PHI2 = dict(seed=11, hidden=32, heads=2, layers=3, partial_rotary_factor=0.5, rope_theta=10_000.0, eps=1e-5)
SMOLLM3 = dict(seed=13, hidden=32, heads=4, kv_heads=2, layers=5, ffn=48, rope_theta=10_000.0, eps=1e-6,
               no_rope_layer_interval=4)


def randomize(model, tied: bool, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name == "lm_head.weight" and tied:
                continue
            if name.endswith("norm.weight"):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 2.0, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")


def build_phi2():
    c = PHI2
    # The converter writes feed_forward_length = 4 * hidden and head_count_kv = head_count whatever the config
    # says, so the fixture's config agrees with both.
    cfg = PhiConfig(vocab_size=VOCAB, hidden_size=c["hidden"], intermediate_size=4 * c["hidden"],
                    num_hidden_layers=c["layers"], num_attention_heads=c["heads"], num_key_value_heads=c["heads"],
                    hidden_act="gelu_new", max_position_embeddings=MAX_POS, layer_norm_eps=c["eps"],
                    tie_word_embeddings=False, qk_layernorm=False, bos_token_id=BOS_ID, eos_token_id=2,
                    rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"],
                                     "partial_rotary_factor": c["partial_rotary_factor"]})
    cfg._attn_implementation = "eager"
    torch.manual_seed(c["seed"])
    model = PhiForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=False, seed=c["seed"])
    head_dim = c["hidden"] // c["heads"]
    assert model.model.layers[0].self_attn.rotary_ndims == int(head_dim * c["partial_rotary_factor"])
    return model


def build_smollm3():
    c = SMOLLM3
    cfg = SmolLM3Config(vocab_size=VOCAB, hidden_size=c["hidden"], intermediate_size=c["ffn"],
                        num_hidden_layers=c["layers"], num_attention_heads=c["heads"],
                        num_key_value_heads=c["kv_heads"], hidden_act="silu", max_position_embeddings=MAX_POS,
                        rms_norm_eps=c["eps"], tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=2,
                        pad_token_id=None, no_rope_layer_interval=c["no_rope_layer_interval"],
                        use_sliding_window=False, attention_bias=False, mlp_bias=False,
                        rope_parameters={"rope_type": "default", "rope_theta": c["rope_theta"]})
    cfg._attn_implementation = "eager"
    torch.manual_seed(c["seed"])
    model = SmolLM3ForCausalLM(cfg).to(torch.float32).eval()
    randomize(model, tied=True, seed=c["seed"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    # The interval llama.cpp hard-codes is the one the fixture exercises.
    assert list(cfg.no_rope_layers) == [int((i + 1) % 4 != 0) for i in range(c["layers"])], cfg.no_rope_layers
    return model


def tensor_np(p) -> np.ndarray:
    return p.detach().float().numpy().copy().astype(np.float32)


def write_phi2_gguf(path: Path, model, fused: bool) -> list[dict]:
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_name("phi2-tiny")
    # conversion/phi.py Phi2Model.set_gguf_parameters, key for key.
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(4 * cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_attention_heads)
    w.add_layer_norm_eps(cfg.layer_norm_eps)
    w.add_rope_dimension_count(int(cfg.rope_parameters["partial_rotary_factor"] * cfg.hidden_size)
                               // cfg.num_attention_heads)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_add_bos_token(False)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.PHI2, cfg.num_hidden_layers)
    sd = model.state_dict()
    table = []

    def add(gg_name: str, data: np.ndarray, hf_name: str) -> None:
        w.add_tensor(gg_name, data)
        table.append({"name": gg_name, "hf_name": hf_name, "shape_hf": list(data.shape)})

    for hf_name, p in sd.items():
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        if fused and any(f"self_attn.{x}_proj." in hf_name for x in "qkv"):
            continue  # written below as the fused tensor
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        add(gg_name, tensor_np(p), hf_name)
    if fused:
        # The original checkpoints' mixer.Wqkv: rows [Q (all heads); K; V], mapped to attn_qkv.
        for il in range(cfg.num_hidden_layers):
            for suffix in ("weight", "bias"):
                parts = [tensor_np(sd[f"model.layers.{il}.self_attn.{x}_proj.{suffix}"]) for x in "qkv"]
                gg_name = name_map.get_name(f"transformer.h.{il}.mixer.Wqkv.{suffix}", try_suffixes=(".weight", ".bias"))
                assert gg_name == f"blk.{il}.attn_qkv.{suffix}", gg_name
                add(gg_name, np.concatenate(parts, axis=0), f"model.layers.{il}.self_attn.[qkv]_proj.{suffix}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table


def write_smollm3_gguf(path: Path, model) -> list[dict]:
    cfg = model.config
    c = SMOLLM3
    w = gguf.GGUFWriter(str(path), "smollm3")
    w.add_name("smollm3-tiny")
    # conversion/llama.py LlamaModel (SmolLM3Model's base) over TextModel.set_gguf_parameters: no head_dim in the
    # config, so no key_length; no NoPE key (llama.cpp fixes the interval).
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(c["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(cfg.vocab_size)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.SMOLLM3, cfg.num_hidden_layers)
    table = []
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight" or hf_name.endswith("rotary_emb.inv_freq"):
            continue  # tied: the converter drops the duplicate
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        data = tensor_np(p)
        if hf_name.endswith("q_proj.weight"):
            data = permute_for_norm_rope(data, cfg.num_attention_heads)
        elif hf_name.endswith("k_proj.weight"):
            data = permute_for_norm_rope(data, cfg.num_key_value_heads)
        w.add_tensor(gg_name, data)
        table.append({"name": gg_name, "hf_name": hf_name, "shape_hf": list(data.shape)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table


def write_json(out_dir: Path, name: str, model, ref: dict, prompt: list[int], gguf_files: list[Path],
               table: list[dict], config: dict) -> None:
    top2 = np.sort(ref["logits"], axis=1)[:, -2:]
    doc = {
        "name": name,
        "description": (f"tiny random-weight {type(model).__name__}; HF transformers reference logits (f32, eager "
                        "attention, HF cache, one token per decode forward)"),
        "generator": "tools/make_phi2_smollm3_fixtures.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "gguf_files": [p.name for p in gguf_files],
        "config": config,
        "tensors": table,
        "prompt_ids": prompt,
        "decode_ids": ref["generated_ids"][:DECODE_STEPS],
        "generated_ids": ref["generated_ids"],
        "layout": ("logits[0] = prefill row at the last prompt position; logits[k] (k=1..decode_steps) = decode "
                   "step k, which feeds generated_ids[k-1] at position len(prompt)+k-1; prefill_logits[i] = prompt "
                   "position i"),
        "min_top1_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
        "uncached_max_abs_diff": ref["uncached_max_abs_diff"],
        "logits": f32_list(ref["logits"]),
        "prefill_logits": f32_list(ref["prefill_logits"]),
    }
    json_path = out_dir / f"{name}_tiny.json"
    json_path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    sizes = ", ".join(f"{p.name} ({p.stat().st_size} B)" for p in gguf_files + [json_path])
    print(f"[{name}] wrote {sizes}; prompt={prompt} generated={ref['generated_ids']} "
          f"gap={doc['min_top1_top2_gap']:.4f} uncached_diff={ref['uncached_max_abs_diff']:.2e}")
    for p in gguf_files:
        if p.stat().st_size >= 200_000:
            raise RuntimeError(f"{p} is {p.stat().st_size} B, over the 200 KB fixture budget")


def reference(name: str, model, seed: int) -> tuple[list[int], dict]:
    rng = np.random.default_rng(seed)
    prompt = [BOS_ID] + [int(x) for x in rng.integers(3, VOCAB, size=PROMPT_LEN - 1)]
    ref = run_reference(model, prompt, DECODE_STEPS)
    if ref["uncached_max_abs_diff"] > 1e-4:
        raise RuntimeError(f"[{name}] HF cached vs uncached logits differ by {ref['uncached_max_abs_diff']}")
    return prompt, ref


def make_phi2(out_dir: Path) -> None:
    model = build_phi2()
    prompt, ref = reference("phi2", model, PHI2["seed"])
    separate, fused = out_dir / "phi2_tiny.gguf", out_dir / "phi2_tiny_fused.gguf"
    table = write_phi2_gguf(separate, model, fused=False)
    write_phi2_gguf(fused, model, fused=True)
    cfg = model.config
    write_json(out_dir, "phi2", model, ref, prompt, [separate, fused], table,
               {"vocab_size": VOCAB, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
                "head_dim": cfg.hidden_size // cfg.num_attention_heads,
                "partial_rotary_factor": PHI2["partial_rotary_factor"],
                "rotary_ndims": model.model.layers[0].self_attn.rotary_ndims, "rope_theta": PHI2["rope_theta"],
                "layer_norm_eps": cfg.layer_norm_eps, "hidden_act": cfg.hidden_act,
                "tie_word_embeddings": False, "seed": PHI2["seed"]})


def make_smollm3(out_dir: Path) -> None:
    model = build_smollm3()
    prompt, ref = reference("smollm3", model, SMOLLM3["seed"])
    path = out_dir / "smollm3_tiny.gguf"
    table = write_smollm3_gguf(path, model)
    cfg = model.config
    write_json(out_dir, "smollm3", model, ref, prompt, [path], table,
               {"vocab_size": VOCAB, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
                "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
                "num_key_value_heads": cfg.num_key_value_heads,
                "head_dim": cfg.hidden_size // cfg.num_attention_heads, "rope_theta": SMOLLM3["rope_theta"],
                "rms_norm_eps": cfg.rms_norm_eps, "no_rope_layers": list(cfg.no_rope_layers),
                "tie_word_embeddings": True, "seed": SMOLLM3["seed"]})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "data")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {s for s in args.only.split(",") if s}
    for name, make in (("phi2", make_phi2), ("smollm3", make_smollm3)):
        if not wanted or name in wanted:
            make(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
