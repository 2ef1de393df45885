#!/usr/bin/env python3
"""Builds tiny random-weight Gemma 3 text models and their Hugging Face reference logits.

For each fixture config this script
  1. builds a `Gemma3ForCausalLM` from a `Gemma3TextConfig` (float32, eager attention, fixed torch seed) and
     re-initialises every weight with a scale that gives well-separated logits, including *non-zero* RMSNorm and
     q/k-norm weights so that Gemma's `(1 + w)` norm offset changes the result;
  2. writes the weights as a GGUF in llama.cpp's conventions for arch "gemma3" (tensor names from
     `gguf.get_tensor_name_map`, RMSNorm weights stored as `1 + w` exactly as llama.cpp's
     `convert_hf_to_gguf.py` Gemma3Model does, tied output = token_embd, a tiny SentencePiece-style vocabulary),
     plus the extra keys our engine reads (see docs/reference-data.md);
  3. runs HF on a prompt (random ids starting with bos=2): one prefill forward for all prompt positions, then
     greedy decode one token at a time through HF's own KV cache, recording every f32 logits row;
  4. cross-checks the cached decode against one uncached forward over the whole sequence;
  5. writes tests/data/gemma3_tiny_<name>.gguf and tests/data/gemma3_tiny_<name>.json.

Interpreter: `python3` (pyenv CPython 3.11) with tools/requirements-reference.txt installed (and
tools/install_llama_cpp.sh for --check-llamacpp).
Usage: python3 tools/make_gemma3_fixture.py [--out-dir tests/data] [--only swa,softcap,f16] [--check-llamacpp]
  --check-llamacpp also writes a throwaway llama.cpp-compatible model and compares llama.cpp's logits with HF's
  (needs llama-cpp-python from tools/install_llama_cpp.sh); it fails when they disagree or when deliberately broken
  files agree.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

try:
    import gguf
    import torch
    import transformers
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig
except ImportError as exc:  # the tool is optional: say what is missing instead of a traceback
    sys.exit(f"make_gemma3_fixture: missing dependency ({exc}); pip install -r tools/requirements-reference.txt")

REPO_ROOT = Path(__file__).resolve().parent.parent

# Special token ids follow Gemma's own layout (pad 0, eos 1, bos 2, unk 3).
PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3


@dataclass(frozen=True)
class FixtureSpec:
    name: str
    seed: int
    n_layers: int = 6
    sliding_window: int = 4
    sliding_window_pattern: int = 3  # layer il is global iff (il + 1) % pattern == 0
    rope_global: float = 1_000_000.0
    rope_local: float = 10_000.0
    query_pre_attn_scalar: int = 24  # != head_dim (16), so a wrong attention scale shows
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    matrix_dtype: str = "f32"  # "f32" or "f16": storage type of the 2-D tensors in the GGUF
    # With tied embeddings a large embedding std makes the input token dominate the output; 0.2 keeps greedy
    # decode varied while logits stay a few units apart.
    embed_std: float = 0.2
    prompt_len: int = 7
    decode_steps: int = 10


HIDDEN = 64
N_HEADS = 4
N_KV_HEADS = 2
HEAD_DIM = 16
INTERMEDIATE = 128
MAX_POS = 128
RMS_EPS = 1e-6

# "f16" shares the seed of "swa": the same random weights, rounded to F16, so the two fixtures differ only in storage.
# Seeds were picked (once, by hand) for varied greedy output and a clear top-1/top-2 logit gap at every row, so a
# correct engine cannot flip an argmax through float noise. "softcap" has 3 layers (local, local, global) to keep
# the fixtures small; the full 6-layer pattern is covered by "swa".
SPECS = [
    FixtureSpec(name="swa", seed=12),
    FixtureSpec(name="softcap", seed=2, n_layers=3, final_logit_softcapping=30.0, attn_logit_softcapping=50.0),
    FixtureSpec(name="f16", seed=12, matrix_dtype="f16"),
]


# ----------------------------------------------------------------------------------------------------------------
# Vocabulary
# ----------------------------------------------------------------------------------------------------------------

# SentencePiece marks a word start with U+2581; Gemma's GGUF vocab uses the same pieces.
_SP = "\u2581"
_WORDS = ["the", "a", "hello", "world", "is", "of", "and", "to", "in", "model", "token", "window", "cat", "dog"]


def build_vocab() -> tuple[list[str], list[float], list[int]]:
    """Returns (pieces, scores, token_types) of the tiny vocabulary; ids are list positions.

    Layout: 0..3 specials, 4..5 chat control tokens, 6..261 byte tokens <0x00>..<0xFF>, then word/letter pieces.
    Token types follow llama.cpp's enum (gguf.TokenType): NORMAL 1, UNKNOWN 2, CONTROL 3, BYTE 6.
    """
    pieces: list[str] = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
    types: list[int] = [gguf.TokenType.CONTROL, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL,
                        gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(256):
        pieces.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
    normal = [_SP] + [_SP + w for w in _WORDS] + list("abcdefghijklmnopqrstuvwxyz") + [_SP + c for c in "abcdefghijklmnopqrstuvwxyz"]
    normal += ["\n", "\n\n", ".", ",", "!", "?"]
    normal = list(dict.fromkeys(normal))  # unique pieces: llama.cpp rejects a vocab with duplicate tokens
    for p in normal:
        pieces.append(p)
        types.append(gguf.TokenType.NORMAL)
    # Scores: specials and bytes 0; normal pieces get decreasing log-probability-like scores by rank, so longer
    # words (listed first) win merges over letters as in a real SentencePiece model.
    scores = [0.0] * len(pieces)
    first_normal = len(pieces) - len(normal)
    for i in range(first_normal, len(pieces)):
        scores[i] = -float(i - first_normal) - 1.0
    assert len(set(pieces)) == len(pieces)
    return pieces, scores, [int(t) for t in types]


# ----------------------------------------------------------------------------------------------------------------
# Model
# ----------------------------------------------------------------------------------------------------------------

def layer_types_for(spec: FixtureSpec) -> list[str]:
    return ["full_attention" if (il + 1) % spec.sliding_window_pattern == 0 else "sliding_attention"
            for il in range(spec.n_layers)]


def make_config(spec: FixtureSpec, vocab_size: int, attn_softcap: float | None) -> Gemma3TextConfig:
    cfg = Gemma3TextConfig(
        vocab_size=vocab_size,
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=spec.n_layers,
        num_attention_heads=N_HEADS,
        num_key_value_heads=N_KV_HEADS,
        head_dim=HEAD_DIM,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=MAX_POS,
        rms_norm_eps=RMS_EPS,
        pad_token_id=PAD_ID,
        eos_token_id=EOS_ID,
        bos_token_id=BOS_ID,
        tie_word_embeddings=True,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": spec.rope_global},
            "sliding_attention": {"rope_type": "default", "rope_theta": spec.rope_local},
        },
        query_pre_attn_scalar=int(spec.query_pre_attn_scalar),
        sliding_window=spec.sliding_window,
        layer_types=layer_types_for(spec),
        final_logit_softcapping=spec.final_logit_softcapping,
        attn_logit_softcapping=attn_softcap,
        attention_bias=False,
        attention_dropout=0.0,
    )
    cfg._attn_implementation = "eager"
    return cfg


def build_model(spec: FixtureSpec, vocab_size: int, attn_softcap: float | None) -> Gemma3ForCausalLM:
    """Builds the model and draws its weights from torch's generator seeded with spec.seed."""
    cfg = make_config(spec, vocab_size, attn_softcap)
    torch.manual_seed(spec.seed)
    model = Gemma3ForCausalLM(cfg).to(torch.float32).eval()
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if name == "lm_head.weight":
                continue  # tied to embed_tokens
            if name.endswith(("post_attention_layernorm.weight", "post_feedforward_layernorm.weight")):
                # Larger post-norm gains let the layers, not the (tied) input embedding, dominate the residual
                # stream; otherwise a random model just repeats its last input token under greedy decode.
                p.copy_(torch.empty(p.shape).uniform_(1.0, 3.0, generator=gen))
            elif name.endswith("norm.weight"):
                # Non-zero so that (1 + w) differs from both w and 1: a loader that forgets or doubles the offset
                # produces visibly different logits.
                p.copy_(torch.empty(p.shape).uniform_(-0.5, 0.5, generator=gen))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(torch.randn(p.shape, generator=gen) * spec.embed_std)
            elif p.ndim == 2:
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(p.shape[1]))
            else:
                raise RuntimeError(f"unexpected parameter {name} {tuple(p.shape)}")
        if spec.matrix_dtype == "f16":
            # Both sides must see the same numbers: the reference runs with the F16-rounded matrices upcast to f32.
            for name, p in model.named_parameters():
                if p.ndim == 2:
                    p.copy_(p.half().float())
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr(), "output must be tied"
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    assert list(model.config.layer_types) == layer_types_for(spec)
    return model


