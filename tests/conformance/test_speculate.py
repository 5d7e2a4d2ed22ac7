"""Speculative decoding is lossless (spec/dspark.md section 8, issue 11), on a tiny Qwen3
target built here and DSpark drafts trained for it here:

- greedy: `dspark speculate` prints token for token what `dspark generate` prints, on several
  prompts, for every Markov head type (vanilla, gated, rnn, none), the fixed policy at
  several draft lengths and the threshold policy; and as one batch (--data: one target pass
  per round over every request), each request's line equals its plain decoding;
- sampling: over many seeds the distribution of the second generated token (the first one a
  draft proposes) equals the target's own, computed exactly with transformers on the same
  weights under the same temperature / top-p rule, by a chi-square test at significance 1e-3
  (seeds are fixed, so the outcome is reproducible); and the same test rejects a
  deliberately biased acceptance rule (--test-bias-acceptance accepts every draft token), so
  it can fail; the scheduler policy with a calibration passes the same test;
- prompt lookup (--lookup M: proposals copied from where the request's last tokens occurred
  before, point masses; 2 by default under the scheduler): greedy output identical as above, one
  request and batched, fixed and scheduler, with lookup rounds proposed and accepted; sampling passes the chi-square test on a
  prompt where lookup proposes the second token in most requests (the report says how often);
- corpus lookup (--lookup-corpus DATA: the most frequent continuation of the request's last tokens
  in the training data, point masses): greedy output identical, one request and batched, alone
  (fixed policy) and after prompt lookup (scheduler), with corpus rounds proposed and accepted;
  sampling passes the chi-square test at T = 1 and T = 0.1 with its proposals accepted;
- learned rates (ds_spec_learned): carried from request to request of one process (--one-at-a-time),
  the output unchanged;
- confidence scheduling: `dspark calibrate` writes one temperature per position and its ECE
  on the fit rounds is no worse after than before (position 1 by construction, the mean as
  measured); `dspark profile` writes a sane cost table; the scheduler policy (with a profile,
  with an in-process one, with a calibration; the command's default) prints what `generate`
  prints, batched and not;
  on synthetic profiles it proposes everything (verification free: tau equals the fixed
  policy's), nothing (verification steep: tau 1) or switches speculation off for every
  request (drafting dear), always with the same output; the report states its convention and
  carries the per-round times, the calibration ECE and the switch-offs."""
import glob
import json
import os
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

import torch  # noqa: E402

PROMPTS = ["def main(", "import os\n", "class Foo:\n    def", "return self.", "for i in range(", "x = [",
           "if __name__ ==", "    # "]


def chi_square_p(counts, probs, n):
    """Pearson chi-square goodness of fit, bins with expected count < 5 merged into one."""
    exp = [p * n for p in probs]
    big = [i for i, e in enumerate(exp) if e >= 5]
    small_e = sum(e for i, e in enumerate(exp) if e < 5)
    small_c = sum(c for i, c in enumerate(counts) if exp[i] < 5)
    obs = [counts[i] for i in big] + ([small_c] if small_e > 0 else [])
    ex = [exp[i] for i in big] + ([small_e] if small_e > 0 else [])
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, ex) if e > 0)
    df = max(len(ex) - 1, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64),
                                         torch.tensor(stat / 2.0, dtype=torch.float64))), stat, df


def sampling_probs(logits, temperature, top_p):
    """The engine's rule (ds_sampling_probs): softmax at T, then the smallest prefix in
    descending order (ties: lower id first) whose mass reaches top_p, renormalized."""
    p = torch.softmax(logits.double() / temperature, dim=-1)
    if top_p < 1.0:
        order = sorted(range(len(p)), key=lambda i: (-float(p[i]), i))
        kept, keep = 0.0, []
        for i in order:
            kept += float(p[i])
            keep.append(i)
            if kept >= top_p:
                break
        mask = torch.zeros_like(p)
        mask[keep] = 1
        p = p * mask
        p = p / p.sum()
    return p


