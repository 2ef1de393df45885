#!/usr/bin/env python3
"""Generates tests/data/gemma3_tokenizer_reference.json from llama.cpp.

The reference is llama.cpp's tokenizer, driven through llama-cpp-python
(installed by tools/install_llama_cpp.sh) on the real Gemma 3 270M GGUF loaded with
vocab_only=True. For every input string and every (add_bos, parse_special)
combination it records llama_tokenize's ids, and for the ids it records
llama_detokenize's bytes with and without rendering special tokens.

One deliberate difference from llama.cpp is encoded here, not hidden: when
the text itself starts with the BOS token (parse_special and a literal
"<bos>"), llama.cpp prepends a second BOS (it only logs a warning), while
decoded's Tokenizer::Encode never doubles the BOS. For those cases `ids` is
llama.cpp's tokenization *without* the automatic BOS (add_bos=False), which is
exactly what "do not add a BOS in front of a BOS" means; llama.cpp's raw
answer is kept in `llama_cpp_ids` for the record.

Strings are stored as hex of their UTF-8 (or raw, possibly invalid) bytes so
the C++ test compares bytes exactly; `text` is a readable copy.

Usage: python3 tools/gen_tokenizer_reference.py [MODEL.gguf] [OUT.json]
"""
import ctypes
import json
import os
import sys

import llama_cpp

DEFAULT_MODEL = os.path.expanduser("~/.cache/decoded/gemma-3-270m-q4_k_m.gguf")
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data",
                           "gemma3_tokenizer_reference.json")

TEXTS = [
    b"",
    b" ",
    b"  ",
    b"   ",
    b"Hello world",
    b" Hello world",
    b"Hello world ",
    b"Hello  world",
    b"  Hello   world   ",
    b"\n",
    b"\n\n\n",
    b"line one\nline two\n",
    b"\ttab\tseparated\t",
    b"a\r\nb",
    "日本語のテキストです。".encode(),
    "中文分词测试".encode(),
    "한국어 텍스트".encode(),
    "emoji 😀🎉👍🏽".encode(),
    "👨‍👩‍👧‍👦 family".encode(),
    "🤖".encode(),
    "𠜎𠝹 rare ideographs".encode(),
    "café naïve résumé Ünïcödé".encode(),
    "Ελληνικά и кириллица".encode(),
    "العربية".encode(),
    b"def f(x):\n    return x * 2  # comment\n",
    b"for (int i = 0; i < n; ++i) { sum += a[i]; }",
    b"1234567890 3.14159 -42 1e-9 0x1F",
    b"2024-01-01T00:00:00Z",
    b"<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n",
    b"<bos>Hello",
    b"<bos><bos>Hi",
    b" <bos>Hello",
    b"<eos> and <pad> and <unk> and <mask>",
    b"<start_of_turn",
    b"<0x41> literal byte spelling",
    b"<b>bold</b> <table><tr><td>x</td></tr></table>",
    b"pneumonoultramicroscopicsilicovolcanoconiosis",
    b"Supercalifragilisticexpialidocious antidisestablishmentarianism",
    b"a" * 48,
    b"x" + b" " * 40 + b"y",
    b"\n" * 35,
    "Mixed 中文 and English with émojis 🤖!".encode(),
    b"The quick brown fox jumps over the lazy dog.",
    "\u2581 is the space marker".encode(),
    b"\x00 nul \x07 bell",
    b"\xff\xfe invalid \xc3",
]

# Id sequences decoded on their own: byte pieces of split code points,
# control, user-defined and unused pieces.
EXTRA_DECODE_PIECES = [
    ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"],
    ["<0xE4>", "<0xB8>", "<0xAD>", "▁x"],
    ["<bos>", "<start_of_turn>", "user", "\n", "Hi", "<end_of_turn>", "<eos>"],
    ["<pad>", "<unk>", "<mask>", "[multimodal]", "<unused0>", "  ", "<table>"],
]


def main():
    model = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_MODEL
    out_path = sys.argv[2] if len(sys.argv) > 2 else DEFAULT_OUT
    llm = llama_cpp.Llama(model, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    bos = llama_cpp.llama_vocab_bos(vocab)

    def tokenize(text, add_bos, special):
        return llm.tokenize(text, add_bos=add_bos, special=special)

    def detokenize(ids, render_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, render_special)
        assert 0 <= n <= cap, n
        return buf.raw[:n]

    def piece_id(piece):
        ids = [i for i in range(llama_cpp.llama_vocab_n_tokens(vocab))
               if llama_cpp.llama_vocab_get_text(vocab, i).decode("utf-8", "replace") == piece]
        assert len(ids) == 1, piece
        return ids[0]

    def readable(b):
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return None

    encode_cases = []
    for text in TEXTS:
        for add_bos in (False, True):
            for special in (False, True):
                raw = tokenize(text, add_bos, special)
                ids = raw
                if add_bos and len(raw) >= 2 and raw[0] == bos and raw[1] == bos:
                    ids = tokenize(text, False, special)
                    assert ids and ids[0] == bos
                encode_cases.append({
                    "text": readable(text),
                    "text_hex": text.hex(),
                    "add_bos": add_bos,
                    "parse_special": special,
                    "ids": ids,
                    "llama_cpp_ids": raw,
                })

    decode_cases = []
    seen = set()
    sequences = [c["ids"] for c in encode_cases]
    sequences += [[piece_id(p) for p in pieces] for pieces in EXTRA_DECODE_PIECES]
    for ids in sequences:
        if tuple(ids) in seen:
            continue
        seen.add(tuple(ids))
        for render in (False, True):
            decode_cases.append({
                "ids": ids,
                "render_special": render,
                "bytes_hex": detokenize(ids, render).hex(),
            })

    result = {
        "generator": "tools/gen_tokenizer_reference.py",
        "reference": "llama.cpp via llama-cpp-python " + llama_cpp.__version__,
        "model": os.path.basename(model),
        "vocab_size": llama_cpp.llama_vocab_n_tokens(vocab),
        "bos_id": bos,
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "end_of_turn_id": piece_id("<end_of_turn>"),
        "start_of_turn_id": piece_id("<start_of_turn>"),
        "encode": encode_cases,
        "decode": decode_cases,
    }
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(encode_cases)} encode and {len(decode_cases)} decode cases to {out_path}")


if __name__ == "__main__":
    main()
