"""Write reflex_core/tokenizer/unicode_classes.py: the code points of the Unicode general
categories L, N, M, P and S as llama.cpp's tokenizer knows them (the flags table of its
``src/unicode-data.cpp``), so that Reflex's pre-tokenizer regexes use llama.cpp's Unicode
version rather than the one of the ``tokenizers`` package's regex engine.

    python scripts/gen_unicode_classes.py PATH/TO/unicode-data.cpp
    python scripts/gen_unicode_classes.py PATH/TO/llama_cpp_python-0.3.36.tar.gz

Reads the table's ``{start, flags}`` rows (each runs to the next row's start) and the flag bits
of ``src/unicode.h`` (NUMBER 0x2, LETTER 0x4, ACCENT_MARK 0x10, PUNCTUATION 0x20, SYMBOL 0x40).
"""

from __future__ import annotations

import re
import sys
import tarfile
from pathlib import Path

BITS = {"L": 0x4, "N": 0x2, "M": 0x10, "P": 0x20, "S": 0x40}
OUT = Path(__file__).resolve().parent.parent / "reflex_core" / "tokenizer" / "unicode_classes.py"
N_CODE_POINTS = 0x110000


def read_table(text: str) -> list[tuple[int, int]]:
    start = text.index("unicode_ranges_flags")
    body = text[start:text.index("};", start)]
    rows = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-Fa-f]+), 0x([0-9A-Fa-f]+)\}",
                                                            body)]
    if not rows or rows[0][0] != 0 or any(a >= b for (a, _), (b, _) in zip(rows, rows[1:])):
        raise SystemExit("unicode_ranges_flags: not an ascending table from 0")
    return rows


def ranges(rows: list[tuple[int, int]], bit: int) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    ends = [s for s, _ in rows[1:]] + [N_CODE_POINTS]
    for (s, flags), end in zip(rows, ends):
        if flags & bit:
            if out and out[-1][1] == s - 1:
                out[-1] = (out[-1][0], end - 1)
            else:
                out.append((s, end - 1))
    return out


def source_text(path: Path) -> str:
    if path.suffix == ".cpp":
        return path.read_text()
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers()
                      if m.name.endswith("vendor/llama.cpp/src/unicode-data.cpp"))
        return tar.extractfile(member).read().decode()


def main() -> None:
    src = Path(sys.argv[1])
    rows = read_table(source_text(src))
    lines = [
        '"""The Unicode general categories L, N, M, P and S as llama.cpp 0.3.36\'s tokenizer knows',
        "them (its src/unicode-data.cpp: Unicode 15.1), as space-separated hex ranges. Written by",
        'scripts/gen_unicode_classes.py; tokenizer/pretokenizers.py puts them in place of \\\\p{..}."""',
        "",
        "CLASSES = {",
    ]
    for cat, bit in BITS.items():
        rs = " ".join(f"{a:X}" if a == b else f"{a:X}-{b:X}" for a, b in ranges(rows, bit))
        lines.append(f'    "{cat}": (')
        words = rs.split(" ")
        line = ""
        for w in words:
            if len(line) + len(w) + 1 > 88:
                lines.append(f'        "{line}"')
                line = ""
            line += w + " "
        lines.append(f'        "{line.rstrip()}"')
        lines.append("    ),")
    lines.append("}")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
