#!/usr/bin/env python3
"""The sets of docs/results/one-command.md, cut from the corpora that `cargo xtask setup --data`
writes under <cache>/data/<corpus>/{public,train,validation}.tsv (rows already in a keyed-hash
order, so the first rows are a fixed, content-independent subset):

- selection (the learning-rate candidates of the rule): rotten-tomatoes-public: the first 1,000
  rows of Rotten Tomatoes' public split to train, validation rows 401-800 to score (file order;
  that corpus's rows mix their labels);
- checks: rotten-tomatoes: rows 1-1,000 of the train split, validation rows 1-400;
  crowdflower: the same cut of CrowdFlower (sentiment), both taken in the order of the SHA-256
  of each row's text (the corpora's files keep their source's row order, and CrowdFlower's
  source is sorted by label: its first 1,000 rows are all `negative`).

The selection and the checks share no record. Written to <cache>/data/one-command-methods/<set>/
{train,validation}.tsv; nothing is committed.

Usage: python3 scripts/one_command_sets.py [<cache dir>]
"""

import hashlib
import os
import sys
from pathlib import Path

# name: (corpus, split, training rows, validation rows, rows in the order of their text's SHA-256)
SETS = {
    "rotten-tomatoes-public": ("rotten-tomatoes", "public", (0, 1000), (400, 800), False),
    "rotten-tomatoes": ("rotten-tomatoes", "train", (0, 1000), (0, 400), True),
    "crowdflower": ("crowdflower", "train", (0, 1000), (0, 400), True),
}


def cache_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("RAPTOR_CACHE_DIR"):
        return Path(os.environ["RAPTOR_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "raptor"
    return Path.home() / ".cache" / "raptor"


def cut(src, rows, dst, hashed):
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    if hashed:
        body.sort(key=lambda l: hashlib.sha256(l.split("\t", 1)[0].encode("utf-8")).digest())
    a, b = rows
    if len(body) < b:
        sys.exit(f"{src} has {len(body)} rows, fewer than {b}")
    dst.write_text(header + "".join(body[a:b]), encoding="utf-8")


def main():
    cache = cache_dir()
    for name, (corpus, split, train_rows, valid_rows, hashed) in SETS.items():
        d = cache / "data" / corpus
        if not (d / f"{split}.tsv").exists():
            sys.exit(f"{d}/{split}.tsv is missing: run `cargo xtask setup --data` first")
        out = cache / "data" / "one-command-methods" / name
        out.mkdir(parents=True, exist_ok=True)
        cut(d / f"{split}.tsv", train_rows, out / "train.tsv", hashed)
        cut(d / "validation.tsv", valid_rows, out / "validation.tsv", hashed)
        print(f"{name}: {out}")


if __name__ == "__main__":
    main()
