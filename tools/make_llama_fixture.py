#!/usr/bin/env python3
"""Builds tiny random-weight Llama and Qwen2 models and their Hugging Face reference logits.

For each fixture this script
  1. builds a `LlamaForCausalLM` or `Qwen2ForCausalLM` (float32, eager attention, GQA, fixed seeds) and draws every
     weight, including non-unit RMSNorm weights and (Qwen2) non-zero q/k/v biases, so that a loader which drops a
     norm or a bias produces visibly different logits;
  2. writes it as a GGUF in llama.cpp's conventions (convert_hf_to_gguf.py): tensor names from
     `gguf.get_tensor_name_map`; for arch "llama" the rows of q_proj and k_proj permuted per head so that llama.cpp's
     adjacent-pair RoPE (LLAMA_ROPE_TYPE_NORM) reproduces HF's rotate-half; arch "qwen2" unpermuted (NEOX RoPE);
     output.weight omitted when the embedding is tied;
  3. runs HF on a prompt: one prefill forward, then greedy decode one token per forward through HF's KV cache,
     recording every f32 logits row, and cross-checks against one uncached forward;
  4. writes tests/data/<name>_tiny.gguf and tests/data/<name>_tiny.json (same JSON layout as
     tools/make_gemma3_fixture.py).

The GGUF carries no tokenizer: the tests feed token ids.
Interpreter: `python3` (pyenv CPython 3.11) with tools/requirements-reference.txt installed.
Usage: python3 tools/make_llama_fixture.py [--out-dir tests/data] [--only llama,qwen2]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

try:
    import gguf
    import torch
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
except ImportError as exc:
    sys.exit(f"make_llama_fixture: missing dependency ({exc}); pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent

HIDDEN = 64
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
MAX_POS = 128
VOCAB = 96
BOS_ID = 1


@dataclass(frozen=True)
class FixtureSpec:
    name: str  # also the GGUF architecture
    seed: int
    n_layers: int = 3
    rope_theta: float = 10_000.0
    rms_eps: float = 1e-5
    tied: bool = True
    prompt_len: int = 7
    decode_steps: int = 10


SPECS = [
    # SmolLM2-like: tied output.
    FixtureSpec(name="llama", seed=3, rope_theta=10_000.0, rms_eps=1e-5, tied=True),
    # Qwen2.5-like base and eps; untied here so the output.weight path is covered too.
    FixtureSpec(name="qwen2", seed=5, rope_theta=1_000_000.0, rms_eps=1e-6, tied=False),
]


def build_model(spec: FixtureSpec):
    common = dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTERMEDIATE,
                  num_hidden_layers=spec.n_layers, num_attention_heads=N_HEADS, num_key_value_heads=N_KV_HEADS,
                  max_position_embeddings=MAX_POS, rms_norm_eps=spec.rms_eps, hidden_act="silu",
                  tie_word_embeddings=spec.tied, bos_token_id=BOS_ID, eos_token_id=2,
                  rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta})
    if spec.name == "llama":
        cfg = LlamaConfig(head_dim=HEAD_DIM, attention_bias=False, mlp_bias=False, **common)
        cls = LlamaForCausalLM
    else:
        cfg = Qwen2Config(use_sliding_window=False, **common)
        cls = Qwen2ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    model = cls(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name == "lm_head.weight" and spec.tied:
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
    if spec.tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert model.config._attn_implementation == "eager"
    return model


def run_reference(model, prompt: list[int], steps: int) -> dict:
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        prefill = out.logits[0].float()
        cache = out.cache
        rows = [prefill[-1].clone()]
        generated = [int(torch.argmax(rows[0]))]
        for k in range(1, steps + 1):
            pos = len(prompt) + k - 1
            out = model(input_ids=torch.tensor([[generated[-1]]]), cache=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]]))
            cache = out.cache
            rows.append(out.logits[0, -1].float().clone())
            generated.append(int(torch.argmax(rows[-1])))
        full = model(input_ids=torch.tensor([prompt + generated[:steps]]), use_cache=False).logits[0].float()
        cached = torch.stack(rows)
        diff = max(float((full[len(prompt) - 1:] - cached).abs().max()),
                   float((full[:len(prompt)] - prefill).abs().max()))
    return {"prefill_logits": prefill.numpy(), "logits": cached.numpy(), "generated_ids": generated,
            "uncached_max_abs_diff": diff}


def permute_for_norm_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf LlamaModel.permute: per head, rows [first half; second half] -> interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, spec: FixtureSpec, model) -> list[dict]:
    arch = spec.name
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"{arch}-tiny")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.rms_eps)
    w.add_vocab_size(VOCAB)
    arch_id = gguf.MODEL_ARCH.LLAMA if arch == "llama" else gguf.MODEL_ARCH.QWEN2
    name_map = gguf.get_tensor_name_map(arch_id, cfg.num_hidden_layers)
    table = []
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight" and spec.tied:
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        data = p.detach().float().numpy().copy().astype(np.float32)
        if arch == "llama" and hf_name.endswith("q_proj.weight"):
            data = permute_for_norm_rope(data, N_HEADS)
        elif arch == "llama" and hf_name.endswith("k_proj.weight"):
            data = permute_for_norm_rope(data, N_KV_HEADS)
        w.add_tensor(gg_name, data)
        table.append({"name": gg_name, "hf_name": hf_name, "shape_hf": list(data.shape)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table


def f32_list(a: np.ndarray) -> list:
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        return [float(str(v)) for v in a]
    return [f32_list(row) for row in a]


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
    doc = {
        "name": spec.name,
        "description": (f"tiny random-weight {type(model).__name__}; HF transformers reference logits (f32, eager "
                        "attention, HF cache, one token per decode forward)"),
        "generator": "tools/make_llama_fixture.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__},
        "gguf_file": gguf_path.name,
        "config": {"vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
                   "num_hidden_layers": spec.n_layers, "num_attention_heads": N_HEADS,
                   "num_key_value_heads": N_KV_HEADS, "head_dim": HEAD_DIM, "rope_theta": spec.rope_theta,
                   "rms_norm_eps": spec.rms_eps, "tie_word_embeddings": spec.tied, "seed": spec.seed,
                   "qkv_bias": spec.name == "qwen2"},
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
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {s for s in args.only.split(",") if s}
    for spec in SPECS:
        if not wanted or spec.name in wanted:
            make_fixture(spec, args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
