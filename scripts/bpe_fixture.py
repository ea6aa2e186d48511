#!/usr/bin/python3
"""Writes the tokenizers the tests read in Hugging Face's formats (tests/data/byte_level_bpe_test.cpp
compares loco's encoding of new text with Hugging Face's JavaScript tokenizers on them):

- tests/data/fixtures/qwen2_tokenizer: a byte-level BPE tokenizer.json in Qwen2's layout (NFC,
  Qwen2's Split regex, ByteLevel, BPE merges) and its tokenizer_config.json. Nothing here downloads
  models, so the merges are learned here, by plain BPE training on the GPL-3 text Debian ships and
  on a multilingual sample. Learning them only needs to be deterministic, not to match any
  trainer: both sides read the same file.
- tests/data/fixtures/llama2_tokenizer: a SentencePiece BPE tokenizer.model trained as Llama 2's
  was (identity normalization, extra white space kept, a dummy prefix, digits split, byte
  fallback), and the tokenizer.json Hugging Face's LlamaConverter makes of such a model (its
  vocabulary, merges ordered by the merged piece's score, Prepend and Replace normalizers, byte
  fallback): loco reads the .model with SentencePiece, the JavaScript reference the .json.

    /usr/bin/python3 scripts/bpe_fixture.py     (needs python3-sentencepiece)
"""
import collections
import json
import pathlib
import re
import sys

MERGES = 600
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
MULTILINGUAL = """\
The quick brown fox jumps over the lazy dog. It's 12:30, we'll be late!
Der schnelle braune Fuchs springt über den faulen Hund. Größe, Straße, Äpfel.
Le renard brun rapide saute par-dessus le chien paresseux. Où est l'été ? Déjà vu.
Быстрая коричневая лиса перепрыгивает через ленивую собаку. Привет, мир!
Η γρήγορη καφέ αλεπού πηδά πάνω από το τεμπέλικο σκυλί.
敏捷的棕色狐狸跳过了懒狗。你好，世界！今天天气很好。
素早い茶色の狐がのろまな犬を飛び越える。こんにちは、世界。
الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم
तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है। नमस्ते दुनिया
😀 😂 🎉 👍 ❤️ 🚀 emoji and text, 2024-06-01, 3.14159, $100.
"""


def bytes_to_unicode():
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest for U+0100 onwards."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def train(text):
    table = bytes_to_unicode()
    # A rough pre-tokenization (Python's re has no \p{L}); the tokenizer itself uses QWEN2_PATTERN.
    words = collections.Counter(re.findall(r"'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+|\d| ?[^\s\w]+|\s+", text))
    split = {w: [table[b] for b in w.encode("utf-8")] for w in words}
    vocab = [table[b] for b in range(256)]
    merges = []
    for _ in range(MERGES):
        pairs = collections.Counter()
        for w, count in words.items():
            symbols = split[w]
            for a, b in zip(symbols, symbols[1:]):
                pairs[a, b] += count
        if not pairs:
            break
        best = max(pairs.items(), key=lambda item: (item[1], item[0]))[0]
        merges.append(best)
        vocab.append(best[0] + best[1])
        for w in words:
            symbols, out, i = split[w], [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            split[w] = out
    return vocab, merges


def llama2_fixture(text, out):
    import io
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text.splitlines()), model_writer=model, model_type="bpe", vocab_size=700,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, byte_fallback=True, normalization_rule_name="identity",
        remove_extra_whitespaces=False, add_dummy_prefix=True, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.9995, num_threads=1, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    # transformers' SentencePieceExtractor: every split of a piece into two pieces of the vocabulary
    # is a merge, ranked by the merged piece's score, best first.
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece)) if piece[:i] in vocab and piece[i:] in vocab]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    merges.sort(key=lambda m: m[2], reverse=True)
    special = [{"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i in (0, 1, 2)]
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": special,
        "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                           {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None, "post_processor": None,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": [f"{a} {b}" for a, b, _ in merges]},
    }
    config = {"tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False, "legacy": True}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.model").write_bytes(model.getvalue())
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {out}: {len(vocab)} pieces, {len(merges)} merges")


def main():
    text = pathlib.Path("/usr/share/common-licenses/GPL-3").read_text() + MULTILINGUAL * 20
    llama2_fixture(text, pathlib.Path("tests/data/fixtures/llama2_tokenizer"))
    out = pathlib.Path("tests/data/fixtures/qwen2_tokenizer")
    vocab, merges = train(text)
    ids = {token: i for i, token in enumerate(vocab)}
    added = []
    for content, special, normalized, lstrip in [("<|endoftext|>", True, False, False), ("<|im_start|>", True, False, False),
                                                 ("<|im_end|>", True, False, False), ("<mask>", True, False, True),
                                                 ("<extra_word>", False, True, False)]:
        added.append({"id": len(vocab) + len(added), "content": content, "single_word": False, "lstrip": lstrip,
                      "rstrip": False, "normalized": normalized, "special": special})
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_PATTERN}, "behavior": "Isolated", "invert": False}, byte_level]},
        "post_processor": dict(byte_level), "decoder": dict(byte_level),
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": ids, "merges": [f"{a} {b}" for a, b in merges]},
    }
    config = {"tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|endoftext|>", "bos_token": None,
              "pad_token": "<|endoftext|>", "clean_up_tokenization_spaces": False}
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False, indent=1) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    print(f"wrote {out}: {len(vocab)} tokens, {len(merges)} merges, {len(added)} added tokens")


if __name__ == "__main__":
    main()
