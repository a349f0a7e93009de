#!/usr/bin/env python3
"""Builds the tokenizer fixtures of tests/model/tokenizer_test.cc.

Run by hand (CI does not), with pip-installed `tokenizers` and
`sentencepiece`; nothing is downloaded:

    python3 tests/model/make_tokenizer_fixtures.py [OUT_DIR]

OUT_DIR (default tests/model/tokenizer_fixtures) gets four small tokenizer
folders, each trained here on the text below, and reference.json with the
ids the Python libraries give for a multilingual text:

  gpt2/    byte-level BPE in GPT-2's style: ByteLevel pre-tokenizer with its
           own regex, <|endoftext|> as the only special token, no
           tokenizer_config.json (the end-of-text token is found by name)
  llama3/  Llama 3's style: Split by Llama 3's regex (Unicode classes, digit
           runs of 1-3), ByteLevel without regex, ignore_merges, special
           tokens at ids from 128000 (so token files need 32-bit ids), a
           template adding <|begin_of_text|>, eos from tokenizer_config.json
  qwen2/   Qwen2's style: NFC normalizer, Split by Qwen2's regex (single
           digits), special tokens from 151643, eos <|endoftext|>
  sp/      a SentencePiece BPE model (tokenizer.model) with byte fallback,
           as Llama 2 and Mistral ship
  llama2/  tokenizer.json as transformers converts Llama 2's SentencePiece
           model (legacy form): normalizer Prepend "▁" + Replace " " ->
           "▁", no pre-tokenizer (the whole text is one word), BPE with
           unk_token <unk>, fuse_unk and byte_fallback over <0x00>..<0xFF>
           at ids 3..258, eos </s>
  metaspace/  the newer form (Mistral, TinyLlama): no normalizer, a
           Metaspace pre-tokenizer (prepend_scheme "first", split), byte
           tokens without <0xF0>, so 4-byte characters fall to <unk> (fused)

The reference ids are encode(text, add_special_tokens=False) of `tokenizers`
and SentencePieceProcessor.encode for sp/; llama2/ and metaspace/ are
compared on their own "text" (the common one plus special tokens of theirs
and characters the training text lacks, which fall back to bytes).
"""
import io
import json
import os
import sys

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# What the tokenizers learn from: a little of several scripts, repeated with
# variations so that merges form.
TRAINING_LINES = [
    "The quick brown fox jumps over the lazy dog. It's a dog's life, isn't it?",
    "We're sure they'll come; I'd say you've seen what I'm doing.",
    "Le café est très bon, n'est-ce pas ? Ça coûte 3,50 € à Paris.",
    "Der Bär läuft über die Straße. Größe und Übermut, schön!",
    "El niño comió piña en la mañana. ¿Dónde está la estación?",
    "Привет, как дела? Москва — столица России. Хорошо!",
    "日本語の文章を書きます。東京は大きな都市です。",
    "我们今天去北京。中文的字很多，学习很有意思。",
    "한국어도 조금 있습니다. 서울은 아름답다.",
    "Numbers: 0 1 12 123 1234 12345 3.14159 2024-05-20 1,000,000",
    "Code: def f(x):\n    return x ** 2  # square\n\tindented\twith\ttabs",
    "Emoji 🙂 😀 👍🏽 🚀 and symbols ©®™ ← → ∑ ∞",
    "Spaces   between    words and\n\n\nblank lines\r\nwindows endings",
]
TRAINING_TEXT = [line for k in range(40) for line in (TRAINING_LINES[k % len(TRAINING_LINES):] +
                                                      TRAINING_LINES[:k % len(TRAINING_LINES)])]

# The text the ids are compared on: accents (composed and decomposed), CJK,
# Cyrillic, emoji with a skin-tone modifier and a ZWJ sequence, digit runs,
# whitespace runs, contractions in both cases, a special token inside.
REFERENCE_TEXT = (
    "Héllo wörld! Cafe\u0301 naïve façade — ÆØÅ æøå ß. "
    "日本語のテキスト、中文句子。한국어 "
    "Привет, мир! Ёлка. "
    "🙂👍🏽👨‍👩‍👧 ✨ "
    "digits 7 42 123 4567 1234567890 3.14159 "
    "spaces:    four, tab:\t\tend  \n\n\n  newlines\r\n"
    "It's we're THEY'LL I'd you've she'S I'M don't "
    "<|endoftext|>after the token "
    "trailing   ")


def train_bpe(pre_tokenizer, normalizer, vocab_size, ignore_merges=False):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    return tok


def add_specials(tok, names, first_id):
    """Adds special tokens at ids from first_id (past the trained vocabulary,
    as Llama 3 and Qwen2 place theirs), by editing the saved JSON: the ids go
    into the model's vocabulary too (which may have gaps), or loading would
    renumber them after the trained ones."""
    data = json.loads(tok.to_str())
    for k, name in enumerate(names):
        data["model"]["vocab"][name] = first_id + k
        data["added_tokens"].append({"id": first_id + k, "content": name, "single_word": False, "lstrip": False,
                                     "rstrip": False, "normalized": False, "special": True})
    return Tokenizer.from_str(json.dumps(data))