# ----------------------------------------------------------------------------------------------------------------
# HF reference run
# ----------------------------------------------------------------------------------------------------------------

def run_reference(model: Gemma3ForCausalLM, prompt: list[int], steps: int) -> dict:
    """Prefill + greedy decode with HF's own KV cache, one token per forward like our engine.

    Returns prefill_logits [prompt_len][vocab], logits [1 + steps][vocab] (row 0 = prefill last position, row k =
    decode step k), generated_ids [1 + steps] (generated_ids[k] = argmax(logits[k]); decode step k feeds
    generated_ids[k-1] at position prompt_len + k - 1) and the max |diff| against an uncached full forward.
    """
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model(input_ids=ids, use_cache=True)
        prefill = out.logits[0].float()
        cache = out.cache
        rows = [prefill[-1].clone()]
        generated = [int(torch.argmax(rows[0]))]
        for k in range(1, steps + 1):
            tok = torch.tensor([[generated[-1]]], dtype=torch.long)
            pos = len(prompt) + k - 1
            out = model(input_ids=tok, cache=cache, use_cache=True,
                        position_ids=torch.tensor([[pos]], dtype=torch.long))
            cache = out.cache
            rows.append(out.logits[0, -1].float().clone())
            generated.append(int(torch.argmax(rows[-1])))
        # Uncached check: the full sequence in one forward must give the same rows (catches a cache that evicts
        # sliding-window keys differently from the mask).
        full_ids = torch.tensor([prompt + generated[:steps]], dtype=torch.long)
        full = model(input_ids=full_ids, use_cache=False).logits[0].float()
        full_rows = full[len(prompt) - 1:]
        cached_rows = torch.stack(rows)
        max_diff = float((full_rows - cached_rows).abs().max())
        prefill_diff = float((full[:len(prompt)] - prefill).abs().max())
    return {
        "prefill_logits": prefill.numpy(),
        "logits": cached_rows.numpy(),
        "generated_ids": generated,
        "uncached_max_abs_diff": max(max_diff, prefill_diff),
    }


