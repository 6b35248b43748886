"""Write the fuzz seed corpus: tests/fuzz/seeds/ (GGUF files) and tests/fuzz/seeds-index/.

    python tests/fuzz/make_seeds.py          # rewrites both folders (deterministic output)

Valid tiny models (qwen3 / qwen3moe, with and without a tokenizer, ~5-16 KB each) and the
known-bad reproducers of issue 12 -- metadata of the wrong type, out-of-range ids, non-finite
floats, absurd counts -- each the valid model with one key changed (``craft.BAD``, also used
by tests/test_metadata_types.py), and tensor directories the weight binding must refuse
(``craft.BAD_TENSORS``). seeds-index/ holds index files that must be treated as
misses: the 5-byte ``marshal`` bombs (a tuple / list / string of 2**31 - 1 items), an empty
file and a GGUF header's first bytes; the harness adds the valid index the writer makes for its
model.
"""

from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from fuzz.craft import BAD, BAD_TENSORS, bad_model, bad_tensor_model, tiny_model  # noqa: E402


def main() -> None:
    seeds, index = os.path.join(HERE, "seeds"), os.path.join(HERE, "seeds-index")
    for d in (seeds, index):
        os.makedirs(d, exist_ok=True)
        for n in os.listdir(d):
            os.unlink(os.path.join(d, n))
    for arch in ("qwen3", "qwen3moe"):
        for tok in (True, False):
            with open(os.path.join(seeds, f"valid-{arch}{'' if tok else '-notok'}.gguf"),
                      "wb") as f:
                f.write(tiny_model(arch, tokenizer=tok).to_bytes())
    for name in BAD:
        g = bad_model(name)
        if BAD[name][2].startswith("tokenizer."):  # the tensors only make the seed bigger
            g.tensors = []
        with open(os.path.join(seeds, f"bad-{name}.gguf"), "wb") as f:
            f.write(g.to_bytes())
    for name in BAD_TENSORS:
        with open(os.path.join(seeds, f"bad-{name}.gguf"), "wb") as f:
            f.write(bad_tensor_model(name).to_bytes())
    for name, data in (("marshal-tuple-2g", b"(\xff\xff\xff\x7f"),
                       ("marshal-list-2g", b"[\xff\xff\xff\x7f"),
                       ("marshal-str-2g", b"s\xff\xff\xff\x7f"),
                       ("empty", b""), ("gguf-magic", b"GGUF\x03\x00\x00\x00")):
        with open(os.path.join(index, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
