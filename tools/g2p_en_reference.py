#!/usr/bin/env python3
"""ARPAbet from g2p-en's own neural model (its `predict`, numpy) for words out of every
lexicon: the fixture kiln's port is tested against.

    pip install g2p-en==2.1.0 nltk
    g2p_en_reference.py crates/kiln-text/tests/fixtures/g2p_en_reference.json

Only the model is used (no CMUdict, no tagger), so nothing is downloaded at run time.
"""
import json
import sys

from g2p_en.g2p import G2p

WORDS = [
    "activationist", "zyzzyva", "kiln", "smartwatch", "blorptastic", "quokka", "frobnicate",
    "tensorflow", "brexit", "onnx", "kubernetes", "grapheme", "phoneme", "whisperer",
    "cafe", "naive", "jalapeno", "schadenfreude", "gnocchi", "worcestershire", "xylograph",
    "yottabyte", "zeitgeist", "mcdonald", "oconnor", "aaa", "z", "ab",
]


def main():
    g = G2p.__new__(G2p)
    g.graphemes = ["<pad>", "<unk>", "</s>"] + list("abcdefghijklmnopqrstuvwxyz")
    # The phoneme list and index maps exactly as the package's constructor sets them.
    init = G2p.__init__.__code__
    g.phonemes = [c for c in init.co_consts if isinstance(c, tuple) and "AA0" in c]
    if g.phonemes:
        g.phonemes = ["<pad>", "<unk>", "<s>", "</s>"] + list(g.phonemes[0])
    else:
        raise SystemExit("g2p-en's phoneme list not found")
    g.g2idx = {x: i for i, x in enumerate(g.graphemes)}
    g.idx2g = {i: x for i, x in enumerate(g.graphemes)}
    g.p2idx = {x: i for i, x in enumerate(g.phonemes)}
    g.idx2p = {i: x for i, x in enumerate(g.phonemes)}
    g.load_variables()
    out = {w: g.predict(w) for w in WORDS}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