def attn_softcap_is_honoured(spec: FixtureSpec, vocab_size: int, prompt: list[int]) -> bool:
    """True when the installed transformers changes Gemma3 eager logits with attn_logit_softcapping set.

    The cap is a tiny value (0.5) so any honoured cap moves the logits far beyond float noise.
    """
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        base = build_model(spec, vocab_size, None)(input_ids=ids, use_cache=False).logits
        capped = build_model(spec, vocab_size, 0.5)(input_ids=ids, use_cache=False).logits
    return not torch.equal(base, capped)


# ----------------------------------------------------------------------------------------------------------------
# GGUF writer
# ----------------------------------------------------------------------------------------------------------------

def write_gguf(path: Path, spec: FixtureSpec, model: Gemma3ForCausalLM, vocab: tuple, attn_softcap: float | None,
               extra_keys: bool = True, norm_offset: bool = True) -> list[dict]:
    """Writes model as a llama.cpp-convention gemma3 GGUF; returns the tensor table written (name, shape, type).

    norm_offset=False (store w, not 1 + w) exists only for the llama.cpp mutant check.
    """
    pieces, scores, types = vocab
    arch = "gemma3"
    cfg = model.config
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"gemma3-tiny-{spec.name}")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.matrix_dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_freq_base(spec.rope_global)  # global layers' base, as convert_hf_to_gguf.py writes it
    w.add_sliding_window(spec.sliding_window)
    if extra_keys:
        # llama.cpp hard-codes these for gemma3 (pattern 6, local base 10000, scale 1/sqrt(head_dim)); our engine
        # reads them when present so a tiny model can use other values.
        w.add_sliding_window_pattern(spec.sliding_window_pattern)  # u32
        w.add_rope_freq_base_swa(spec.rope_local)
        w.add_float32(f"{arch}.attention.query_pre_attn_scalar", float(spec.query_pre_attn_scalar))
    if spec.final_logit_softcapping is not None:
        w.add_final_logit_softcapping(spec.final_logit_softcapping)
    if attn_softcap is not None:
        w.add_attn_logit_softcapping(attn_softcap)

    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_unk_token_id(UNK_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)

    name_map = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, cfg.num_hidden_layers)
    table = []
    for hf_name, p in model.state_dict().items():
        if hf_name == "lm_head.weight":
            continue  # tied: llama.cpp falls back to token_embd.weight when output.weight is absent
        gg_name = name_map.get_name(hf_name, try_suffixes=(".weight",))
        if gg_name is None:
            raise RuntimeError(f"no gguf name for {hf_name}")
        data = p.detach().float().numpy().copy()
        if hf_name.endswith("norm.weight") and norm_offset:
            data = (data + np.float32(1.0)).astype(np.float32)  # Gemma3RMSNorm multiplies by (1 + w)
        if data.ndim == 2 and spec.matrix_dtype == "f16":
            data = data.astype(np.float16)
        else:
            data = data.astype(np.float32)
        w.add_tensor(gg_name, data)
        table.append({"name": gg_name, "hf_name": hf_name, "shape_hf": list(data.shape),
                      "ggml_ne": list(reversed(data.shape)), "type": "F16" if data.dtype == np.float16 else "F32"})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return table


