#!/usr/bin/env python3
"""Writes an all-F32 copy of the real Gemma 3 270M Q4_K_M GGUF, for exact-arithmetic reference tests.

Why: with quantized weights our engine (like llama.cpp) quantizes activations to Q8_0/Q8_K, which makes this
model's logits chaotic (a 1e-6 input nudge moves a logit by ~0.25), so quantized logits can only be compared
loosely. On F32 weights the engine does plain f32 dot products, so the real architecture (18 layers, head_dim 256,
one KV head, vocab 262144, sliding window 512, local/global RoPE) can be compared tightly with transformers on the
very same numbers (tools/gen_f32_hf_reference.py, tests/models/gemma3_f32_reference_test.cc).

What is written:
  - the source file's header and metadata section byte for byte (same keys, values, value types and order;
    general.file_type therefore still says 15 = Q4_K_M: it describes where the weights came from, and nothing
    in the engine reads it),
  - the same tensors, same names, same order, same shapes, every one stored as F32: quantized tensors are
    dequantized with gguf-py's vectorised numpy dequantize (bit-identical to ggml's dequantize_row_*), F32 tensors
    (all norms, already stored by the converter as Gemma's 1 + w) are copied unchanged,
  - GGUF v3 layout with 32-byte alignment (the source has no general.alignment), each tensor padded to 32 bytes.
The writer is ours (not gguf.GGUFWriter), so the bytes depend only on the source file and on dequantize's
results; the output sha256 is recorded below and checked after every write.

Idempotent: when the target already has the expected size and sha256 nothing is written. Otherwise the file is
written to a temporary name in the same folder, verified, then renamed into place.

Usage: python3 tools/make_f32_model.py [--source PATH] [--out PATH] [--no-verify]
  --source  default: the Q4_K_M file that scripts/fetch_model.sh provides (fetched if missing)
  --out     default: ${DECODED_CACHE_DIR:-$HOME/.cache/decoded}/gemma-3-270m-f32.gguf
Prints the output path (alone, on stdout); progress goes to stderr. Exit 1 on any failure, including a sha256
mismatch (e.g. a different gguf/numpy version producing other floats): --no-verify accepts such a file but
says so.
Runtime: ~15-30 s and ~2.5 GB of memory peak (token_embd alone is 671 MB as F32).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

try:
    from gguf import GGUFReader, GGMLQuantizationType
    from gguf.quants import dequantize
except ImportError as exc:
    sys.exit(f"make_f32_model: missing dependency ({exc}); python3 -m pip install gguf numpy")

REPO_ROOT = Path(__file__).resolve().parent.parent
OUT_NAME = "gemma-3-270m-f32.gguf"
SOURCE_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"

# Recorded from a run with gguf 0.19.0 / numpy 2.4.6 (see docs/reference-data.md); gguf.GGUFWriter given the
# same tensors writes the identical bytes.
EXPECTED_SIZE = 1078917824
EXPECTED_SHA256 = "d81a2924e5a7873cf32a1aa05ee81fb780ff7d584e5eafda27099389bd8b046c"

ALIGNMENT = 32
GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3


def log(msg: str) -> None:
    print(f"make_f32_model: {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def default_out() -> Path:
    cache = os.environ.get("DECODED_CACHE_DIR") or str(Path.home() / ".cache" / "decoded")
    return Path(cache) / OUT_NAME


def source_from_fetch_script() -> Path:
    out = subprocess.run(["bash", str(REPO_ROOT / "scripts" / "fetch_model.sh")], check=True,
                         stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def verified(path: Path) -> bool:
    if not path.is_file():
        return False
    size = path.stat().st_size
    if size != EXPECTED_SIZE:
        log(f"{path} has size {size}, expected {EXPECTED_SIZE}")
        return False
    digest = sha256_file(path)
    if digest != EXPECTED_SHA256:
        log(f"{path} has sha256 {digest}, expected {EXPECTED_SHA256}")
        return False
    return True


def pad(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def gguf_string(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def as_f32(t) -> np.ndarray:
    """The tensor's values as a C-contiguous float32 array in GGUF element order (dim 0 fastest)."""
    if t.tensor_type == GGMLQuantizationType.F32:
        return np.ascontiguousarray(np.asarray(t.data, dtype=np.float32)).reshape(-1)
    values = dequantize(t.data, t.tensor_type)
    if values.dtype != np.float32:
        raise ValueError(f"{t.name}: dequantize returned {values.dtype}")
    values = np.ascontiguousarray(values).reshape(-1)
    if values.size != int(t.n_elements):
        raise ValueError(f"{t.name}: {values.size} values, expected {int(t.n_elements)}")
    return values


def write_f32_copy(source: Path, out: Path) -> None:
    reader = GGUFReader(str(source), "r")
    alignment_field = reader.fields.get("general.alignment")
    if alignment_field is not None and int(alignment_field.contents()) != ALIGNMENT:
        raise ValueError(f"source alignment {alignment_field.contents()} unsupported")
    raw = np.memmap(source, dtype=np.uint8, mode="r")
    version = int(reader.fields["GGUF.version"].contents())
    if bytes(raw[:4]) != GGUF_MAGIC or version != GGUF_VERSION:
        raise ValueError(f"{source}: not a GGUF v3 file")
    # The metadata section: from the end of the 24-byte header to the first tensor-info record.
    kv_begin = 24
    kv_end = min(t.field.offset for t in reader.tensors)
    kv_count = int(reader.fields["GGUF.kv_count"].contents())

    infos = bytearray()
    offset = 0
    for t in reader.tensors:
        dims = [int(d) for d in t.shape.tolist()]  # GGUF order: dims[0] is the fastest-varying
        infos += gguf_string(t.name)
        infos += struct.pack("<I", len(dims))
        infos += struct.pack(f"<{len(dims)}Q", *dims)
        infos += struct.pack("<I", int(GGMLQuantizationType.F32))
        infos += struct.pack("<Q", offset)
        offset += pad(int(t.n_elements) * 4)

    with out.open("wb") as f:
        f.write(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(reader.tensors), kv_count))
        f.write(bytes(raw[kv_begin:kv_end]))
        f.write(infos)
        f.write(b"\0" * (pad(f.tell()) - f.tell()))
        for i, t in enumerate(reader.tensors):
            values = as_f32(t)
            values.astype("<f4", copy=False).tofile(f)
            f.write(b"\0" * (pad(values.nbytes) - values.nbytes))
            if t.tensor_type != GGMLQuantizationType.F32 and (i % 40 == 0 or values.size > 10_000_000):
                log(f"  {t.name}: {t.tensor_type.name} -> F32 {values.size} values")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--no-verify", action="store_true", help="accept an output whose sha256 differs")
    args = ap.parse_args()
    out = (args.out or default_out()).resolve()

    if verified(out):
        log("already present and verified")
        print(out)
        return 0

    source = args.source or source_from_fetch_script()
    if args.source is None and sha256_file(source) != SOURCE_SHA256:
        log(f"{source} is not the expected Q4_K_M file")
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"{out.name}.tmp.{os.getpid()}")
    try:
        log(f"dequantizing {source} -> {out}")
        write_f32_copy(source, tmp)
        size = tmp.stat().st_size
        digest = sha256_file(tmp)
        log(f"wrote {size} bytes, sha256 {digest}")
        if (size, digest) != (EXPECTED_SIZE, EXPECTED_SHA256):
            msg = f"output differs from the recorded one (size {EXPECTED_SIZE}, sha256 {EXPECTED_SHA256})"
            if not args.no_verify:
                log(msg)
                return 1
            log(f"warning: {msg}; kept because of --no-verify")
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
