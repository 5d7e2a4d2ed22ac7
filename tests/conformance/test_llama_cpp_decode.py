"""Our draft served by llama.cpp (ctest conformance.test_llama_cpp_decode; docs/gguf-export.md).

On the real SmolLM2-135M-Instruct, as an F32 GGUF of the shipped Q4_1 weights (llama-quantize
dequantizes them, the values dspark's loader makes of the Q4_1 file), so that both engines run the
same fp32 target:
  1. a DSpark draft (vanilla Markov head, confidence head, a reduced vocabulary: llama.cpp's d2t
     path) is trained for a few steps on the target's own greedy answers to three chat prompts,
     from a feature cache captured once, and exported with `dspark export --gguf`;
  2. llama.cpp's tokenizer gives the ids of our chat template's text;
  3. llama.cpp decoding with the draft (`llama-speculative-simple --spec-type draft-dspark`,
     greedy, 7 proposals a round) prints the text of its plain greedy decoding (`llama-simple`);
  4. that text is what `dspark generate` and `dspark speculate` print;
  5. the tokens llama.cpp accepts from the draft equal those `dspark speculate` accepts with the
     same weights and draft length, within one per prompt: the two engines propose the same tokens
     (slot alignment, target layers, mask token, d2t agree). Two conventions differ, so the
     counts are compared within a margin: llama-speculative-simple clamps each draft to the
     tokens left of its budget (fewer than 7 proposals in the last rounds) and commits a whole
     last round even past the budget (one more token accepted), and ends a stream at the
     end-of-turn token one round later than `dspark speculate`.

Skips (exit 77) when llama.cpp's programs (scripts/setup_llama_cpp.sh --build) or the SmolLM2 GGUF
(scripts/setup.sh) are absent."""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench"))
import common  # noqa: E402
import llama_cpp_run as lcpp  # noqa: E402

SKIP = 77
N_NEW = 40
DRAFT_LEN = 7
PROMPTS = ["What is the capital of France? Answer in two sentences.",
           "Write a short Python function that returns the square of a number.",
           "Name three colors of the rainbow and say why the sky is blue."]


def main():
    args = common.parse_args(__doc__)
    bins, q41 = lcpp.bin_dir(), lcpp.smollm2_gguf()
    if not bins or not q41:
        print("test_llama_cpp_decode: SKIPPED: "
              + ("llama.cpp's programs are not built (scripts/setup_llama_cpp.sh --build)" if not bins
                 else "the SmolLM2 GGUF is not fetched (scripts/setup.sh)"), flush=True)
        sys.exit(SKIP)
    ck = common.Checker()
    tmp, ds = args.tmp, args.dspark
    target = lcpp.quantize(bins, q41, os.path.join(tmp, "smollm2-f32.gguf"), "F32")

    # the prompts as our chat template renders them, and llama.cpp's ids of that text
    rendered = []
    for i, p in enumerate(PROMPTS):
        one = os.path.join(tmp, f"prompt{i}.jsonl")
        with open(one, "w") as f:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
        out, _, _ = common.run([ds, "tokenize", target, "--chat", one, "--add-generation-prompt", "--show-text"])
        r = json.loads(out)
        ck.check(lcpp.tokenize(bins, target, r["text"]) == r["ids"],
                 f"prompt {i}: llama.cpp's ids of the rendered chat text differ from ours")
        rendered.append((r["text"], r["ids"]))

    # the target's own greedy answers, the draft's training data
    prompts = os.path.join(tmp, "prompts.jsonl")
    with open(prompts, "w") as f:
        for p in PROMPTS:
            f.write(json.dumps({"messages": [{"role": "user", "content": p}]}) + "\n")
    out, _, _ = common.run([ds, "generate", target, "--data", prompts, "--chat", "--max-new-tokens", str(N_NEW),
                            "--threads", "2"])
    answers = [json.loads(l) for l in out.splitlines()]
    data = os.path.join(tmp, "answers.jsonl")
    with open(data, "w") as f:
        for p, a in zip(PROMPTS, answers):
            f.write(json.dumps({"messages": [{"role": "user", "content": p},
                                             {"role": "assistant", "content": a}]}) + "\n")
    # captured once (f32 features: training from them is the online run bit for bit), so the
    # draft's steps do not rerun the target
    cache, run = os.path.join(tmp, "cache"), os.path.join(tmp, "draft")
    shutil.rmtree(cache, ignore_errors=True)
    common.run([ds, "capture", "--target", target, "--data", data, "--out", cache, "--seq-len", "96",
                "--dtype", "f32"])
    common.run([ds, "train", "--cache", cache, "--target", target, "--data", data, "--out", run, "--overwrite",
                "--steps", "80", "--batch-seqs", "3", "--eval-seqs", "0", "--lr", "3e-3", "--warmup", "0.02",
                "--markov-rank", "32", "--draft-vocab", "1024", "--num-anchors", "64", "--threads", "2", "--quiet",
                "--seed", "1", "--save-every", "1000"])
    draft = os.path.join(tmp, "draft.gguf")
    common.run([ds, "export", run, "--gguf", draft, "--target", target, "--dtype", "f32"])

    total = {"llama": 0, "dspark": 0}
    for i, (text, ids) in enumerate(rendered):
        plain, _ = lcpp.plain(bins, target, text, N_NEW)
        spec, st, _ = lcpp.speculative(bins, target, draft, text, N_NEW, 2, DRAFT_LEN)
        # llama-speculative-simple commits whole rounds, so it may run past N_NEW tokens
        ck.check(spec.startswith(plain) or plain.startswith(spec),
                 f"prompt {i}: llama.cpp with our draft printed\n{spec!r}\nbut plain greedy decoding\n{plain!r}")
        ck.check(plain.startswith(answers[i]) or answers[i].startswith(plain),
                 f"prompt {i}: dspark generate printed\n{answers[i]!r}\nllama.cpp\n{plain!r}")
        report = os.path.join(tmp, f"speculate{i}.json")
        out, _, _ = common.run([ds, "speculate", "--target", target, "--draft", run, "--draft-weights", "f32", "--prompt-ids",
                                ",".join(map(str, ids)), "--max-new-tokens", str(N_NEW), "--draft-len",
                                str(DRAFT_LEN), "--policy", "fixed", "--threads", "2", "--report", report])
        ck.check(out.rstrip("\n") == answers[i], f"prompt {i}: dspark speculate printed {out!r}, generate {answers[i]!r}")
        rep = json.load(open(report))
        accepted = round(sum(rep["accept_unconditional"]) * rep["rounds"])
        proposed = rep["rounds"] * DRAFT_LEN
        print(f"prompt {i}: llama.cpp accepted {st['accepted']} of {st['drafted']} drafted; "
              f"dspark speculate {accepted} of {proposed} ({rep['rounds']} rounds, tau {rep['tau']:.3f})")
        ck.check(abs(st["accepted"] - accepted) <= 1,
                 f"prompt {i}: llama.cpp accepted {st['accepted']} draft tokens, dspark speculate {accepted}")
        ck.check(abs(st["drafted"] - proposed) <= 3 * DRAFT_LEN,
                 f"prompt {i}: llama.cpp drafted {st['drafted']}, dspark proposed {proposed}")
        total["llama"] += st["accepted"]
        total["dspark"] += accepted
    # the draft must be good enough for the comparison to mean something
    ck.check(total["dspark"] >= 10, f"the draft had only {total['dspark']} tokens accepted: the check is void")
    os.remove(target)
    shutil.rmtree(run, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    return ck.finish("test_llama_cpp_decode")


if __name__ == "__main__":
    sys.exit(main())
