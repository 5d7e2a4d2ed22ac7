#!/usr/bin/env python3
"""The pages and the program agree (ctest `house.docs_help`):

1. every option `dspark COMMAND --help` prints appears on one of the pages that document that
   command (PAGES; docs/commands.md, docs/data.md and docs/compute.md for all);
2. every option the command pages name (COMMAND_PAGES) is an option of some command, so a page
   cannot keep an option that was renamed or removed. Other pages (performance, benchmark
   scripts, MPI, CUDA) name options of other programs and are not read.

Usage: test_docs_help.py --dspark path/to/dspark --root REPO
Exits 1 naming each option and page that disagree."""
import argparse
import os
import re
import subprocess
import sys

COMMON = ["commands.md", "data.md", "compute.md"]
PAGES = {
    "train": ["training.md", "caches.md"],
    "pretrain": ["distillation.md", "training.md"],
    "distill": ["distillation.md", "training.md", "caches.md"],
    "capture": ["caches.md"], "inspect": ["caches.md"],
    "regenerate": ["speculative-decoding.md"], "speculate": ["speculative-decoding.md"],
    "calibrate": ["speculative-decoding.md"], "profile": ["speculative-decoding.md"],
    "plot": ["speculative-decoding.md"],
    "export": ["file-formats.md"],
    "draft-forward": ["training.md"], "loss": ["training.md"], "kd-loss": ["distillation.md"],
}
COMMAND_PAGES = ["commands.md", "training.md", "distillation.md", "caches.md", "speculative-decoding.md"]
OPTION = re.compile(r"(?<![\w-])--[a-z0-9][a-z0-9-]*")


def options(text):
    return set(OPTION.findall(text)) - {"--help"}


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--root", required=True)
    args = ap.parse_args()
    top = subprocess.run([args.dspark, "--help"], capture_output=True, text=True, check=True).stdout
    commands = re.findall(r"^  ([a-z][a-z-]+)\s{2,}\S", top, re.M)
    if len(commands) < 10:
        print(f"`dspark --help` lists {len(commands)} commands: the list was not understood")
        return 1
    docs = {}
    for name in os.listdir(os.path.join(args.root, "docs")):
        if name.endswith(".md"):
            with open(os.path.join(args.root, "docs", name), encoding="utf-8") as f:
                docs[name] = f.read()
    problems = []
    every = set()
    for cmd in commands:
        h = subprocess.run([args.dspark, cmd, "--help"], capture_output=True, text=True)
        if h.returncode != 0:
            problems.append(f"`dspark {cmd} --help` exited {h.returncode}")
            continue
        opts = options(h.stdout)
        every |= opts
        pages = PAGES.get(cmd, []) + COMMON
        documented = set().union(*(options(docs.get(p, "")) for p in pages))
        for o in sorted(opts - documented):
            problems.append(f"dspark {cmd} {o}: printed by --help, on none of {', '.join('docs/' + p for p in pages)}")
    for page in COMMAND_PAGES:
        for o in sorted(options(docs.get(page, "")) - every):
            problems.append(f"docs/{page} names {o}, which no command's --help prints")
    for p in problems:
        print(p)
    print(f"docs_help: {len(commands)} commands, {len(every)} options, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
