#!/usr/bin/python3
"""Regenerates data/corpus.txt, the bundled training text of `memfit train`.

The corpus is memfit's own prose: the README and the comments of its C++ sources (the
contracts at the top of every header, the why-comments in the sources), so the project can
ship it with no licence question and the main job trains with no download. Deterministic:
files in sorted order, comment markers stripped, capped at --max-bytes.

  /usr/bin/python3 scripts/make_corpus.py            # writes data/corpus.txt
"""
import argparse
import pathlib
import re
import subprocess

ROOT = pathlib.Path(__file__).resolve().parent.parent
FOLDERS = ("memory", "profiler", "core", "policies", "cli", "examples")


def comment_text(source: str) -> str:
    """The // comment lines of a C++ file as prose paragraphs."""
    out, para = [], []
    for line in source.splitlines():
        m = re.match(r"\s*//+ ?(.*)$", line)
        if m and not line.lstrip().startswith("// NOLINT"):
            para.append(m.group(1).rstrip())
        elif para:
            out.append("\n".join(para).strip("\n"))
            para = []
    if para:
        out.append("\n".join(para).strip("\n"))
    return "\n\n".join(p for p in out if p.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "data" / "corpus.txt"))
    ap.add_argument("--max-bytes", type=int, default=400 * 1024)
    args = ap.parse_args()
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, check=True, capture_output=True,
                             text=True).stdout.split()
    parts = [(ROOT / "README.md").read_text(encoding="utf-8")]
    for rel in sorted(tracked):
        if rel.split("/")[0] in FOLDERS and rel.endswith((".h", ".cpp", ".cu")):
            text = comment_text((ROOT / rel).read_text(encoding="utf-8"))
            if text:
                parts.append(f"== {rel} ==\n\n{text}")
    corpus = "\n\n".join(parts) + "\n"
    data = corpus.encode("utf-8")[: args.max_bytes]
    pathlib.Path(args.out).write_bytes(data)
    print(f"{args.out}: {len(data)} bytes from {len(parts)} files")


if __name__ == "__main__":
    main()
