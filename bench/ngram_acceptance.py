"""What a draft would accept if it were an n-gram table: the target's greedy answers to the main
job's held-out prompts (`dspark generate --data eval-KIND.jsonl --print-ids`), and at each of
their positions the next token predicted by
- an n-gram table of the training answers (the cache's sequences, their loss-masked positions:
  the target's own answers), the longest context of at most `order` tokens seen in them, its most
  frequent next token (order 1: a bigram table);
- prompt lookup within the answer so far (the tokens that followed the latest earlier occurrence
  of the last 3, else 2 tokens; `speculate --lookup 2` also searches the prompt).
The share of positions predicted right is the slot-0 acceptance such a proposer would have under
greedy decoding, to set beside the trained draft's (`speculate --report`, accept_conditional[0]).

    $VENV/bin/python bench/ngram_acceptance.py --dspark build/release/dspark [--demo DIR] [--cache CACHE]
"""
import argparse
import glob
import os
import subprocess
from collections import Counter, defaultdict

from safetensors import safe_open


def cache_sequences(cache):
    """(ids, loss_mask) of every sequence of a `dspark capture` cache."""
    seqs = []
    for path in sorted(glob.glob(os.path.join(cache, "shard-*.safetensors"))):
        with safe_open(path, "pt") as f:
            ids, lengths, mask = (f.get_tensor(k).numpy() for k in ("input_ids", "lengths", "loss_mask"))
            for i in range(ids.shape[0]):
                seqs.append((ids[i, :lengths[i]].tolist(), mask[i, :lengths[i]].tolist()))
    return seqs


def ngram_tables(seqs, order):
    tables = [defaultdict(Counter) for _ in range(order + 1)]
    for ids, mask in seqs:
        for i in range(1, len(ids)):
            if mask[i]:
                for n in range(1, min(order, i) + 1):
                    tables[n][tuple(ids[i - n:i])][ids[i]] += 1
    return tables


def ngram_next(tables, context, order):
    for n in range(min(order, len(context)), 0, -1):
        seen = tables[n].get(tuple(context[-n:]))
        if seen:
            return seen.most_common(1)[0][0]
    return None


def lookup_run(ids, i, longest=4, shortest=2, most=7):
    """Prompt lookup within the answer as `speculate --lookup 2` runs it: the length m of the
    longest suffix (up to `longest` tokens) that occurred before position i, and up to `most`
    tokens that followed its latest occurrence; (0, []) when none did."""
    for m in range(longest, shortest - 1, -1):
        if i < m:
            continue
        for e in range(i - 1, m - 1, -1):
            if ids[e - m:e] == ids[i - m:i]:
                return m, ids[e:min(e + most, i)]
    return 0, []


def lookup_next(ids, i):
    """The token prompt lookup within the answer predicts at i (the last 3, else 2 tokens)."""
    _, p = lookup_run(ids, i, longest=3, most=1)
    return p[0] if p else None


def lookup_survival(answers, most=7):
    """Walks each answer as the decoding loop would with every lookup proposing `most` tokens:
    per match length m, the rounds and the share of them whose first k + 1 proposals were all
    accepted (survival at k)."""
    proposed, accepted = {}, {}
    for a in answers:
        i = 1
        while i < len(a):
            m, p = lookup_run(a, i, most=most)
            j = 0
            while j < len(p) and i + j < len(a) and p[j] == a[i + j]:
                j += 1
            if m:
                proposed.setdefault(m, [0] * most)
                accepted.setdefault(m, [0] * most)
                for k in range(len(p)):
                    proposed[m][k] += 1
                for k in range(j):
                    accepted[m][k] += 1
            i += j + 1
    return {m: (proposed[m][0], [accepted[m][k] / proposed[m][k] for k in range(most) if proposed[m][k]])
            for m in sorted(proposed)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dspark", required=True)
    ap.add_argument("--demo", default=os.environ.get("DSPARK_DEMO_DIR", os.path.expanduser("~/.cache/dspark/demo-smollm2")))
    ap.add_argument("--target", default=os.path.expanduser("~/.cache/dspark/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--cache", help="the training answers (default: the demo's cache)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--max-order", type=int, default=4)
    ap.add_argument("--lookup-survival", action="store_true",
                    help="also print prompt lookup's survival by the length of the suffix it matched")
    args = ap.parse_args()
    seqs = cache_sequences(args.cache or os.path.join(args.demo, "cache"))
    tables = ngram_tables(seqs, args.max_order)
    print(f"training answers: {len(seqs)} sequences, {sum(len(s) for s, _ in seqs)} tokens")
    print(f"{'kind':<10} {'positions':>9} " + " ".join(f"{'order ' + str(n):>8}" for n in range(1, args.max_order + 1))
          + f" {'lookup':>8}")
    for kind in ("chat", "reasoning", "code"):
        out = subprocess.run([args.dspark, "generate", args.target, "--data",
                              os.path.join(args.demo, "prompts", f"eval-{kind}.jsonl"), "--max-new-tokens",
                              str(args.max_new_tokens), "--print-ids"], check=True, capture_output=True, text=True)
        answers = [[int(t) for t in line.split()] for line in out.stdout.strip().split("\n")]
        positions = [(a, i) for a in answers for i in range(1, len(a))]
        hits = [sum(ngram_next(tables, a[:i], n) == a[i] for a, i in positions) for n in range(1, args.max_order + 1)]
        hits.append(sum(lookup_next(a, i) == a[i] for a, i in positions))
        print(f"{kind:<10} {len(positions):>9} " + " ".join(f"{h / len(positions):8.3f}" for h in hits))
        if args.lookup_survival:
            for m, (rounds, surv) in lookup_survival(answers).items():
                print(f"  lookup, {m}-token matches: {rounds} rounds, survival " + " ".join(f"{v:.2f}" for v in surv))


if __name__ == "__main__":
    main()