def check_gguf(path: Path, table: list[dict], model: Gemma3ForCausalLM, spec: FixtureSpec) -> None:
    """Reads the file back with gguf.GGUFReader and checks names, types and a (1 + w) norm row."""
    r = gguf.GGUFReader(str(path))
    names = {t.name: t for t in r.tensors}
    assert set(names) == {t["name"] for t in table}, "tensor set mismatch"
    assert "output.weight" not in names
    n = names["blk.0.attn_norm.weight"]
    hf = model.model.layers[0].input_layernorm.weight.detach().numpy()
    assert np.array_equal(np.asarray(n.data), (hf + np.float32(1.0)).astype(np.float32)), "norm offset"
    q = names["blk.0.attn_q.weight"]
    want = gguf.GGMLQuantizationType.F16 if spec.matrix_dtype == "f16" else gguf.GGMLQuantizationType.F32
    assert q.tensor_type == want, q.tensor_type
    assert list(q.shape) == [HIDDEN, N_HEADS * HEAD_DIM], q.shape  # ne0 = in_features


# ----------------------------------------------------------------------------------------------------------------
# Main
# ----------------------------------------------------------------------------------------------------------------

def f32_list(a: np.ndarray) -> list:
    """Nested lists of Python floats printed with the shortest decimal that parses back to the same float32.

    str(np.float32) is numpy's shortest round-trip form; json then prints that float64 unchanged.
    """
    a = np.asarray(a, dtype=np.float32)
    if a.ndim == 1:
        return [float(str(v)) for v in a]
    return [f32_list(row) for row in a]


