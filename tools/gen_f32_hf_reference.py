#!/usr/bin/env python3
"""Hugging Face transformers reference logits for the real Gemma 3 270M architecture on exact F32 weights.

The model is the all-F32 copy of the Q4_K_M file (tools/make_f32_model.py: every tensor dequantized exactly).
This tool builds a transformers `Gemma3ForCausalLM` whose `Gemma3TextConfig` is read from that GGUF's metadata
(vocab = number of tokens, hidden, intermediate, layers, heads, KV heads, head_dim = key_length, rms eps,
sliding window, global RoPE base), plus the Gemma 3 constants the GGUF does not carry: local RoPE base 1e4,
5 sliding-window layers per global layer (layer il is global iff (il + 1) % 6 == 0), query_pre_attn_scalar =
head_dim, tanh GELU, tied output embedding, no softcapping. float32, eager attention (asserted).

Weights are loaded from the same F32 GGUF the C++ test reads, one tensor per HF parameter. The converter stores
Gemma's RMSNorm gains as (1 + w) while HF's Gemma3RMSNorm multiplies by (1 + weight), so 1 is subtracted from
every *_norm tensor on the way into HF (asserted: every HF parameter is assigned exactly once).

Cases (written to tests/data/gemma3_270m_f32_hf.json, layout in docs/reference-data.md):
  - the first 3 prompts of tests/data/gemma3_270m_llamacpp.json (their prompt_ids): prefill, then 8 greedy
    decode steps, one token per forward through HF's DynamicCache;
  - "long_window": 600 token ids (BOS + a fixed English passage repeated, tokenized by llama.cpp's tokenizer in
    vocab-only mode) so that the 512-token sliding window bites; checkpoints at prompt positions 127, 255, 383,
    511, 512, 513 and 599 (position 512 is the first whose local layers no longer see position 0), then 2 greedy
    decode steps.
For every checked row (a prompt position or a decode step) it records the argmax, the top-64 (id, logit) pairs of
the full 262144-entry row, the top1 - top2 gap, and the logits at 64 fixed "probe" ids spread over the vocabulary
(so low-ranked entries are compared too). Each case is also re-run as one uncached forward over
prompt + decode ids; the max |cached - uncached| over the recorded rows is stored (a sanity check on HF's cache).

Interpreter: `python3` (pyenv CPython 3.11) with tools/requirements-reference.txt installed, and llama-cpp-python
from tools/install_llama_cpp.sh (for the long prompt's tokenization).
Usage: python3 tools/gen_f32_hf_reference.py [--model PATH] [--out PATH]
  --model  default: the path tools/make_f32_model.py prints (it builds the F32 copy when missing)
Runtime: ~1-2 min on 2 CPU threads, ~8 GB of memory peak.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

try:
    import torch
    import transformers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
    import gguf
    from gguf import GGUFReader
except ImportError as exc:
    sys.exit(f"gen_f32_hf_reference: missing dependency ({exc}); pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent
LLAMACPP_JSON = REPO_ROOT / "tests" / "data" / "gemma3_270m_llamacpp.json"
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "gemma3_270m_f32_hf.json"

N_THREADS = 2
N_SHORT_CASES = 3
SHORT_DECODE_STEPS = 8
LONG_PROMPT_LEN = 600
LONG_DECODE_STEPS = 2
LONG_CHECKPOINTS = [127, 255, 383, 511, 512, 513, 599]
TOP_K = 64
N_PROBES = 64

# Gemma 3 constants that the GGUF metadata does not carry.
ROPE_LOCAL_BASE = 10_000.0
SLIDING_WINDOW_PATTERN = 6

# The long prompt's text: plain prose, repeated until LONG_PROMPT_LEN tokens (fixed here, not read from a repo
# file, so a regeneration tokenizes the same text).
LONG_TEXT = (
    "The river rises in the hills to the north of the town, where the snow lies late into the spring. "
    "For most of the year it is a quiet stream that a child could wade across, but in April the melt turns it "
    "brown and fast, and the old stone bridge at the mill becomes the only safe crossing for miles. "
    "The miller's family kept a record of every flood for more than two hundred years: the date, the height of "
    "the water against the marks cut into the wall, and a line or two about what was lost. "
    "Reading it now, one notices how little the entries change. A fence, a few sheep, a cart that was left too "
    "close to the bank. Only three times did the water reach the top mark, and each time the family moved "
    "upstairs with their bread and their lamps and waited for two days until the river went down again. "
    "When the railway came, the engineers built an embankment across the valley and the floods grew worse, "
    "because the water had nowhere to spread. The town argued about it for a decade before a new channel was "
    "dug, and the record in the mill ends, in a different hand, with the words: no flood this year, nor the next. "
)


def log(msg: str) -> None:
    print(f"gen_f32_hf_reference: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def f32(x: float) -> float:
    """Shortest decimal that parses back to the same float32."""
    return float(str(np.float32(x)))


def probe_ids(vocab: int) -> list[int]:
    """64 ids, one in each 1/64 slice of the vocabulary, at a scrambled offset inside the slice."""
    step = vocab // N_PROBES
    return [k * step + (k * 2654435761 + 12345) % step for k in range(N_PROBES)]


def model_path_from_tool() -> Path:
    out = subprocess.run([sys.executable, str(REPO_ROOT / "tools" / "make_f32_model.py")], check=True,
                         stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------

def field(reader: GGUFReader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise KeyError(f"GGUF metadata lacks {key}")
    return f.contents()


def make_config(reader: GGUFReader) -> Gemma3TextConfig:
    arch = field(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"architecture {arch!r}, expected gemma3")
    n_layers = int(field(reader, "gemma3.block_count"))
    head_dim = int(field(reader, "gemma3.attention.key_length"))
    if int(field(reader, "gemma3.attention.value_length")) != head_dim:
        raise ValueError("key_length != value_length")
    layer_types = ["full_attention" if (il + 1) % SLIDING_WINDOW_PATTERN == 0 else "sliding_attention"
                   for il in range(n_layers)]
    cfg = Gemma3TextConfig(
        vocab_size=len(reader.fields["tokenizer.ggml.tokens"].data),
        hidden_size=int(field(reader, "gemma3.embedding_length")),
        intermediate_size=int(field(reader, "gemma3.feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=int(field(reader, "gemma3.attention.head_count")),
        num_key_value_heads=int(field(reader, "gemma3.attention.head_count_kv")),
        head_dim=head_dim,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=int(field(reader, "gemma3.context_length")),
        rms_norm_eps=float(field(reader, "gemma3.attention.layer_norm_rms_epsilon")),
        pad_token_id=int(field(reader, "tokenizer.ggml.padding_token_id")),
        eos_token_id=int(field(reader, "tokenizer.ggml.eos_token_id")),
        bos_token_id=int(field(reader, "tokenizer.ggml.bos_token_id")),
        tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": float(field(reader, "gemma3.rope.freq_base"))},
            "sliding_attention": {"rope_type": "default", "rope_theta": ROPE_LOCAL_BASE},
        },
        query_pre_attn_scalar=head_dim,
        sliding_window=int(field(reader, "gemma3.attention.sliding_window")),
        layer_types=layer_types,
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
        attention_bias=False,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    return cfg


HF_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "attn_norm": "input_layernorm", "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    blk, il, kind, suffix = gguf_name.split(".")
    if blk != "blk" or suffix != "weight" or kind not in HF_NAMES:
        raise ValueError(f"unexpected tensor {gguf_name}")
    return f"model.layers.{il}.{HF_NAMES[kind]}.weight"


def build_model(reader: GGUFReader) -> Gemma3ForCausalLM:
    cfg = make_config(reader)
    model = Gemma3ForCausalLM(cfg).to(torch.float32).eval()
    params = dict(model.named_parameters())
    assigned: set[str] = set()
    with torch.no_grad():
        for t in reader.tensors:
            if t.tensor_type != gguf.GGMLQuantizationType.F32:
                raise ValueError(f"{t.name} is {t.tensor_type.name}; run tools/make_f32_model.py for an F32 copy")
            name = hf_name(t.name)
            value = torch.from_numpy(np.array(t.data, dtype=np.float32, copy=True))
            if name.endswith("norm.weight"):
                value = value - 1.0  # GGUF stores Gemma's (1 + w); HF's Gemma3RMSNorm applies (1 + weight)
            p = params[name]
            if tuple(p.shape) != tuple(value.shape):
                raise ValueError(f"{t.name}: shape {tuple(value.shape)} vs HF {name} {tuple(p.shape)}")
            p.copy_(value)
            assigned.add(name)
    missing = set(params) - assigned - {"lm_head.weight"}
    if missing:
        raise ValueError(f"HF parameters not loaded: {sorted(missing)}")
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "output must be tied"
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    return model


# ----------------------------------------------------------------------------------------------------------------
# Reference runs
# ----------------------------------------------------------------------------------------------------------------

def row_record(row: torch.Tensor, position: int, probes: list[int]) -> dict:
    values, ids = torch.topk(row, TOP_K)
    return {
        "position": position,
        "argmax": int(torch.argmax(row)),
        "top1_top2_gap": f32(float(values[0] - values[1])),
        "top": [[int(i), f32(float(v))] for i, v in zip(ids, values)],
        "probe_logits": [f32(float(row[i])) for i in probes],
    }


def run_case(model: Gemma3ForCausalLM, prompt: list[int], checkpoints: list[int], steps: int,
             probes: list[int]) -> dict:
    """Prefill + greedy decode with HF's own cache, one token per forward like our engine's D2."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt], dtype=torch.long), use_cache=True)
        prefill = out.logits[0]
        cache = out.cache
        prefill_rows = {p: prefill[p].clone() for p in checkpoints}
        last = prefill[len(prompt) - 1].clone()
        del out, prefill
        decode_ids = [int(torch.argmax(last))]
        decode_rows = []
        for k in range(steps):
            pos = len(prompt) + k
            out = model(input_ids=torch.tensor([[decode_ids[-1]]], dtype=torch.long), cache=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]], dtype=torch.long))
            cache = out.cache
            decode_rows.append(out.logits[0, -1].clone())
            if k + 1 < steps:
                decode_ids.append(int(torch.argmax(decode_rows[-1])))
        # Uncached check: one forward over prompt + fed tokens must give the same rows.
        full = model(input_ids=torch.tensor([prompt + decode_ids], dtype=torch.long), use_cache=False).logits[0]
        diff = max(float((full[p] - prefill_rows[p]).abs().max()) for p in checkpoints)
        diff = max([diff] + [float((full[len(prompt) + k] - r).abs().max()) for k, r in enumerate(decode_rows)])
        del full
    return {
        "prompt_ids": prompt,
        "decode_ids": decode_ids,
        "prefill_checks": [row_record(prefill_rows[p], p, probes) for p in checkpoints],
        "decode_checks": [row_record(r, len(prompt) + k, probes) for k, r in enumerate(decode_rows)],
        "uncached_max_abs_diff": diff,
    }