def second_token_probs(model, ids, temperature, top_p):
    """The target's exact distribution of the second token it generates after ids, under the
    engine's sampling rule: sum over the first token t of p(t) p(. | ids, t)."""
    with torch.no_grad():
        p0 = sampling_probs(model(torch.tensor([ids])).logits[0, -1], temperature, top_p)
        support = [i for i in range(len(p0)) if p0[i] > 0]
        logits = model(torch.tensor([ids + [i] for i in support])).logits[:, -1]
        p1 = sum(float(p0[i]) * sampling_probs(logits[k], temperature, top_p) for k, i in enumerate(support))
    return [float(x) for x in p1]


def second_token_fit(out, probs):
    """(samples, p-value, statistic, df) of the second ids of --print-ids lines against probs."""
    rows = [line.split() for line in out.strip().split("\n")]
    counts = [0] * len(probs)
    for r in rows:
        counts[int(r[1])] += 1
    pval, stat, df = chi_square_p(counts, probs, len(rows))
    return len(rows), pval, stat, df


def confidence_scheduling(args, ck, tmp, target, drafts, batch_file):
    """calibrate, profile, and the scheduler's choices on synthetic cost tables (greedy, batched,
    against `generate` and the fixed policy). Returns the paths the other checks reuse."""
    dspark, run = args.dspark, drafts["vanilla"]
    cal = os.path.join(tmp, "calibration.json")
    _, err, _ = common.run([dspark, "calibrate", "--target", target, "--draft", run, "--data", batch_file, "--out", cal,
                            "--max-new-tokens", "48", "--ignore-eos"])
    print(err.strip())
    c = json.load(open(cal))
    temps = c["temperatures"]
    ck.check(len(temps) == 4 and all(0.125 - 1e-9 <= t <= 8 + 1e-9 for t in temps),
             f"calibrate: one temperature per position within the grid, got {temps}")
    fit = c["ece"]["fit"]
    ck.check(fit["after"][0] <= fit["before"][0] + 1e-12,
             f"calibrate: ECE at position 1 on the fit rounds got worse: {fit['before'][0]} -> {fit['after'][0]}")
    ck.check(fit["after_mean"] <= fit["before_mean"] + 1e-12,
             f"calibrate: mean ECE on the fit rounds got worse: {fit['before_mean']} -> {fit['after_mean']}")
    ck.check(c["ece"]["heldout"]["rounds"] > 0 and fit["rounds"] > 0 and "held out" in c["split"],
             f"calibrate: no held-out split ({c['split']}, {c['ece']['heldout']['rounds']} rounds)")
    ck.check(any(t != 1.0 for t in temps), f"calibrate: the fit changed nothing ({temps}); the test exercises nothing")

    prof = os.path.join(tmp, "profile.json")
    common.run([dspark, "profile", "--target", target, "--draft", run, "--out", prof, "--max-tokens", "8",
                "--context", "32", "--reps", "2"])
    p = json.load(open(prof))
    v, sps, d = p["verify_seconds"], p["verify_steps_per_s"], p.get("draft_block_seconds", [])
    ck.check(len(v) == 8 and all(0 < x < 10 for x in v), f"profile: verify_seconds {v}")
    ck.check(len(sps) == 8 and all(abs(s * x - 1) < 1e-9 for s, x in zip(sps, v)), f"profile: SPS != 1 / seconds: {sps}")
    ck.check(len(d) == 4 and all(0 < x < 10 for x in d), f"profile: draft_block_seconds {d}")
    h = p.get("head_seconds", [])
    ck.check(len(h) == 7 and all(0 < x < 10 for x in h), f"profile: head_seconds {h}")

    def write(name, verify, draft):
        path = os.path.join(tmp, name)
        json.dump({"verify_seconds": verify, "draft_block_seconds": draft}, open(path, "w"))
        return path
    flat = write("flat.json", [1e-3] * 64, [1e-9] * 4)     # a verified token costs nothing: propose all
    # every verified token doubles the pass's cost: no candidate pays, even on top of a batch
    steep = write("steep.json", [1e-3 * 2.0 ** b for b in range(64)], [1e-9] * 4)
    # each token adds 30% of a pass: a candidate pays when its survival is high enough
    linear = write("linear.json", [1e-3 * (1 + 0.3 * b) for b in range(64)], [1e-9] * 4)
    dear = write("dear.json", [1e-3] * 64, [10.0] * 4)     # drafting costs 10 s: switch speculation off

    def spec(extra):
        rep = os.path.join(tmp, "sched-report.json")
        out, _, _ = common.run([dspark, "speculate", "--target", target, "--draft", run, "--data", batch_file,
                                "--max-new-tokens", "24", "--print-ids", "--ignore-eos", "--report", rep] + extra)
        return out, json.load(open(rep))
    plain, _, _ = common.run([dspark, "generate", target, "--prompt", PROMPTS[0].replace("\n", " "),
                              "--max-new-tokens", "24", "--print-ids", "--ignore-eos"])
    fixed_out, fixed = spec(["--policy", "fixed"])
    ck.check(fixed_out.split("\n")[0].split() == plain.split(), "the batch's first line differs from generate")
    for name, path, check in (
            ("flat", flat, lambda r: abs(r["tau"] - fixed["tau"]) < 1e-12 and r["scheduler"]["switch_offs"] == 0),
            ("steep", steep, lambda r: r["tau"] == 1.0 and r["accept_conditional"] == [0, 0, 0, 0]),
            ("dear", dear, lambda r: r["scheduler"]["requests_switched_off"] == len(PROMPTS)
             and r["scheduler"]["rounds_switched_off"] > 0)):
        # the draft's scheduling alone (--lookup 0), but for the steep table, which must cut prompt
        # lookup's proposals too (the scheduler prices them)
        # the profile's table as given (--profile-costs): the loop's timings would move the picks
        out, r = spec(["--policy", "scheduler", "--profile", path, "--profile-costs"]
                      + ([] if name == "steep" else ["--lookup", "0"]))
        ck.check(out == fixed_out, f"scheduler on the {name} profile: output differs from the fixed policy's")
        ck.check(check(r), f"scheduler on the {name} profile: tau {r['tau']} (fixed {fixed['tau']}), "
                           f"scheduler {r['scheduler']}, acceptance {r['accept_conditional']}")
    out, r = spec(["--policy", "scheduler", "--profile", flat, "--calibration", cal, "--baseline", "--lookup", "0",
                   "--profile-costs"])
    ck.check(out == fixed_out, "scheduler with a calibration: output differs from the fixed policy's")
    ck.check("bonus" in r["convention"] and set(r["per_round"]) == {"draft_s", "verify_s", "bookkeeping_s"}
             and len(r["tokens_per_round_histogram"]) == 5 and len(r["accept_unconditional"]) == 4
             and r["calibration"]["file"] == cal and len(r["calibration"]["ece_calibrated"]) == 4
             and len(r["calibration"]["ece_raw"]) == 4 and r["plain_decode_tokens_per_s"] > 0
             and r["scheduler"]["profile"] == f"file {flat}", f"report fields: {r}")
    # every pass counted once by its rows (1 .. L + 1), and the plain step beside them
    by_rows = r["passes_by_rows"]
    ck.check(sum(e["passes"] for e in by_rows) == r["verification_passes"]
             and all(1 <= e["rows"] <= 5 and e["mean_s"] > 0 for e in by_rows)
             and abs(sum(e["passes"] * e["mean_s"] for e in by_rows) - r["verify_s"]) < 1e-6 * r["verify_s"] + 1e-9
             and r["plain_step_s"] > 0, f"passes by rows: {by_rows}, passes {r['verification_passes']}")
    return {"calibration": cal, "measured": prof, "flat": flat, "linear": linear}


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    tmp = args.tmp
    target = common.build_bpe_target(tmp, n_files=30, vocab_size=320, seed=11,
                                     specials=("<|endoftext|>", "<|mask|>"), name="spec-target")
    data = os.path.join(tmp, "data.txt")
    with open(data, "w") as f:
        for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py")))[:30]:
            f.write(open(p, encoding="utf-8", errors="replace").read()[:20000])
    drafts = {}
    for head in ("vanilla", "gated", "rnn", "none"):
        run = os.path.join(tmp, f"draft-{head}")
        if not os.path.exists(os.path.join(run, "checkpoint.safetensors")):
            common.run([args.dspark, "train", "--target", target, "--data", data, "--out", run, "--overwrite",
                        "--seq-len", "64", "--num-anchors", "16", "--block-size", "4", "--markov", head,
                        "--markov-rank", "0" if head == "none" else "16", "--steps", "200", "--batch-seqs", "4",
                        "--lr", "1e-2", "--eval-every", "0", "--eval-seqs", "2", "--save-every", "200", "--quiet",
                        "--threads", "2"])
        drafts[head] = run

    batch_file = os.path.join(tmp, "prompts.txt")
    with open(batch_file, "w") as f:
        f.write("\n".join(p.replace("\n", " ") for p in PROMPTS) + "\n")
    sched = confidence_scheduling(args, ck, tmp, target, drafts, batch_file)

    # greedy: identical to plain decoding
    plain = {}
    for prompt in PROMPTS:
        out, _, _ = common.run([args.dspark, "generate", target, "--prompt", prompt, "--max-new-tokens", "24",
                                "--print-ids", "--ignore-eos"])
        plain[prompt] = out.split()
    taus = {}
    lookup_seen, corpus_seen = {}, {}
    # corpus lookup from the target's own answers, as regenerated answers are (its training text
    # would propose nothing it accepts: this tiny target writes little Python), for one draft:
    # alone under the fixed policy, after prompt lookup under the scheduler
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(os.path.join(target, "tokenizer.json"))
    corpus_file = os.path.join(tmp, "corpus.jsonl")
    with open(corpus_file, "w") as f:
        for prompt in PROMPTS:
            f.write(json.dumps({"text": tok.decode(tok.encode(prompt).ids + [int(i) for i in plain[prompt]])}) + "\n")
    corpus = [["--policy", "fixed", "--lookup-corpus", corpus_file], ["--lookup-corpus", corpus_file]]
    for head, run in drafts.items():
        # the calibration was fitted for the vanilla draft: speculate refuses it for the others
        own = ["--calibration", sched["calibration"]] if head == "vanilla" else []
        # [] is the command's default, the scheduler with costs measured in-process
        for policy in [["--policy", "fixed", "--draft-len", "1"], ["--policy", "fixed", "--draft-len", "3"],
                       ["--policy", "fixed"], ["--policy", "threshold", "--threshold", "0.3"],
                       ["--policy", "scheduler", "--profile", sched["measured"]], [],
                       ["--policy", "scheduler", "--profile", sched["flat"]] + own,
                       ["--policy", "fixed", "--lookup", "1"], ["--lookup", "1"], ["--lookup", "0"]] \
                + (corpus if head == "vanilla" else []):
            for prompt in PROMPTS:
                rep = os.path.join(tmp, "report.json")
                out, err, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", run, "--prompt",
                                          prompt, "--max-new-tokens", "24", "--print-ids", "--ignore-eos",
                                          "--report", rep] + policy)
                got = out.split()
                ck.check(got == plain[prompt], f"greedy {head} {policy} '{prompt}': speculate {got} != generate "
                                               f"{plain[prompt]}")
                r = json.load(open(rep))
                if policy == ["--policy", "fixed"]:
                    taus.setdefault(head, []).append(r["tau"])
                if not policy:
                    ck.check(r["policy"] == "scheduler", f"the default policy is {r['policy']}, not the scheduler")
                # lookup: as given, else 2 under the scheduler (the default policy) and off otherwise
                given = policy[policy.index("--lookup") + 1] if "--lookup" in policy else None
                on = given != "0" if given else "fixed" not in policy and "threshold" not in policy
                if on and r["lookup"] is not None:
                    for key in ("rounds", "accepted"):
                        lookup_seen[key] = lookup_seen.get(key, 0) + r["lookup"][key]
                ck.check((r["lookup"] is not None) == on, f"{policy}: lookup report {r['lookup']}, expected "
                                                          f"{'one' if on else 'none'}")
                ck.check((r["corpus_lookup"] is not None) == ("--lookup-corpus" in policy),
                         f"{policy}: corpus lookup report {r['corpus_lookup']}")
                if r["corpus_lookup"] is not None:
                    for key in ("rounds", "accepted", "proposed"):
                        corpus_seen[key] = corpus_seen.get(key, 0) + r["corpus_lookup"][key]
    ck.check(lookup_seen.get("rounds", 0) > 0 and lookup_seen.get("accepted", 0) > 0,
             f"prompt lookup proposed or was accepted nowhere ({lookup_seen}): its paths are not exercised")
    print(f"greedy corpus lookup: {corpus_seen}")
    ck.check(corpus_seen.get("rounds", 0) > 0 and 0 < corpus_seen.get("accepted", 0) < corpus_seen.get("proposed", 0),
             f"corpus lookup proposed, was accepted or rejected nowhere ({corpus_seen}): its paths are not exercised")
    # batched: every request's output is its plain decoding (one verification pass per round for all)
    flat = {}
    for prompt in PROMPTS:
        out, _, _ = common.run([args.dspark, "generate", target, "--prompt", prompt.replace("\n", " "),
                                "--max-new-tokens", "24", "--print-ids", "--ignore-eos"])
        flat[prompt] = out.split()
    # generate --data: the batch decoded together gives every request its own plain decoding
    out, _, _ = common.run([args.dspark, "generate", target, "--data", batch_file, "--max-new-tokens", "24",
                            "--print-ids", "--ignore-eos"])
    lines = out.strip().split("\n")
    ck.check(len(lines) == len(PROMPTS), f"generate --data: {len(lines)} output lines")
    for prompt, line in zip(PROMPTS, lines):
        ck.check(line.split() == flat[prompt], f"generate --data '{prompt}': {line.split()} != {flat[prompt]}")
    for head in ("vanilla", "rnn"):
        own = ["--calibration", sched["calibration"]] if head == "vanilla" else []
        for policy in (["--policy", "fixed"], ["--policy", "fixed", "--one-at-a-time", "--baseline"],
                       ["--policy", "fixed", "--draft-len", "2"], ["--policy", "threshold", "--threshold", "0.3"],
                       ["--policy", "scheduler", "--profile", sched["measured"]], [], ["--one-at-a-time"],
                       ["--policy", "scheduler"] + own, ["--lookup", "1"],
                       ["--policy", "fixed", "--draft-len", "2", "--lookup", "1"], ["--lookup-corpus", corpus_file]):
            out, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts[head], "--data",
                                    batch_file, "--max-new-tokens", "24", "--print-ids", "--ignore-eos"] + policy)
            lines = out.strip().split("\n")
            ck.check(len(lines) == len(PROMPTS), f"batched {head} {policy}: {len(lines)} output lines")
            for prompt, line in zip(PROMPTS, lines):
                ck.check(line.split() == flat[prompt], f"batched greedy {head} {policy} '{prompt}': {line.split()} != "
                                                       f"{flat[prompt]}")
    # --one-at-a-time --baseline: each request's plain decoding beside its speculative one, all of them
    rep = os.path.join(tmp, "report-baseline.json")
    common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"], "--data", batch_file,
                "--max-new-tokens", "24", "--ignore-eos", "--one-at-a-time", "--baseline", "--report", rep])
    r = json.load(open(rep))
    ck.check(r["plain_generated_tokens"] == r["generated_tokens"] == 24 * len(PROMPTS) and r["speedup"] > 0,
             f"--one-at-a-time --baseline: plain {r.get('plain_generated_tokens')} tokens against "
             f"{r['generated_tokens']}, speedup {r.get('speedup')}")
    # what the scheduler learns carries from request to request (--one-at-a-time: each request its
    # own call): the report's learned lookup counts cover every request's lookups, not the last one's
    rep = os.path.join(tmp, "report-learned.json")
    out, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"], "--data",
                            batch_file, "--max-new-tokens", "24", "--print-ids", "--ignore-eos", "--one-at-a-time",
                            "--policy", "fixed", "--lookup", "1", "--report", rep])
    ck.check([line.split() for line in out.strip().split("\n")] == [flat[p] for p in PROMPTS],
             "--one-at-a-time with learned rates: output differs from generate")
    r = json.load(open(rep))
    learned = r["learned"]["lookup"]["proposed"][0]
    print(f"learned over {len(PROMPTS)} requests: lookup proposed first tokens {learned}, lookup rounds "
          f"{r['lookup']['rounds']}")
    ck.check(learned == r["lookup"]["rounds"] > 0 and sum(r["learned"]["draft"]["proposed"]) > 0,
             f"learned rates not carried across requests: {r['learned']} against lookup {r['lookup']}")
    # an f16 KV cache (--kv-cache f16): speculation stays lossless with respect to the model as it
    # runs, one request at a time and batched
    f16 = ["--kv-cache", "f16"]
    for prompt in PROMPTS:
        out, _, _ = common.run([args.dspark, "generate", target, "--prompt", prompt, "--max-new-tokens", "24",
                                "--print-ids", "--ignore-eos"] + f16)
        for policy in (["--policy", "fixed"], ["--policy", "fixed", "--draft-len", "2"]):
            got, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"],
                                    "--prompt", prompt, "--max-new-tokens", "24", "--print-ids", "--ignore-eos"]
                                   + policy + f16)
            ck.check(got.split() == out.split(), f"f16 cache {policy} '{prompt}': speculate {got.split()} != "
                                                 f"generate {out.split()}")
    out, _, _ = common.run([args.dspark, "generate", target, "--data", batch_file, "--max-new-tokens", "24",
                            "--print-ids", "--ignore-eos"] + f16)
    got, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"], "--data",
                            batch_file, "--max-new-tokens", "24", "--print-ids", "--ignore-eos", "--policy", "fixed"]
                           + f16)
    ck.check(got.split() == out.split() and len(out.split()) == 24 * len(PROMPTS),
             "f16 cache, batched: speculate differs from generate")
    for head, t in taus.items():
        print(f"greedy tau with draft-len 4, {head} head: {sum(t) / len(t):.3f}")
    ck.check(max(sum(t) / len(t) for t in taus.values()) > 1.1,
             f"the drafts accept almost nothing ({taus}): the acceptance paths are not exercised")

    # sampling: the second token's distribution, exactly, against many seeds
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(target, torch_dtype=torch.float32).eval()
    prompt = "def main("
    ids = tok.encode(prompt).ids
    n = 3000
    for temperature, top_p in ((1.0, 1.0), (0.8, 0.9)):
        probs = second_token_probs(model, ids, temperature, top_p)
        for label, extra, want_pass in (("speculative", ["--policy", "fixed"], True),
                                        ("biased acceptance", ["--policy", "fixed", "--test-bias-acceptance"], False),
                                        ("scheduler", ["--policy", "scheduler", "--profile", sched["linear"],
                                                       "--calibration", sched["calibration"]], True)):
            out, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"],
                                    "--prompt", prompt, "--max-new-tokens", "3", "--print-ids", "--ignore-eos",
                                    "--temperature", str(temperature), "--top-p", str(top_p), "--repeat", str(n),
                                    "--seed", "1000"] + extra)
            samples, pval, stat, df = second_token_fit(out, probs)
            print(f"T={temperature} top_p={top_p} {label}: chi-square {stat:.1f} on {df} df, p = {pval:.3g} "
                  f"({samples} samples)")
            if want_pass:
                ck.check(samples == n and pval > 1e-3,
                         f"T={temperature} top_p={top_p}: speculative sampling differs from the target (p = {pval:.3g})")
            else:
                ck.check(pval < 1e-3, f"T={temperature} top_p={top_p}: the test does not detect a biased acceptance "
                                      f"rule (p = {pval:.3g})")
    # prompt lookup under sampling: a prompt in which most tokens occur, each followed by the same
    # token, so that whatever the first sampled token, lookup proposes the second; then the
    # target's likeliest first and second tokens, so that at a low temperature lookup proposes
    # the second token the target likes best after its likeliest first (accepted about half the
    # time: the acceptance rule, not only the residual, decides the distribution)
    c = 306
    ids = [t for v in range(2, 200) if v != c for t in (v, c)]
    with torch.no_grad():
        t1 = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        ids += [t1, int(model(torch.tensor([ids + [t1]])).logits[0, -1].argmax())]
    for temperature, top_p in ((1.0, 1.0), (0.1, 1.0)):
        probs = second_token_probs(model, ids, temperature, top_p)
        rep = os.path.join(tmp, "report-lookup.json")
        out, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"],
                                "--prompt-ids", ",".join(map(str, ids)), "--max-new-tokens", "3", "--print-ids",
                                "--ignore-eos", "--temperature", str(temperature), "--top-p", str(top_p), "--repeat",
                                str(n), "--seed", "1000", "--policy", "fixed", "--lookup", "1", "--report", rep])
        samples, pval, stat, df = second_token_fit(out, probs)
        lk = json.load(open(rep))["lookup"]
        print(f"T={temperature} top_p={top_p} prompt lookup: chi-square {stat:.1f} on {df} df, p = {pval:.3g} "
              f"({samples} samples; lookup proposed {lk['proposed']}, accepted {lk['accepted']})")
        ck.check(lk["rounds"] >= n // 2, f"T={temperature}: prompt lookup proposed in {lk['rounds']} of {n} requests")
        if temperature < 1:
            ck.check(lk["accepted"] >= n // 10, f"T={temperature}: prompt lookup accepted {lk['accepted']} of "
                                                f"{lk['proposed']}: its acceptance rule is not exercised")
        ck.check(samples == n and pval > 1e-3,
                 f"T={temperature} top_p={top_p}: sampling with prompt lookup differs from the target (p = {pval:.3g})")
    # corpus lookup under sampling, on its own (fixed policy, no prompt lookup): the table of the
    # target's greedy answers proposes after whatever first token was drawn where it saw it; at
    # T = 0.1 mostly after the target's likeliest one, where the acceptance rule decides (a prompt
    # whose answer's text gives back its tokens)
    prompt = "return self."
    ids = tok.encode(prompt).ids
    for temperature, top_p in ((1.0, 1.0), (0.1, 1.0)):
        probs = second_token_probs(model, ids, temperature, top_p)
        rep = os.path.join(tmp, "report-corpus.json")
        out, _, _ = common.run([args.dspark, "speculate", "--target", target, "--draft", drafts["vanilla"],
                                "--prompt", prompt, "--max-new-tokens", "3", "--print-ids", "--ignore-eos",
                                "--temperature", str(temperature), "--top-p", str(top_p), "--repeat", str(n),
                                "--seed", "1000", "--policy", "fixed", "--lookup-corpus", corpus_file, "--report", rep])
        samples, pval, stat, df = second_token_fit(out, probs)
        cl = json.load(open(rep))["corpus_lookup"]
        print(f"T={temperature} top_p={top_p} corpus lookup: chi-square {stat:.1f} on {df} df, p = {pval:.3g} "
              f"({samples} samples; corpus rounds {cl['rounds']}, proposed {cl['proposed']}, "
              f"accepted {cl['accepted']})")
        ck.check(cl["rounds"] >= n // (20 if temperature == 1 else 2) and (temperature == 1 or cl["accepted"] >= n // 10),
                 f"T={temperature}: corpus lookup proposed in {cl['rounds']} rounds of {n} requests, accepted "
                 f"{cl['accepted']}: its paths are not exercised")
        ck.check(samples == n and pval > 1e-3,
                 f"T={temperature} top_p={top_p}: sampling with corpus lookup differs from the target (p = {pval:.3g})")
    ck.finish("test_speculate")


if __name__ == "__main__":
    main()
