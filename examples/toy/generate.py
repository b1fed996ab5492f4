#!/usr/bin/env python3
"""Writes the toy sentiment data used by the example configs and the trainer tests.

Deterministic (fixed seed, standard library only). Sentences are built from two small word lists
with a shared filler vocabulary, so the task is learnable by a tiny model in a few hundred
updates; `public.csv` is a disjoint set of unlabelled-style sentences of the same format (used
only for routing statistics and layer selection).
Run: python3 examples/toy/generate.py  (rewrites train.csv, valid.csv, test.csv, public.csv)
"""
import csv
import os
import random

# The cue words of the two classes use disjoint letters, so that even a model that only sees
# bytes (the data-independent tokenizer) separates them after a few dozen updates.
POS = ["ace", "glad", "ideal", "chef", "acme", "lime", "gleam", "aided"]
NEG = ["rusty", "worst", "stony", "sour", "turn", "knot", "porky", "snout"]
FILL = ["the", "film", "was", "a", "with", "and", "very", "so"]


def sentence(rng, label):
    words = [rng.choice(FILL) for _ in range(rng.randint(1, 3))]
    cue = POS if label == "positive" else NEG
    for _ in range(rng.randint(2, 4)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(cue))
    return " ".join(words)


def write(path, rows, header):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(20261130)
    def rows(n):
        out = []
        for _ in range(n):
            label = rng.choice(["positive", "negative"])
            out.append((sentence(rng, label), label))
        return out
    write(os.path.join(here, "train.csv"), rows(600), ["text", "label"])
    write(os.path.join(here, "valid.csv"), rows(200), ["text", "label"])
    write(os.path.join(here, "test.csv"), rows(200), ["text", "label"])
    write(os.path.join(here, "public.csv"), [(t,) for t, _ in rows(300)], ["text"])


if __name__ == "__main__":
    main()