def save(tok, folder, config=None):
    os.makedirs(folder, exist_ok=True)
    tok.save(os.path.join(folder, "tokenizer.json"))
    if config is not None:
        with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
            json.dump(config, f, indent=2)
    return Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))


SP_SPECIALS = ["<unk>", "<s>", "</s>"]
BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
# Characters absent from the training text (so byte fallback), special
# tokens of the SentencePiece-style vocabularies mid-text, a literal byte
# token's spelling (plain text: it is not an added token), leading and
# repeated spaces.
BYTE_FALLBACK_TEXT = (" " + REFERENCE_TEXT + " </s>x<s> ÆØÅ ɐɔ ☃ 𝔘𝔫𝔦 <0x41>  double  spaces ∂ end")


def train_byte_fallback(normalizer, pre_tokenizer, vocab_size, byte_tokens):
    """A BPE as transformers converts a SentencePiece model with byte
    fallback: <unk>, <s>, </s> at ids 0..2 (added tokens), the byte tokens
    next as plain vocabulary entries, the trained pieces after them."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SP_SPECIALS, limit_alphabet=200,
                                  show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT, trainer=trainer)
    data = json.loads(tok.to_str())
    trained = sorted(data["model"]["vocab"].items(), key=lambda kv: kv[1])
    vocab = {name: k for k, name in enumerate(SP_SPECIALS + byte_tokens)}
    for name, _ in trained:
        if name not in vocab:
            vocab[name] = len(vocab)
    data["model"]["vocab"] = vocab
    data["post_processor"] = {"type": "TemplateProcessing",
                              "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                         {"Sequence": {"id": "A", "type_id": 0}}],
                              "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                       {"Sequence": {"id": "A", "type_id": 0}},
                                       {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                       {"Sequence": {"id": "B", "type_id": 1}}],
                              "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return Tokenizer.from_str(json.dumps(data))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "tokenizer_fixtures")
    os.makedirs(out, exist_ok=True)
    ref = {"text": REFERENCE_TEXT}

    gpt2 = train_bpe(pre_tokenizers.ByteLevel(add_prefix_space=False), None, 600)
    gpt2 = add_specials(gpt2, ["<|endoftext|>"], gpt2.get_vocab_size())
    gpt2 = save(gpt2, os.path.join(out, "gpt2"))
    ref["gpt2"] = {"ids": gpt2.encode(REFERENCE_TEXT, add_special_tokens=False).ids,
                   "eos": gpt2.token_to_id("<|endoftext|>")}

    llama_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama = train_bpe(llama_pre, None, 700, ignore_merges=True)
    llama = add_specials(llama, ["<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>"], 128000)
    llama.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
                                      special_tokens=[("<|begin_of_text|>", 128000)])])
    llama = save(llama, os.path.join(out, "llama3"), {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})
    ref["llama3"] = {"ids": llama.encode(REFERENCE_TEXT, add_special_tokens=False).ids,
                     "eos": llama.token_to_id("<|end_of_text|>")}

    qwen_pre = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
    qwen = train_bpe(qwen_pre, normalizers.NFC(), 650)
    qwen = add_specials(qwen, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], 151643)
    qwen = save(qwen, os.path.join(out, "qwen2"), {"eos_token": {"content": "<|endoftext|>", "special": True}})
    ref["qwen2"] = {"ids": qwen.encode(REFERENCE_TEXT, add_special_tokens=False).ids,
                    "eos": qwen.token_to_id("<|endoftext|>")}

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TRAINING_TEXT), model_writer=model, vocab_size=700, minloglevel=2,
                                   model_type="bpe", byte_fallback=True, character_coverage=1.0,
                                   hard_vocab_limit=False, normalization_rule_name="identity", bos_id=1, eos_id=2, unk_id=0, pad_id=-1)
    os.makedirs(os.path.join(out, "sp"), exist_ok=True)
    with open(os.path.join(out, "sp", "tokenizer.model"), "wb") as f:
        f.write(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    ref["sp"] = {"ids": sp.encode(REFERENCE_TEXT), "eos": sp.eos_id()}

    legacy = train_byte_fallback(
        normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")]), None, 700,
        BYTE_TOKENS)
    sp_config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "legacy": True}
    legacy = save(legacy, os.path.join(out, "llama2"), sp_config)
    ref["llama2"] = {"text": BYTE_FALLBACK_TEXT,
                     "ids": legacy.encode(BYTE_FALLBACK_TEXT, add_special_tokens=False).ids,
                     "eos": legacy.token_to_id("</s>")}

    meta = train_byte_fallback(None, pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=True),
                               650, [t for t in BYTE_TOKENS if t != "<0xF0>"])
    meta = save(meta, os.path.join(out, "metaspace"), dict(sp_config, legacy=False))
    ref["metaspace"] = {"text": BYTE_FALLBACK_TEXT,
                        "ids": meta.encode(BYTE_FALLBACK_TEXT, add_special_tokens=False).ids,
                        "eos": meta.token_to_id("</s>")}

    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, ensure_ascii=False)
        f.write("\n")
    for name in ("gpt2", "llama3", "qwen2", "sp", "llama2", "metaspace"):
        print(f"{name}: {len(ref[name]['ids'])} ids, eos {ref[name]['eos']}")


if __name__ == "__main__":
    main()
