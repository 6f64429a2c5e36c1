"""Trains the demo models' BPE tokenizer (models/README.md) with HF `tokenizers` on the KJV training text and
writes it in the exact shape of Gemma's tokenizer.json (spec §2.3, §3.1): normalizer Replace(" " -> "▁"),
pre_tokenizer Split(" ", MergedWithPrevious) (a no-op after the normalizer, as in Gemma), a BPE model with
byte_fallback and unk "<unk>", post_processor TemplateProcessing that prepends <bos>, decoder
Sequence[Replace("▁" -> " "), ByteFallback, Fuse].

Ids: 0 <pad>, 1 <eos>, 2 <bos>, 3 <unk>, 4..15 the Gemma 4 chat/tool markers (special added tokens),
16..271 the byte tokens <0x00>..<0xFF>, then the learned alphabet and merges up to 4096 ids in all.

Merges are learned inside words only (training pre-tokenizer: split before "▁" and isolate newline runs,
like sentencepiece's whitespace splitting). No learned merge can then join across a word start, so Gemma's
non-splitting pre-tokenizer gives exactly the same tokens; the script asserts that on sample lines, and that
text round-trips through encode/decode. Usage: python train_tokenizer.py --data .cache/train --out DIR
"""

import argparse
import json
import os
import sys
import time

from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from demo_common import BOS_ID, CHAT_TOKENS, EOS_ID, PAD_ID, UNK_ID, VOCAB, log, read_chapters  # noqa: E402

MARKER = "\u2581"  # "▁"
SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>"] + CHAT_TOKENS
N_FIXED = len(SPECIALS) + 256  # specials + byte tokens
# Characters always in the base vocabulary (printable ASCII, tab, newline), so chat formatting and digits do
# not need byte fallback although the KJV has no digits.
INITIAL_ALPHABET = [chr(c) for c in range(0x21, 0x7F)] + [MARKER, "\n", "\t"]


