#!/usr/bin/env python3
"""The pages and the program agree (ctest `house.docs_help`):

1. every option `dspark COMMAND --help` prints appears on one of the pages that document that
   command (PAGES; docs/commands.md, docs/data.md and docs/compute.md for all);
2. every option the command pages name (COMMAND_PAGES) is an option of some command, so a page
   cannot keep an option that was renamed or removed. Other pages (performance, benchmark
   scripts, MPI, CUDA) name options of other programs and are not read;
3. every script that the README or a page shows run by its path (a command line in a code block
   that starts with scripts/ or bench/, after any VAR=value) is executable in the checkout, so
   the command works as written on a fresh clone.

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
RUN_BY_PATH = re.compile(r"\s*(?:[A-Za-z_]\w*=\S+\s+)*((?:scripts|bench)/[\w./-]+)")


def options(text):
    return set(OPTION.findall(text)) - {"--help"}


def scripts_run_by_path(root):
    """(page, script) for every command line of a code block (fenced, or indented 4 spaces) of
    the README and docs/ that runs a script of the repository by its path."""
    pages = ["README.md"] + ["docs/" + n for n in sorted(os.listdir(os.path.join(root, "docs"))) if n.endswith(".md")]
    found = []
    for page in pages:
        fenced = False
        with open(os.path.join(root, page), encoding="utf-8") as f:
            for line in f:
                if line.startswith("```"):
                    fenced = not fenced
                    continue
                if fenced or line.startswith("    "):
                    m = RUN_BY_PATH.match(line)
                    if m:
                        found.append((page, m.group(1)))
    return found


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
    runs = scripts_run_by_path(args.root)
    for page, script in runs:
        if not os.access(os.path.join(args.root, script), os.X_OK):
            problems.append(f"{page} runs {script} by its path, which is not executable (git update-index --chmod=+x)")
    if not runs:
        problems.append("no script run by its path found in README.md or docs/: the scan was not understood")
    for p in problems:
        print(p)
    print(f"docs_help: {len(commands)} commands, {len(every)} options, {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