def long_prompt_ids(q4_model: Path) -> list[int]:
    """BOS + LONG_TEXT repeated, tokenized by llama.cpp (vocab only), cut to LONG_PROMPT_LEN ids."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=str(q4_model), vocab_only=True, verbose=False)
    text = LONG_TEXT * 4
    ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=False)
    if len(ids) < LONG_PROMPT_LEN:
        raise ValueError(f"long text gives only {len(ids)} tokens")
    return [int(i) for i in ids[:LONG_PROMPT_LEN]]


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="all-F32 GGUF (default: tools/make_f32_model.py)")
    ap.add_argument("--q4-model", type=Path, default=None,
                    help="Q4_K_M GGUF for the tokenizer (default: scripts/fetch_model.sh)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    torch.set_num_threads(N_THREADS)
    torch.manual_seed(0)

    model_path = args.model or model_path_from_tool()
    q4_path = args.q4_model or Path(subprocess.run(["bash", str(REPO_ROOT / "scripts" / "fetch_model.sh")],
                                                   check=True, stdout=subprocess.PIPE,
                                                   text=True).stdout.strip().splitlines()[-1])
    log(f"model {model_path}")
    reader = GGUFReader(str(model_path), "r")
    model = build_model(reader)
    vocab = model.config.vocab_size
    probes = probe_ids(vocab)

    llamacpp = json.loads(LLAMACPP_JSON.read_text())
    cases = []
    for c in llamacpp["cases"][:N_SHORT_CASES]:
        prompt = [int(i) for i in c["prompt_ids"]]
        log(f"case {c['name']}: {len(prompt)} prompt ids + {SHORT_DECODE_STEPS} steps")
        rec = run_case(model, prompt, [len(prompt) - 1], SHORT_DECODE_STEPS, probes)
        cases.append({"name": c["name"], **rec})
    prompt = long_prompt_ids(q4_path)
    log(f"case long_window: {len(prompt)} prompt ids + {LONG_DECODE_STEPS} steps")
    rec = run_case(model, prompt, LONG_CHECKPOINTS, LONG_DECODE_STEPS, probes)
    cases.append({"name": "long_window", **rec})

    min_gap = min(r["top1_top2_gap"] for c in cases for r in c["prefill_checks"] + c["decode_checks"])
    max_uncached = max(c["uncached_max_abs_diff"] for c in cases)
    log(f"min top1-top2 gap {min_gap:.4g}; max |cached - uncached| {max_uncached:.3g}")
    cfg = model.config
    doc = {
        "description": ("Gemma 3 270M architecture on the all-F32 copy of the Q4_K_M weights; HF transformers "
                        "reference logits (f32, eager attention, DynamicCache, one token per decode forward). "
                        "Rows: prompt positions in prefill_checks, decode steps in decode_checks; each has the "
                        "argmax, the top-64 (id, logit) pairs and the logits at probe_ids."),
        "generator": "tools/gen_f32_hf_reference.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf"),
                     "torch_threads": N_THREADS},
        "model": {"file": model_path.name, "bytes": model_path.stat().st_size,
                  "sha256": sha256_file(model_path), "made_by": "tools/make_f32_model.py"},
        "config": {
            "vocab_size": vocab, "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
            "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
            "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
            "sliding_window": cfg.sliding_window, "layer_types": list(cfg.layer_types),
            "rope_theta_global": cfg.rope_parameters["full_attention"]["rope_theta"],
            "rope_theta_local": cfg.rope_parameters["sliding_attention"]["rope_theta"],
            "query_pre_attn_scalar": cfg.query_pre_attn_scalar, "rms_norm_eps": cfg.rms_norm_eps,
            "norm_offset": "GGUF norms hold 1 + w; HF gets w = GGUF - 1",
        },
        "top_k": TOP_K,
        "probe_ids": probes,
        "min_top1_top2_gap": min_gap,
        "cases": cases,
    }
    args.out.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    log(f"wrote {args.out} ({args.out.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