def train_raw(texts):
    """BPE over the training text with sentencepiece-like word splitting; returns the trained Tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", MARKER)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex("\n+"), "isolated"),
        pre_tokenizers.Split(MARKER, "merged_with_next"),
    ])
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - N_FIXED, min_frequency=2, show_progress=False, special_tokens=[],
        initial_alphabet=INITIAL_ALPHABET,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def merges_as_pairs(merges):
    """tokenizers writes merges as ["a", "b"] pairs (>= 0.20) or "a b" strings (older)."""
    out = []
    for m in merges:
        if isinstance(m, str):
            a, b = m.split(" ", 1)
            out.append([a, b])
        else:
            out.append([m[0], m[1]])
    return out


def gemma_tokenizer_json(raw):
    """The final tokenizer.json object: fixed ids first, then the trained vocabulary shifted by N_FIXED."""
    model = json.loads(raw.to_str())["model"]
    trained = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    if len(trained) > VOCAB - N_FIXED:
        sys.exit(f"trainer returned {len(trained)} tokens, more than {VOCAB - N_FIXED}")
    vocab = {}
    for i, s in enumerate(SPECIALS):
        vocab[s] = i
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(SPECIALS) + b
    remap = {}
    for tok_str, old_id in trained:
        if tok_str in vocab:
            sys.exit(f"trained token {tok_str!r} collides with a fixed token")
        remap[old_id] = len(vocab)
        vocab[tok_str] = len(vocab)
    unused = []
    while len(vocab) < VOCAB:  # only if the trainer stopped early: pad like Gemma's <unusedN>
        name = f"<unused{len(unused)}>"
        unused.append(name)
        vocab[name] = len(vocab)
    merges = [m for m in merges_as_pairs(model["merges"]) if m[0] in vocab and m[1] in vocab and m[0] + m[1] in vocab]

    def added(i, content, special):
        return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": special}

    added_tokens = [added(i, s, True) for i, s in enumerate(SPECIALS)]
    added_tokens += [added(vocab[u], u, False) for u in unused]
    obj = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": {"type": "Replace", "pattern": {"String": " "}, "content": MARKER},
        "pre_tokenizer": {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                          "invert": False},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<bos>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<bos>": {"id": "<bos>", "ids": [BOS_ID], "tokens": ["<bos>"]}},
        },
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": MARKER}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ]},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    return obj, remap, len(unused)


def check(final, raw, remap, sample_lines):
    """Asserts the properties tandem and the training scripts rely on."""
    assert final.get_vocab_size(with_added_tokens=True) == VOCAB, final.get_vocab_size(with_added_tokens=True)
    for i, s in enumerate(SPECIALS):
        assert final.token_to_id(s) == i, (s, final.token_to_id(s))
    assert (final.token_to_id("<pad>"), final.token_to_id("<eos>"), final.token_to_id("<bos>"),
            final.token_to_id("<unk>")) == (PAD_ID, EOS_ID, BOS_ID, UNK_ID)
    for b in (0, 0x41, 0xFF):
        assert final.token_to_id(f"<0x{b:02X}>") == len(SPECIALS) + b
    ids = set()
    for i in range(VOCAB):
        assert final.id_to_token(i) is not None, f"id {i} has no token"
        ids.add(final.id_to_token(i))
    assert len(ids) == VOCAB, "duplicate token strings"

    # Same segmentation as the word-splitting tokenizer the merges were learned with (expected by construction;
    # a difference would not break anything, since all text is encoded with the final tokenizer, so: warn).
    differ = [line for line in sample_lines
              if final.encode(line).ids != [BOS_ID] + [remap[i] for i in raw.encode(line).ids]]
    if differ:
        log(f"WARNING: {len(differ)} of {len(sample_lines)} lines segment differently than at training time, "
            f"e.g. {differ[0][:60]!r}: {final.encode(differ[0]).tokens[:20]}")

    extra = ["Hello, world! 123 + 456 = 579", "  two  spaces  and a tab\there ", "user\nHi there\n\nmodel\n",
             "na\u00efve caf\u00e9 \u2014 \u201cquotes\u201d \u65e5\u672c\u8a9e \U0001F642", "<|turn>user\nIn the beginning<turn|>\n"]
    for text in list(sample_lines) + extra:
        enc = final.encode(text)
        assert enc.ids[0] == BOS_ID, "the post-processor must prepend <bos>"
        assert UNK_ID not in enc.ids, f"<unk> in the encoding of {text[:60]!r}"
        back = final.decode(enc.ids, skip_special_tokens=False)
        assert back == "<bos>" + text, f"round trip failed: {text!r} -> {back!r}"
        if "<|" not in text:
            assert final.decode(enc.ids, skip_special_tokens=True) == text
    marked = final.encode("<|turn>user\nIn the beginning<turn|>\n").ids
    assert marked[:2] == [BOS_ID, final.token_to_id("<|turn>")] and final.token_to_id("<turn|>") in marked
    assert final.encode("\u00e9").tokens[1:] == ["<0xC3>", "<0xA9>"], final.encode("\u00e9").tokens


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--data", required=True, help="folder with kjv.txt and heldout.txt")
    ap.add_argument("--out", required=True, help="folder to write tokenizer.json and tokenizer_config.json")
    a = ap.parse_args()
    import tokenizers
    log(f"tokenizers {tokenizers.__version__}")

    t0 = time.time()
    train_ch = read_chapters(os.path.join(a.data, "kjv.txt"))
    held_ch = read_chapters(os.path.join(a.data, "heldout.txt"))
    raw = train_raw(train_ch)
    log(f"trained BPE on {len(train_ch)} chapters: {raw.get_vocab_size()} tokens in {time.time() - t0:.1f} s")

    obj, remap, n_unused = gemma_tokenizer_json(raw)
    final = Tokenizer.from_str(json.dumps(obj, ensure_ascii=False))
    lines = [v for ch in train_ch[::23] + held_ch for v in ch.split("\n")][:3000]
    check(final, raw, remap, lines)

    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "tokenizer.json")
    final.save(path, pretty=True)
    reloaded = Tokenizer.from_file(path)
    check(reloaded, raw, remap, lines[:500])
    cfg = {
        "tokenizer_class": "GemmaTokenizer",
        "bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>",
        "add_bos_token": True, "add_eos_token": False,
        "padding_side": "left", "model_max_length": 4096,
        "clean_up_tokenization_spaces": False, "spaces_between_special_tokens": False,
        "extra_special_tokens": {},
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")

    n_tok = sum(len(e.ids) for e in reloaded.encode_batch(held_ch))
    n_words = sum(len(ch.split()) for ch in held_ch)
    sample = reloaded.encode(held_ch[0].split("\n")[0])
    log(f"tokenizer.json: {VOCAB} ids ({len(SPECIALS)} special, 256 bytes, {len(obj['model']['merges'])} merges, "
        f"{n_unused} unused), {os.path.getsize(path)} bytes")
    log(f"held-out: {n_tok} tokens for {n_words} words ({n_tok / n_words:.2f} tokens/word)")
    log(f"sample: {sample.tokens[:24]}")
    log(f"tokenizer OK in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    main()
