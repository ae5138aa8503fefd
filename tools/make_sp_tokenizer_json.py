#!/usr/bin/python3
# Builds the SentencePiece-style test tokenizer of tests/golden/tokenizer_json/llama2_style: trains
# a small BPE model with byte fallback with Google's sentencepiece library (Debian's
# python3-sentencepiece) on Tiny Shakespeare plus a few lines of accented, Cyrillic and Japanese
# text, with the options Llama 2's tokenizer.model was trained with (identity normalization, a
# dummy "▁" prefix, extra whitespace kept, digits split, byte fallback), and writes the
# tokenizer.json that Hugging Face's LlamaConverter (transformers, legacy=True, as on the Hub for
# Llama 2, TinyLlama and Mistral 7B v0.1) makes of such a model: the vocabulary in piece order,
# merges from every split of a piece into two pieces, ordered by the piece's score, "<unk>",
# "<s>", "</s>" as special added tokens, the Prepend + Replace normalizer, no pre-tokenizer, a
# "<s>" TemplateProcessing and the Replace/ByteFallback/Fuse/Strip decoder.
#   train  <shared data dir> <out dir>        writes <out dir>/tokenizer.json and tokenizer.model
#   encode <tokenizer.model> <texts.json>     prints what sentencepiece itself gives each text
#                                             (a JSON list of id lists), for the cross-check in
#                                             tools/make_tokenizer_json_golden.sh
# Deterministic (one training thread, no sampling): rerunning it writes the same bytes.
# Usage: /usr/bin/python3 tools/make_sp_tokenizer_json.py train|encode ...
import json
import os
import sys

import sentencepiece as spm

VOCAB_SIZE = 1000
EXTRA = "café naïve résumé façade über Straße\n日本語のテキストです。\nПривет, мир!\n" * 40


def train(data_dir, out_dir):
    with open(os.path.join(data_dir, "tinyshakespeare.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n") + EXTRA.split("\n")
    model_path = os.path.join(out_dir, "tokenizer.model")
    with open(model_path, "wb") as model:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=VOCAB_SIZE, model_type="bpe",
            byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
            remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
            character_coverage=1.0, num_threads=1, shuffle_input_sentence=False, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = sp.get_piece_size()
    vocab = {sp.id_to_piece(i): i for i in range(n)}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(n)}
    # Every split of a piece into two pieces is a merge; merges are ordered by the merged piece's
    # score (higher first; the sort is stable), a piece's splits by the ids of their halves.
    merges = []
    for piece in vocab:
        local = [(piece[:k], piece[k:], scores[piece]) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: m[2], reverse=True)

    def special(i):
        return {"id": i, "content": sp.id_to_piece(i), "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True}

    bos = sp.id_to_piece(sp.bos_id())
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [special(sp.unk_id()), special(sp.bos_id()), special(sp.eos_id())],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "\u2581"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [sp.bos_id()], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": None, "unk_token": sp.id_to_piece(sp.unk_id()),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": True,
                  "byte_fallback": True, "ignore_merges": False, "vocab": vocab,
                  "merges": [f"{a} {b}" for a, b, _ in merges]},
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"[make_sp_tokenizer_json] {n} pieces, {len(merges)} merges; wrote {out_dir}/tokenizer.json", file=sys.stderr)


def encode(model_path, texts_path):
    sp = spm.SentencePieceProcessor(model_file=model_path)
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    print(json.dumps([sp.encode(t) for t in texts]))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "train":
        train(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "encode":
        encode(sys.argv[2], sys.argv[3])
    else:
        sys.exit("usage: make_sp_tokenizer_json.py train <shared data dir> <out dir> | encode <tokenizer.model> <texts.json>")