def make_fixture(spec: FixtureSpec, out_dir: Path) -> dict:
    vocab = build_vocab()
    vocab_size = len(vocab[0])
    rng = np.random.default_rng(spec.seed)
    first_text_id = 6  # skip specials and chat control tokens
    prompt = [BOS_ID] + [int(x) for x in rng.integers(first_text_id, vocab_size, size=spec.prompt_len - 1)]

    attn_softcap = spec.attn_logit_softcapping
    attn_softcap_note = None
    if attn_softcap is not None and not attn_softcap_is_honoured(spec, vocab_size, prompt):
        attn_softcap_note = (f"attn_logit_softcapping={attn_softcap} requested but dropped: transformers "
                             f"{transformers.__version__} Gemma3 eager attention ignores it (Gemma3Attention never "
                             f"passes softcap= to the attention function), and llama.cpp's converter asserts it "
                             f"is None for Gemma3")
        print(f"[{spec.name}] {attn_softcap_note}", file=sys.stderr)
        attn_softcap = None

    model = build_model(spec, vocab_size, attn_softcap)
    ref = run_reference(model, prompt, spec.decode_steps)
    if ref["uncached_max_abs_diff"] > 1e-4:
        raise RuntimeError(f"[{spec.name}] HF cached vs uncached logits differ by {ref['uncached_max_abs_diff']}")

    gguf_path = out_dir / f"gemma3_tiny_{spec.name}.gguf"
    table = write_gguf(gguf_path, spec, model, vocab, attn_softcap)
    check_gguf(gguf_path, table, model, spec)

    logits = ref["logits"]
    top2 = np.sort(logits, axis=1)[:, -2:]
    doc = {
        "name": spec.name,
        "description": ("tiny random-weight Gemma 3 text model; HF transformers reference logits (f32, eager "
                        "attention, HF DynamicCache, one token per decode forward)"),
        "generator": "tools/make_gemma3_fixture.py",
        "versions": {"python": sys.version.split()[0], "torch": torch.__version__,
                     "transformers": transformers.__version__, "numpy": np.__version__,
                     "gguf": getattr(gguf, "__version__", None) or _dist_version("gguf")},
        "gguf_file": gguf_path.name,
        "config": {
            "vocab_size": vocab_size,
            "hidden_size": HIDDEN,
            "intermediate_size": INTERMEDIATE,
            "num_hidden_layers": spec.n_layers,
            "num_attention_heads": N_HEADS,
            "num_key_value_heads": N_KV_HEADS,
            "head_dim": HEAD_DIM,
            "max_position_embeddings": MAX_POS,
            "rms_norm_eps": RMS_EPS,
            "hidden_activation": "gelu_pytorch_tanh",
            "embed_scale": math.sqrt(HIDDEN),
            "rope_theta_global": spec.rope_global,
            "rope_theta_local": spec.rope_local,
            "sliding_window": spec.sliding_window,
            "sliding_window_pattern": spec.sliding_window_pattern,
            "layer_types": layer_types_for(spec),
            "query_pre_attn_scalar": spec.query_pre_attn_scalar,
            "attention_scale": spec.query_pre_attn_scalar ** -0.5,
            "final_logit_softcapping": spec.final_logit_softcapping,
            "attn_logit_softcapping": attn_softcap,
            "tie_word_embeddings": True,
            "matrix_dtype": spec.matrix_dtype,
            "seed": spec.seed,
        },
        "notes": [n for n in [attn_softcap_note] if n],
        "mask_semantics": "query i sees key j iff i - sliding_window < j <= i on sliding layers; j <= i on global",
        "tensors": table,
        "prompt_ids": prompt,
        "decode_ids": ref["generated_ids"][:spec.decode_steps],
        "generated_ids": ref["generated_ids"],
        "layout": ("logits[0] = prefill row at the last prompt position; logits[k] (k=1..decode_steps) = decode "
                   "step k, which feeds generated_ids[k-1] (= decode_ids[k-1]) at position len(prompt)+k-1; "
                   "generated_ids[k] = argmax(logits[k]); prefill_logits[i] = prompt position i"),
        "min_top1_top2_gap": float((top2[:, 1] - top2[:, 0]).min()),
        "uncached_max_abs_diff": ref["uncached_max_abs_diff"],
        "logits": f32_list(logits),
        "prefill_logits": f32_list(ref["prefill_logits"]),
    }
    json_path = out_dir / f"gemma3_tiny_{spec.name}.json"
    json_path.write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    print(f"[{spec.name}] wrote {gguf_path} ({gguf_path.stat().st_size} B), {json_path} "
          f"({json_path.stat().st_size} B); prompt={prompt} generated={ref['generated_ids']} "
          f"gap={doc['min_top1_top2_gap']:.4f} uncached_diff={ref['uncached_max_abs_diff']:.2e}")
    return doc


