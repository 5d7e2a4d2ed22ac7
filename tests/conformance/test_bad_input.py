"""Bad input never crashes and never loads silently: each corrupted model directory or
tokenizer gives exit status 1 and a message naming the file and the field or tensor, also
under the sanitizer build (ctest runs this script against both builds).

The valid model is a tiny random Qwen3 saved by transformers; every case below damages one
thing in a copy of it."""
import json
import os
import shutil
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def read_st(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_st(path, header, body, raw_header=None):
    h = raw_header if raw_header is not None else json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + body)


def drop_tensor(header, body, name):
    """Removes one tensor and repacks the data so the file stays otherwise valid."""
    meta = header.pop("__metadata__", None)
    out, chunks, off = {}, [], 0
    for k, v in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        if k == name:
            continue
        b, e = v["data_offsets"]
        chunks.append(body[b:e])
        out[k] = dict(v, data_offsets=[off, off + e - b])
        off += e - b
    if meta is not None:
        out["__metadata__"] = meta
    return out, b"".join(chunks)


def main():
    args = common.parse_args(__doc__)
    ck = common.Checker()
    good = os.path.join(args.tmp, "good")
    if not os.path.exists(os.path.join(good, "model.safetensors")):
        common.build_tiny_model("qwen3", good, seed=3)
    st_path = os.path.join(good, "model.safetensors")
    header, body = read_st(st_path)
    qname = "model.layers.0.self_attn.q_proj.weight"

    def case(name, mutate, needles, cmd=None):
        d = os.path.join(args.tmp, name)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(good, d)
        mutate(d)
        argv = cmd(d) if cmd else [args.dspark, "info", d]
        _, err, rc = common.run(argv, expect_rc=None)
        crashed = rc < 0 or rc > 2 or "Sanitizer" in err or "runtime error" in err
        ck.check(not crashed, f"{name}: crashed (rc {rc}): {err[-2000:]}")
        ck.check(rc == 1, f"{name}: exit status {rc}, expected 1; stderr: {err.strip()}")
        for n in needles:
            ck.check(n in err, f"{name}: message lacks '{n}': {err.strip()}")
        print(f"{name}: rc {rc}: {err.strip().splitlines()[-1] if err.strip() else ''}")

    def st(d):
        return os.path.join(d, "model.safetensors")

    def truncate(d):
        data = open(st(d), "rb").read()
        open(st(d), "wb").write(data[:len(data) - 100])

    case("truncated-safetensors", truncate, ["model.safetensors"])
    case("tiny-file", lambda d: open(st(d), "wb").write(b"\x01\x02\x03"), ["model.safetensors"])
    case("header-longer-than-file",
         lambda d: open(st(d), "r+b").write(struct.pack("<Q", 1 << 40)), ["model.safetensors", "header"])

    def corrupt_json(d):
        raw = json.dumps(header).encode().replace(b'"dtype"', b'"dtype":', 1)
        write_st(st(d), None, body, raw_header=raw)
    case("malformed-header-json", corrupt_json, ["model.safetensors", "JSON"])

    def offsets_out_of_range(d):
        h = json.loads(json.dumps(header))
        b, e = h[qname]["data_offsets"]
        h[qname]["data_offsets"] = [b + len(body), e + len(body)]
        write_st(st(d), h, body)
    case("offsets-out-of-range", offsets_out_of_range, ["model.safetensors", qname])

    def size_mismatch(d):
        h = json.loads(json.dumps(header))
        h[qname]["shape"] = [h[qname]["shape"][0], h[qname]["shape"][1] + 1]
        write_st(st(d), h, body)
    case("size-disagrees-with-shape", size_mismatch, ["model.safetensors", qname])

    def overlap(d):
        h = json.loads(json.dumps(header))
        names = sorted((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
        a, b = names[0], names[1]
        # b claims a's bytes: same size region starting inside a.
        size = h[b]["data_offsets"][1] - h[b]["data_offsets"][0]
        start = h[a]["data_offsets"][0]
        h[b]["data_offsets"] = [start, start + size]
        write_st(st(d), h, body)
    case("overlapping-tensors", overlap, ["model.safetensors"])

    def unknown_dtype(d):
        h = json.loads(json.dumps(header))
        h[qname]["dtype"] = "F8_E9M9"
        write_st(st(d), h, body)
    case("unknown-dtype", unknown_dtype, ["model.safetensors", "F8_E9M9"])

    def missing_tensor(d):
        h, b = drop_tensor(json.loads(json.dumps(header)), body, "model.layers.1.mlp.up_proj.weight")
        write_st(st(d), h, b)
    case("missing-tensor", missing_tensor, ["model.layers.1.mlp.up_proj.weight"])

    def misshapen(d):
        import numpy as np
        from safetensors.numpy import load_file, save_file
        t = load_file(st(d))
        w = t[qname]
        t[qname] = np.ascontiguousarray(w.reshape(w.shape[1], w.shape[0]))
        save_file(t, st(d))
    case("misshapen-tensor", misshapen, [qname, "shape"])

    def int_weights(d):
        import numpy as np
        from safetensors.numpy import load_file, save_file
        t = load_file(st(d))
        t[qname] = t[qname].astype(np.int32)
        save_file(t, st(d))
    case("integer-weight", int_weights, [qname, "I32"])

    def cfg_edit(fn):
        def mutate(d):
            p = os.path.join(d, "config.json")
            c = json.load(open(p))
            fn(c)
            json.dump(c, open(p, "w"))
        return mutate

    case("unknown-architecture", cfg_edit(lambda c: c.update(architectures=["MambaForCausalLM"])),
         ["config.json", "MambaForCausalLM"])
    case("config-missing-field", cfg_edit(lambda c: c.pop("hidden_size")), ["config.json", "hidden_size"])
    case("config-wrong-type", cfg_edit(lambda c: c.update(num_hidden_layers="3")),
         ["config.json", "num_hidden_layers"])
    case("config-more-layers-than-tensors", cfg_edit(lambda c: c.update(num_hidden_layers=4)),
         ["model.layers.3"])
    case("config-malformed-json", lambda d: open(os.path.join(d, "config.json"), "a").write("}}"),
         ["config.json", "JSON"])
    case("config-missing", lambda d: os.remove(os.path.join(d, "config.json")), ["config.json"])

    def sharded_missing_shard(d):
        os.remove(st(d))
        index = {"metadata": {}, "weight_map": {k: "model-00001-of-00002.safetensors" for k in header
                                                  if k != "__metadata__"}}
        json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    case("sharded-missing-shard", sharded_missing_shard, ["model-00001-of-00002.safetensors"])

    def sharded_escape(d):
        os.remove(st(d))
        index = {"metadata": {}, "weight_map": {k: "../../etc/passwd" for k in header if k != "__metadata__"}}
        json.dump(index, open(os.path.join(d, "model.safetensors.index.json"), "w"))
    case("sharded-path-escape", sharded_escape, ["model.safetensors.index.json"])

    # Tokenizer files: `dspark tokenize` must refuse them naming the file and the field.
    def tok_case(name, text, needles):
        def mutate(d):
            open(os.path.join(d, "tokenizer.json"), "w").write(text)
        case(name, mutate, needles,
             cmd=lambda d: [args.dspark, "tokenize", os.path.join(d, "tokenizer.json"), "--text", "hello"])

    tok_case("tokenizer-malformed-json", '{"model": {"type": "BPE", "vocab": {', ["tokenizer.json"])
    tok_case("tokenizer-no-model", '{"version": "1.0", "added_tokens": []}', ["tokenizer.json", "model"])
    tok_case("tokenizer-unknown-model", '{"model": {"type": "WordPiece", "vocab": {}}}', ["tokenizer.json", "WordPiece"])
    tok_case("tokenizer-bad-merges",
             '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": ["a zz"]}}',
             ["tokenizer.json", "merges"])
    ck.finish("test_bad_input")


if __name__ == "__main__":
    main()
