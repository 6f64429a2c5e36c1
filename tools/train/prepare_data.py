"""Splits the `bible -f` dump of the KJV (lines like "Ge1:1 In the beginning ...") into the demo models'
training and held-out text (models/README.md). Standard library only; called by prepare_data.sh.

Output format: one verse a line, chapters separated by one blank line, no labels. Every 40th chapter (index
mod 40 == 20 over the whole Bible, 1189 chapters) is held out. The held-out prompts are the first 8-12 words
of 20 evenly spread held-out verses of at least 16 words.
"""

import argparse
import os
import re
import sys

LABEL = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
HELDOUT_EVERY = 40
HELDOUT_PHASE = 20
N_PROMPTS = 20


def read_chapters(raw_path):
    """[(book, chapter, [verse text, ...]), ...] in Bible order."""
    chapters = []
    key = None
    with open(raw_path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            m = LABEL.match(line)
            if not m:
                sys.exit(f"{raw_path}:{n}: unexpected line (no verse label): {line[:80]!r}")
            book, chap, text = m.group(1), int(m.group(2)), m.group(4)
            text = " ".join(text.split())  # collapse any double spaces
            if (book, chap) != key:
                key = (book, chap)
                chapters.append((book, chap, []))
            chapters[-1][2].append(text)
    return chapters


def write_text(path, chapters):
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n\n".join("\n".join(verses) for _, _, verses in chapters))
        f.write("\n")


def pick_prompts(heldout):
    verses = [v for _, _, vs in heldout for v in vs if len(v.split()) >= 16]
    if len(verses) < N_PROMPTS:
        sys.exit(f"only {len(verses)} long held-out verses")
    step = len(verses) / N_PROMPTS
    prompts = []
    for i in range(N_PROMPTS):
        words = verses[int(i * step + step / 2)].split()
        prompts.append(" ".join(words[: 8 + i % 5]))
    return prompts


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--raw", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--prompts", required=True)
    a = ap.parse_args()

    chapters = read_chapters(a.raw)
    n_verses = sum(len(v) for _, _, v in chapters)
    if len(chapters) != 1189 or n_verses != 31102:
        sys.exit(f"expected 1189 chapters / 31102 verses, got {len(chapters)} / {n_verses}")
    train = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY != HELDOUT_PHASE]
    heldout = [c for i, c in enumerate(chapters) if i % HELDOUT_EVERY == HELDOUT_PHASE]

    write_text(os.path.join(a.out, "kjv.txt"), train)
    write_text(os.path.join(a.out, "heldout.txt"), heldout)
    prompts = pick_prompts(heldout)
    with open(a.prompts, "w", encoding="utf-8") as f:
        f.write("\n".join(prompts) + "\n")

    def words(cs):
        return sum(len(v.split()) for _, _, vs in cs for v in vs)

    print(f"train: {len(train)} chapters, {words(train)} words -> {os.path.join(a.out, 'kjv.txt')}")
    print(f"held-out: {len(heldout)} chapters ({', '.join(f'{b}{c}' for b, c, _ in heldout[:6])}, ...), "
          f"{words(heldout)} words -> {os.path.join(a.out, 'heldout.txt')}")
    print(f"{len(prompts)} prompts -> {a.prompts}")


if __name__ == "__main__":
    main()
