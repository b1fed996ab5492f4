#!/usr/bin/env python3
"""The sets of docs/results/one-command.md, cut from the corpora that `cargo xtask setup --data`
writes under <cache>/data/<corpus>/{public,train,validation}.tsv (rows already in a keyed-hash
order, so the first rows are a fixed, content-independent subset):

- selection (the learning-rate candidates of the rule): rotten-tomatoes-public: the first 1,000
  rows of Rotten Tomatoes' public split to train, validation rows 401-800 to score;
- checks: rotten-tomatoes: the first 1,000 rows of the train split, validation rows 1-400;
  crowdflower: the same cut of CrowdFlower (emotions).

The selection and the checks share no record. Written to <cache>/data/one-command-methods/<set>/
{train,validation}.tsv; nothing is committed.

Usage: python3 scripts/one_command_sets.py [<cache dir>]
"""

import os
import sys
from pathlib import Path

SETS = {
    "rotten-tomatoes-public": ("rotten-tomatoes", "public", (0, 1000), (400, 800)),
    "rotten-tomatoes": ("rotten-tomatoes", "train", (0, 1000), (0, 400)),
    "crowdflower": ("crowdflower", "train", (0, 1000), (0, 400)),
}


def cache_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("RAPTOR_CACHE_DIR"):
        return Path(os.environ["RAPTOR_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "raptor"
    return Path.home() / ".cache" / "raptor"


def cut(src, rows, dst):
    lines = src.read_text(encoding="utf-8").splitlines(keepends=True)
    header, body = lines[0], lines[1:]
    a, b = rows
    if len(body) < b:
        sys.exit(f"{src} has {len(body)} rows, fewer than {b}")
    dst.write_text(header + "".join(body[a:b]), encoding="utf-8")


def main():
    cache = cache_dir()
    for name, (corpus, split, train_rows, valid_rows) in SETS.items():
        d = cache / "data" / corpus
        if not (d / f"{split}.tsv").exists():
            sys.exit(f"{d}/{split}.tsv is missing: run `cargo xtask setup --data` first")
        out = cache / "data" / "one-command-methods" / name
        out.mkdir(parents=True, exist_ok=True)
        cut(d / f"{split}.tsv", train_rows, out / "train.tsv")
        cut(d / "validation.tsv", valid_rows, out / "validation.tsv")
        print(f"{name}: {out}")


if __name__ == "__main__":
    main()