class _GgmlGeluF16Table(torch.nn.Module):
    """GELU (tanh form) as ggml's CPU backend computes it: f16(gelu(f16(x))) from a table, 0 below -10, x above 10.

    ggml-cpu builds with GGML_GELU_FP16, which moves llama.cpp's logits by ~1e-3 against an exact GELU; emulating
    the table on the HF side removes that noise so a convention mismatch cannot hide in it.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g = torch.nn.functional.gelu(x.half().float(), approximate="tanh").half().float()
        return torch.where(x <= -10, torch.zeros_like(x), torch.where(x >= 10, x, g))


def check_against_llamacpp(out_dir: Path) -> bool:
    """Cross-checks this script's GGUF conventions against llama.cpp itself (needs llama-cpp-python).

    llama.cpp hard-codes Gemma 3's SWA pattern (6), local RoPE base (10000) and attention scale (1/sqrt(head_dim)),
    so a throwaway model with exactly those values is written with the same writer and run through both HF and
    llama.cpp (F32 KV cache) over a prompt three windows long. Agreement means the tensor names, the (1 + w) norm
    storage, the tied output, the matrix layout, the final softcap and the sliding-window semantics match
    llama.cpp's. Two mutants (norms stored without the +1; window written as w+1) must disagree, which shows the
    check can fail. Returns True when all three outcomes are as expected.
    """
    try:
        import llama_cpp
    except ImportError as exc:
        raise SystemExit(f"--check-llamacpp needs llama-cpp-python ({exc}); run tools/install_llama_cpp.sh")
    spec = FixtureSpec(name="llamacpp_check", seed=4, n_layers=6, sliding_window=4, sliding_window_pattern=6,
                       rope_global=1_000_000.0, rope_local=10_000.0, query_pre_attn_scalar=HEAD_DIM,
                       final_logit_softcapping=30.0, prompt_len=12)
    vocab = build_vocab()
    model = build_model(spec, len(vocab[0]), None)
    for layer in model.model.layers:
        layer.mlp.act_fn = _GgmlGeluF16Table()
    rng = np.random.default_rng(7)
    prompt = [BOS_ID] + [int(x) for x in rng.integers(6, len(vocab[0]), size=spec.prompt_len - 1)]
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([prompt]), use_cache=False).logits[0].float().numpy()

    def llamacpp_diff(variant: str, file_spec: FixtureSpec, norm_offset: bool) -> float:
        path = out_dir / f"gemma3_tiny_llamacpp_check_{variant}.gguf"
        write_gguf(path, file_spec, model, vocab, None, extra_keys=False, norm_offset=norm_offset)
        try:
            # F32 KV cache: llama.cpp's default F16 cache alone moves these logits by ~1e-3.
            llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_threads=2, logits_all=True, verbose=False,
                                  seed=0, type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
            llm.eval(prompt)
            lc = np.asarray(llm.scores[:len(prompt)], dtype=np.float32)
            del llm
        finally:
            path.unlink()
        diff = float(np.abs(lc - hf).max())
        print(f"[llamacpp_check] {variant}: HF vs llama.cpp (llama-cpp-python {llama_cpp.__version__}) over "
              f"{len(prompt)} positions: max |diff| = {diff:.3e} (max |logit| {float(np.abs(hf).max()):.2f})")
        return diff

    ok = llamacpp_diff("same", spec, True) < 1e-3
    ok &= llamacpp_diff("mutant_no_norm_offset", spec, False) > 1e-1
    ok &= llamacpp_diff("mutant_window_plus_1", replace(spec, sliding_window=spec.sliding_window + 1), True) > 1e-2
    return ok


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=REPO_ROOT / "tests" / "data")
    ap.add_argument("--only", default="", help="comma-separated fixture names (default: all)")
    ap.add_argument("--check-llamacpp", action="store_true",
                    help="also verify the GGUF conventions against llama.cpp (llama-cpp-python) and fail on mismatch")
    args = ap.parse_args()
    torch.set_num_threads(1)  # reproducible reductions
    args.out_dir.mkdir(parents=True, exist_ok=True)
    wanted = {s for s in args.only.split(",") if s}
    for spec in SPECS:
        if wanted and spec.name not in wanted:
            continue
        make_fixture(spec, args.out_dir)
    if args.check_llamacpp and not check_against_llamacpp(args.out_dir):
        print("llama.cpp cross-check failed (see the lines above)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
