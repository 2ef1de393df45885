#!/usr/bin/env python3
"""Reference data for the byte-level BPE tokenizer (tokenizer.ggml.model = "gpt2").

Writes three files under tests/data/:

  smollm2_tokenizer_reference.json  ids for SmolLM2-135M-Instruct (pre "smollm")
  qwen2_tokenizer_reference.json    ids for Qwen2.5-Coder-0.5B-Instruct (pre "qwen2")
  bpe_pretokenizer_reference.json   pre-tokenizer splits for every supported
                                    tokenizer.ggml.pre, including those without
                                    a real model here

Model files: every CORPUS string is tokenized by two independent
implementations built from the same GGUF:

  * llama.cpp, through llama-cpp-python (tools/install_llama_cpp.sh):
    Llama(path, vocab_only=True).tokenize(bytes, add_bos=False, special=...);
  * Hugging Face: transformers' AutoTokenizer.from_pretrained(dir,
    gguf_file=name), i.e. the tokenizer transformers builds from the GGUF
    metadata alone, encode(text, add_special_tokens=False,
    split_special_tokens=not parse_special).

Each case records both answers and `ids`, the ids decoded's tokenizer must
produce. Where the two agree, `ids` is their answer (`follows` = "both"). Where
they disagree the case must be listed in DISAGREEMENTS below with the side we
follow and why; an unlisted disagreement (or a listed case that agrees) stops
the script, so the files never hold an unexplained expectation. `ids` is never
computed by decoded.

Invalid UTF-8: HF takes only Python str, so it cannot see ill-formed bytes.
decoded repairs them before pre-tokenization by the rule llama.cpp applies
(unicode_cpts_from_utf8): scanning left to right, a byte that does not begin a
well-formed UTF-8 sequence (Unicode Table 3-7) becomes one U+FFFD and the scan
resumes at the next byte. HF is given the text after that repair
(`hf_text_hex`). llama.cpp differs from that rule in three places it gets wrong,
where decoded does not follow it: overlong forms (C0 AF decodes to "/"),
surrogates (ED A0 80 passes through) and sequences above U+10FFFF (F4 90 80 80
aborts the process with an uncaught std::invalid_argument, so llama.cpp is run
in a child process for every invalid case and `llama_cpp_ids` is null when it
died).

Decoding: `decode_hex` / `decode_special_hex` are llama.cpp's
llama_detokenize(ids, remove_special=False, unparse_special=False/True) bytes
for `ids`; `round_trips` says whether the latter equals the (repaired) text,
which fails only where the vocabulary has no piece for a byte.

Pre-tokenizer file: for each tokenizer.ggml.pre name, its regular expressions
(llama.cpp's list for that name, applied in order, each to every piece the
previous one left) are run through HF tokenizers as
pre_tokenizers.Sequence([Split(Regex(r), behavior="isolated"), ...]) on
PRETOKENIZER_TEXTS; `pieces` are the resulting strings. The regexes are stated
here as data, so the expectations come from HF's regex engine (Oniguruma),
not from decoded's (PCRE2).

Usage: python3 tools/gen_bpe_tokenizer_reference.py [--smollm2 PATH] [--qwen2 PATH] [--out-dir DIR]
Interpreter and packages: docs/reference-data.md.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys

import llama_cpp

CACHE = os.path.expanduser(os.environ.get("DECODED_CACHE_DIR", "~/.cache/decoded"))
DEFAULT_SMOLLM2 = os.path.join(CACHE, "smollm2-135m-instruct-q4_1.gguf")
DEFAULT_QWEN2 = os.path.join(CACHE, "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "data")

# (label, bytes). Labels name the case in test failures and in DISAGREEMENTS.
CORPUS = [
    # Whitespace.
    ("empty", b""),
    ("space", b" "),
    ("spaces_3", b"   "),
    ("hello", b"Hello world"),
    ("hello_leading_space", b" Hello world"),
    ("hello_trailing_space", b"Hello world "),
    ("double_space", b"Hello  world"),
    ("spaces_around", b"  Hello   world   "),
    ("space_run_40", b"x" + b" " * 40 + b"y"),
    ("newline", b"\n"),
    ("newlines_3", b"\n\n\n"),
    ("newline_run_35", b"\n" * 35),
    ("lines", b"line one\nline two\n"),
    ("tabs", b"\ttab\tseparated\t"),
    ("crlf", b"a\r\nb\r\n\r\nc"),
    ("mixed_whitespace", b"a \n \t\n  \r\n b\x0b\x0cc"),
    ("spaces_before_newline", b"end   \n  next"),
    # Code.
    ("python", b"def f(x):\n    return x * 2  # comment\n\n\nclass A:\n\tpass\n"),
    ("cpp", b"for (int i = 0; i < n; ++i) { sum += a[i]; }"),
    ("json", b'{"key": [1, 2.5, "v\\u00e9"], "nested": {"a": null}}'),
    ("html", b"<b>bold</b> <table><tr><td>x</td></tr></table>"),
    ("shell", b"ls -la | grep '^d' && echo \"$HOME\" >> ~/.bashrc"),
    ("rust_lifetime", b"fn f<'a>(x: &'a str) -> &'a str { x }"),
    ("markdown", b"| a | b |\n|---|---|\n| 1 | 2 |\n\n```py\nprint('hi')\n```"),
    ("regex_text", b"^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)$"),
    ("operators", b"a+=b; c->d; e<<=2; f!==g; h::i; j... k?.l"),
    # Digits.
    ("digits_10", b"1234567890"),
    ("numbers", b"3.14159 -42 1e-9 0x1F 12,345,678"),
    ("space_digits", b" 2024 and  99"),
    ("date", b"2024-01-01T00:00:00Z"),
    ("digits_50", b"7" * 50),
    ("arabic_indic_digits", "\u0663\u0664\u0665 and \u06f1\u06f2".encode()),
    ("fullwidth_digits", "\uff11\uff12\uff13".encode()),
    ("other_numbers", "\u2460\u2461 \u216b \u00bd \u00b2".encode()),
    # Contractions.
    ("contractions", b"don't I'm we'll they've she'd it's you're"),
    ("contractions_upper", b"DON'T I'M WE'LL THEY'VE SHE'D IT'S YOU'RE We'Ll"),
    ("apostrophes", b"''s 's' rock 'n' roll the '90s it's'"),
    ("curly_apostrophe", "can\u2019t won\u2019t".encode()),
    ("apostrophe_long_s", "don'\u017ft it'\u017f".encode()),
    # CJK.
    ("chinese", "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u4f60\u597d\uff01".encode()),
    ("japanese", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059\u3002".encode()),
    ("korean", "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8".encode()),
    ("cjk_ext_b", "\U0002070e\U00020779 rare".encode()),
    ("cjk_ext_h_unicode15", "a\U00031350\U00031351b".encode()),
    ("cjk_ext_i_unicode15_1", "x\U0002ebf0y".encode()),
    ("ideographic_space", "\u4e00\u3000\u4e8c".encode()),
    # Emoji.
    ("emoji", "emoji \U0001f600\U0001f389\U0001f44d\U0001f3fd".encode()),
    ("emoji_zwj_family", "\U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 family".encode()),
    ("emoji_flags", "\U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5".encode()),
    ("emoji_keycap", "1\ufe0f\u20e3 #\ufe0f\u20e3".encode()),
    ("emoji_rainbow_flag", "\U0001f3f3\ufe0f\u200d\U0001f308".encode()),
    ("emoji_after_word", "ok\U0001f44dgo \u2764\ufe0f".encode()),
    ("emoji_unicode15", "\U0001fae8 shaking".encode()),
    # Combining marks.
    ("combining_acute", "cafe\u0301 e\u0301te\u0301".encode()),
    ("precomposed", "caf\u00e9 \u00e9t\u00e9".encode()),
    ("vietnamese", "Ti\u1ebfng Vi\u1ec7t".encode()),
    ("vietnamese_decomposed", "Tie\u0302\u0301ng Vie\u0323\u0302t".encode()),
    ("hindi", "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e".encode()),
    ("thai", "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a".encode()),
    ("arabic_harakat", "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627".encode()),
    ("zalgo", "Z\u0334\u0321a\u0337l\u0338g\u0335o\u0336".encode()),
    ("lone_combining", "\u0301\u0302 x".encode()),
    # Mixed scripts and rare characters.
    ("mixed_scripts", "Mixed \u4e2d\u6587 and English with \u00e9mojis \U0001f916!".encode()),
    ("greek_cyrillic", "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0438 \u043a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430".encode()),
    ("arabic_english", "\u0627\u0644\u0639\u0631\u0628\u064a\u0629 English".encode()),
    ("byte_level_alphabet", "\u0120\u010a \u0120hello \u00c4\u0142".encode()),
    ("space_marker", "\u2581 is the space marker".encode()),
    ("nbsp", "a\u00a0b \u00a0 c".encode()),
    ("unicode_spaces", "a\u2003b\u2028c\u0085d\u205fe".encode()),
    ("mongolian_vowel_separator", "x\u180e\u180ey \u180e".encode()),
    ("zero_width", "a\u200bb\u200cc\u200dd\ufeffe".encode()),
    ("soft_hyphen", "co\u00adop".encode()),
    ("control_chars", b"\x00 nul \x07 bell \x1b[31mred\x1b[0m \x7f"),
    # SmolLM2 has no piece for the bytes 04 06 13 14 16 1D F1 F2 (and those
    # never in UTF-8): they yield no id; inside a word they keep their
    # neighbours apart in llama.cpp, not in HF.
    ("missing_byte_pieces", b"()\x04() (\x04) a\x13b\x1d\n \xf1\x80\x80\x80"),
    ("private_use", "\ue000\uf8ff x".encode()),
    ("unassigned", "a\u0378b".encode()),
    ("kawi_unicode15", "\U00011f04\U00011f05 \U00011f51".encode()),
    ("kaktovik_unicode15", "\U0001d2c0\U0001d2c1".encode()),
    ("garay_unicode16", "a\U00010d4ab".encode()),
    ("long_word", b"pneumonoultramicroscopicsilicovolcanoconiosis"),
    ("repeat_a_100", b"a" * 100),
    ("pangram", b"The quick brown fox jumps over the lazy dog."),
    # Special-token spellings (both models: ChatML control tokens).
    ("chatml", b"<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"),
    ("endoftext", b"text<|endoftext|>more"),
    ("im_start_prefix", b"<|im_start|"),
    ("im_end_twice", b"<|im_end|><|im_end|>"),
    ("special_spaced", b" <|im_start|> user "),
    ("special_case_mismatch", b"<|IM_START|>"),
    ("special_in_word", b"abc<|im_end|>def"),
    # Qwen2: <tool_call> is user-defined (always split out), [PAD151665] unused.
    ("tool_call", b'<tool_call>{"name": "f"}</tool_call>'),
    ("qwen_fim", b"<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>"),
    ("qwen_pad", b"[PAD151665]"),
    # SmolLM2 control tokens.
    ("smollm_repo", b"<repo_name>x<file_sep>y<jupyter_code>"),
    # Invalid UTF-8 (see the module docstring for the rule).
    ("invalid_ff_fe", b"\xff\xfe invalid"),
    ("invalid_lone_continuation", b"\x80abc\xbf"),
    ("invalid_truncated_middle", b"a\xe4\xb8b"),
    ("invalid_truncated_end", b"abc\xf0\x9f\x98"),
    ("invalid_lead_then_ascii", b"\xc3(x"),
    ("invalid_latin1", b"caf\xe9 au lait"),
    ("invalid_f8", b"\xf8\x88\x80\x80\x80z"),
    ("invalid_special_adjacent", b"\xff<|im_end|>\xc3"),
    ("invalid_overlong", b"\xc0\xaf and \xe0\x80\xaf"),
    ("invalid_surrogate", b"x\xed\xa0\x80y"),
    ("invalid_above_max", b"\xf4\x90\x80\x80 q"),
]

# Cases where HF and llama.cpp disagree: (model, label) or label (any model) -> (side followed, reason).
SMOLLM_DIGITS = (
    "llama.cpp",
    "llama.cpp's smollm pre-tokenizer (the one it uses for StarCoder-family vocabularies) isolates every \\p{N} "
    "character before the GPT-2 regex; transformers' GGUF loader has no 'smollm' split and applies the GPT-2 "
    "ByteLevel regex alone, which keeps a space or other numbers with the digits")
DISAGREEMENTS = {
    ("smollm2", "space_digits"): SMOLLM_DIGITS,
    ("smollm2", "other_numbers"): SMOLLM_DIGITS,
    ("smollm2", "missing_byte_pieces"): (
        "llama.cpp",
        "SmolLM2 has no piece for byte 0x04: HF drops the character before merging, so '(' and ')' around it merge "
        "into '()'; llama.cpp keeps it as a symbol that merges with nothing and drops it at the end, so they stay "
        "apart; decoded does what llama.cpp does"),
    "invalid_overlong": (
        "hf",
        "llama.cpp decodes overlong forms (C0 AF becomes '/', E0 80 AF too); decoded replaces every byte of them with "
        "U+FFFD, which is what HF is given"),
    "invalid_surrogate": (
        "hf",
        "llama.cpp passes an encoded surrogate (ED A0 80) through as bytes; decoded replaces every byte with U+FFFD, "
        "which is what HF is given"),
}

# Cases llama.cpp cannot tokenize (its process dies); decoded follows HF on the repaired text.
LLAMA_CPP_ABORTS = {
    "invalid_above_max": "F4 90 80 80 decodes to U+110000 and llama.cpp aborts (uncaught std::invalid_argument)",
}

# tokenizer.ggml.pre -> llama.cpp's regexes for it (llama-vocab.cpp, llm_tokenizer_bpe), applied in order.
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
DEEPSEEK_LLM_REGEXES = [
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    "\\s+$",
    "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}+",
]
PRETOKENIZERS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "gpt-2": [GPT2_REGEX],
    "phi-2": [GPT2_REGEX],  # llama.cpp: LLAMA_VOCAB_PRE_TYPE_GPT2
    "llama-bpe": [LLAMA3_REGEX],
    "qwen2": [QWEN2_REGEX],
    "smollm": [r"\p{N}", GPT2_REGEX],
    "deepseek-llm": DEEPSEEK_LLM_REGEXES,
    "glm4": [LLAMA3_REGEX],
}

PRETOKENIZER_TEXTS = [
    "Hello world",
    "  Hello   world   ",
    "x" + " " * 9 + "y",
    "line one\nline two\n\n\n",
    "a\r\n\r\n  b\n \n",
    "end   \n  next\t\t!",
    "don't I'm WE'LL they've She'D it's you're 'S",
    "1234567 3.14159 -42 1e-9 0x1F 12,345,678",
    " 2024年3月 and 99$ 100%",
    "def f(x):\n    return x ** 2  # comment",
    "for (int i = 0; i < n; ++i) { s += a[i]; } // done",
    "<b>bold</b> <|im_start|> a+=b; c->d; e<<=2; f!==g; h::i; j...",
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff0c\u4f60\u597d\uff01 \u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u043a\u0438\u0440\u0438\u043b\u043b\u0438\u0446\u0430",
    "caf\u00e9 cafe\u0301 Tie\u0302\u0301ng \u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "emoji \U0001f600\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \U0001f1eb\U0001f1f7!",
    "a\u00a0b\u2003c\u3000d \u180e x\u0085y\u2028z",
    "\u0663\u0664\u0665 \uff11\uff12\uff13 \u2460\u2461 \u216b",
    "a\U00031350b \U00011f04\U00011f51 \U0001d2c0",
    "\uff08\u5168\u89d2\uff09\u201cquoted\u201d \u2018single\u2019 \u3002end",
    "\u00b5m \u00c0\u00d6\u00d7\u00d8 \u0100\u01bb\u01bc \u03a9\u2126 \u212a\u212b",
    "tabs\tand\x0bvertical\x0cfeed   ",
    "trailing spaces   ",
    "   ",
    "",
]


def per_byte_repair(data: bytes) -> str:
    """decoded's (and llama.cpp's) input rule: each byte that does not begin a well-formed sequence -> U+FFFD."""
    out = []
    i = 0
    while i < len(data):
        b = data[i]
        if b < 0x80:
            out.append(chr(b))
            i += 1
            continue
        if 0xC2 <= b <= 0xDF:
            n, lo, hi = 2, 0x80, 0xBF
        elif b == 0xE0:
            n, lo, hi = 3, 0xA0, 0xBF
        elif b == 0xED:
            n, lo, hi = 3, 0x80, 0x9F
        elif 0xE1 <= b <= 0xEF:
            n, lo, hi = 3, 0x80, 0xBF
        elif b == 0xF0:
            n, lo, hi = 4, 0x90, 0xBF
        elif 0xF1 <= b <= 0xF3:
            n, lo, hi = 4, 0x80, 0xBF
        elif b == 0xF4:
            n, lo, hi = 4, 0x80, 0x8F
        else:
            out.append("\ufffd")
            i += 1
            continue
        seq = data[i:i + n]
        ok = (len(seq) == n and lo <= seq[1] <= hi and all(0x80 <= c <= 0xBF for c in seq[2:]))
        if ok:
            out.append(seq.decode("utf-8"))
            i += n
        else:
            out.append("\ufffd")
            i += 1
    return "".join(out)


def readable(b):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


LLAMA_CHILD = r"""
import json, sys, llama_cpp
llm = llama_cpp.Llama(sys.argv[1], vocab_only=True, verbose=False)
print(json.dumps(llm.tokenize(bytes.fromhex(sys.argv[2]), add_bos=False, special=sys.argv[3] == "1")))
"""


def llama_tokenize_in_child(model, text, special):
    r = subprocess.run([sys.executable, "-c", LLAMA_CHILD, model, text.hex(), "1" if special else "0"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout.strip().splitlines()[-1])


def model_reference(name, path, pre_expected):
    from transformers import AutoTokenizer
    import tokenizers
    import transformers

    llm = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    hf = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))

    def detokenize(ids, render_special):
        arr = (llama_cpp.llama_token * max(1, len(ids)))(*ids)
        cap = 64 + 64 * len(ids)
        buf = ctypes.create_string_buffer(cap)
        n = llama_cpp.llama_detokenize(vocab, arr, len(ids), buf, cap, False, render_special)
        assert 0 <= n <= cap, n
        return buf.raw[:n]

    cases = []
    seen_disagreements = set()
    unexplained = []
    for label, text in CORPUS:
        valid = readable(text) is not None
        hf_text = text.decode("utf-8") if valid else per_byte_repair(text)
        for special in (False, True):
            if valid:
                lc = llm.tokenize(text, add_bos=False, special=special)
            else:
                lc = llama_tokenize_in_child(path, text, special)
            hf_ids = hf.encode(hf_text, add_special_tokens=False, split_special_tokens=not special)
            case = {
                "label": label,
                "text": readable(text),
                "text_hex": text.hex(),
                "parse_special": special,
            }
            if not valid:
                case["hf_text_hex"] = hf_text.encode("utf-8").hex()
            if lc is None:
                if label not in LLAMA_CPP_ABORTS:
                    sys.exit(f"{name}: llama.cpp died on unlisted case {label!r}")
                case.update(ids=hf_ids, follows="hf", note=LLAMA_CPP_ABORTS[label])
                seen_disagreements.add(label)
            elif lc == hf_ids:
                if (name, label) in DISAGREEMENTS or label in DISAGREEMENTS:
                    unexplained.append(f"{label!r} (parse_special={special}) agrees although DISAGREEMENTS lists it")
                case.update(ids=lc, follows="both")
            else:
                known = DISAGREEMENTS.get((name, label)) or DISAGREEMENTS.get(label)
                if known is None:
                    unexplained.append(f"{label!r} (parse_special={special}):\n  llama.cpp {lc}\n  hf        {hf_ids}")
                    continue
                side, reason = known
                case.update(ids=lc if side == "llama.cpp" else hf_ids, follows=side, note=reason)
                seen_disagreements.add(label)
            case["llama_cpp_ids"] = lc
            case["hf_ids"] = hf_ids
            case["decode_hex"] = detokenize(case["ids"], False).hex()
            case["decode_special_hex"] = detokenize(case["ids"], True).hex()
            # Whether llama.cpp gives the (repaired) text back from the ids.
            case["round_trips"] = detokenize(case["ids"], True) == hf_text.encode("utf-8")
            cases.append(case)

    if unexplained:
        sys.exit(f"{name}: DISAGREEMENTS is out of date:\n" + "\n".join(unexplained))
    return {
        "generator": "tools/gen_bpe_tokenizer_reference.py",
        "references": {
            "llama.cpp": "llama-cpp-python " + llama_cpp.__version__,
            "hf": f"transformers {transformers.__version__} (tokenizer built from the GGUF), "
                  f"tokenizers {tokenizers.__version__}",
        },
        "model": os.path.basename(path),
        "tokenizer_pre": pre_expected,
        "vocab_size": llama_cpp.llama_vocab_n_tokens(vocab),
        "bos_id": llama_cpp.llama_vocab_bos(vocab),
        "eos_id": llama_cpp.llama_vocab_eos(vocab),
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "disagreements": sorted(seen_disagreements),
        "cases": cases,
    }


def pretokenizer_reference():
    import tokenizers
    from tokenizers import Regex, pre_tokenizers

    out = {}
    for name, regexes in PRETOKENIZERS.items():
        seq = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes])
        out[name] = {
            "regexes": regexes,
            "cases": [{"text": t, "pieces": [p for p, _ in seq.pre_tokenize_str(t)]} for t in PRETOKENIZER_TEXTS],
        }
    return {
        "generator": "tools/gen_bpe_tokenizer_reference.py",
        "reference": f"HF tokenizers {tokenizers.__version__}: pre_tokenizers.Sequence of Split(Regex, 'isolated')",
        "pretokenizers": out,
    }


def write(path, data):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smollm2", default=DEFAULT_SMOLLM2)
    ap.add_argument("--qwen2", default=DEFAULT_QWEN2)
    ap.add_argument("--out-dir", default=DEFAULT_OUT)
    ap.add_argument("--pretokenizers-only", action="store_true",
                    help="write only bpe_pretokenizer_reference.json (no model files, no llama.cpp needed)")
    args = ap.parse_args()
    write(os.path.join(args.out_dir, "bpe_pretokenizer_reference.json"), pretokenizer_reference())
    if args.pretokenizers_only:
        return
    for name, path, pre, out in (("smollm2", args.smollm2, "smollm", "smollm2_tokenizer_reference.json"),
                                 ("qwen2", args.qwen2, "qwen2", "qwen2_tokenizer_reference.json")):
        data = model_reference(name, path, pre)
        write(os.path.join(args.out_dir, out), data)
        n = len(data["cases"])
        both = sum(c["follows"] == "both" for c in data["cases"])
        print(f"{name}: {n} cases, {both} where HF and llama.cpp agree; disagreements: {data['disagreements']}")


if __name__ == "__main__":
    main()
