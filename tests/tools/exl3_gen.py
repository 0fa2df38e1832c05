#!/usr/bin/env python3
"""Test vectors for dsv4's EXL3 decoder and the other weight forms, and the suite's helpers.

gen OUT_DIR REF: with the stdlib EXL3 reference decoder REF (a path to exl3_ref.py), writes
  OUT_DIR/exl3.safetensors (random EXL3 layers: every K 1..8 x every codebook, legacy .su/.sv
  sign words, bias, padding), config.json + quantization_config.json, a manifest cases.txt
  ("prefix n k" per layer) and per layer what the reference decoded: PREFIX.inner.f32 (decoded
  tiles, exact) and PREFIX.full.f64 (the rotated, scaled W, float64), both [n, k]. Also
  OUT_DIR/bad/*.safetensors: variants the loader must refuse, with the tensor it must name.
  tests/fixtures/exl3 is this output, committed (tests/fixtures/exl3/README.md).
dense OUT_DIR: OUT_DIR/dense.safetensors: FP8 (F32 and E8M0 block scales), FP4, BF16, F16, F32
  weights with their exact expected values NAME.f32, listed in dense.txt (no reference needed).
ckpt OUT_DIR: a small checkpoint for `dsv4 quantize` (BF16 Gaussian linears, one FP8 linear with
  block scales, a norm, a router, embeddings, a head), its linears listed in layers.txt.
checkpack SRC DST BITS HEAD_BITS CODEBOOK: checks the pack dsv4 quantize made from it.
relerr A B BOUND: ||A - B|| / ||B|| of two float32 files <= BOUND.
layers SRC PACK: "prefix n k" of each EXL3 layer of PACK (logical size from SRC's weights).
deqckpt PACK DEQ OUT: PACK with its EXL3 layers replaced by F32 weights DEQ/PREFIX.f32
  (sizes from DEQ/layers.txt); config.json gets the source's quantization_config back.
maxdiff A B BOUND: max |A - B| of two float32 files <= BOUND.
cmp EXPECTED GOT KIND: compares a dsv4 dequant output (float32) with an expected file;
  KIND inner: bit-exact; KIND full: |got - ref| <= 2^-24 |ref| + 1e-12 max|ref| (one fp32
  rounding of a value computed in double). Exit 0 on match, 1 with a report otherwise.
"""
import json
import os
import random
import struct
import sys

ref = None  # the reference decoder module, loaded by `gen` only: the tests use its committed output

CB_NAMES = ["3inst", "mcg", "mul1"]


def write_st(path, tensors):
    """tensors: list of (name, dtype, shape, raw bytes) -> one .safetensors file"""
    hdr, off = {}, 0
    for name, dt, shape, raw in tensors:
        hdr[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    h = json.dumps(hdr, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for t in tensors:
            f.write(t[3])


def f16s(vals):
    return struct.pack("<%de" % len(vals), *vals)


def make_layer(rng, prefix, K, cb, kp, np_, legacy=False, bias=False, mult=None):
    """-> (tensors, W_hat, suh, svh) with random trellis words and fp16 scales"""
    tk, tn = kp // 16, np_ // 16
    words = [rng.getrandbits(16) for _ in range(tk * tn * 16 * K)]
    trellis = [[words[(i * tn + j) * 16 * K:(i * tn + j + 1) * 16 * K] for j in range(tn)] for i in range(tk)]
    T = [(prefix + ".trellis", "I16", [tk, tn, 16 * K], struct.pack("<%dH" % len(words), *words))]
    if legacy:
        su = [rng.getrandbits(16) for _ in range(kp // 16)]
        sv = [rng.getrandbits(16) for _ in range(np_ // 16)]
        suh = [-1.0 if (su[i // 16] >> (i % 16)) & 1 else 1.0 for i in range(kp)]
        svh = [-1.0 if (sv[i // 16] >> (i % 16)) & 1 else 1.0 for i in range(np_)]
        T.append((prefix + ".su", "I16", [kp // 16], struct.pack("<%dH" % len(su), *su)))
        T.append((prefix + ".sv", "I16", [np_ // 16], struct.pack("<%dH" % len(sv), *sv)))
    else:
        suh = [ref.rnd16(rng.choice((-1, 1)) * rng.uniform(0.005, 0.02)) for _ in range(kp)]
        svh = [ref.rnd16(rng.choice((-1, 1)) * rng.uniform(0.5, 2.0)) for _ in range(np_)]
        T.append((prefix + ".suh", "F16", [kp], f16s(suh)))
        T.append((prefix + ".svh", "F16", [np_], f16s(svh)))
    if cb == 1:
        T.append((prefix + ".mcg", "I32", [], struct.pack("<I", mult or ref.MCG_MULT)))
    elif cb == 2:
        T.append((prefix + ".mul1", "I32", [], struct.pack("<I", mult or ref.MUL1_MULT)))
    if bias:
        T.append((prefix + ".bias", "F16", [np_], f16s([ref.rnd16(rng.uniform(-1, 1)) for _ in range(np_)])))
    return T, trellis, suh, svh


def gen(out):
    rng = random.Random(20261129)
    os.makedirs(os.path.join(out, "bad"), exist_ok=True)
    cases = []  # (prefix, K, cb, kp, np, n, k, legacy, bias)
    for K in range(1, 9):
        for cb in range(3):
            cases.append(("layers.%d.%s" % (K, CB_NAMES[cb]), K, cb, 128, 128, 128, 128, False, False))
    cases.append(("legacy.k2", 2, 0, 128, 128, 128, 128, True, False))
    cases.append(("legacy.k5mul1", 5, 2, 128, 256, 256, 128, True, False))
    cases.append(("padded.k3mcg", 3, 1, 256, 256, 200, 250, False, True))
    cases.append(("wide.k4mul1", 4, 2, 256, 128, 128, 256, False, True))
    tensors, storage, manifest = [], {}, []
    for prefix, K, cb, kp, np_, n, k, legacy, bias in cases:
        T, trellis, suh, svh = make_layer(rng, prefix, K, cb, kp, np_, legacy, bias)
        tensors += T
        rec = {"stored_tensors": {t[0]: {"shape": t[2], "n_bytes": len(t[3]), "dtype": t[1]} for t in T},
               "quant_format": "exl3", "bits_per_weight": K}
        if cb:
            rec[CB_NAMES[cb] + "_multiplier"] = ref.MCG_MULT if cb == 1 else ref.MUL1_MULT
        storage[prefix] = rec
        W_hat = ref.reconstruct_inner(trellis, K, cb)
        W = ref.full_weight(W_hat, suh, svh)
        # expected in dsv4 orientation [n, k]: element (c, r) = W[r][c], cropped to the logical size
        with open(os.path.join(out, prefix + ".inner.f32"), "wb") as f:
            f.write(struct.pack("<%df" % (n * k), *[W_hat[r][c] for c in range(n) for r in range(k)]))
        with open(os.path.join(out, prefix + ".full.f64"), "wb") as f:
            f.write(struct.pack("<%dd" % (n * k), *[W[r][c] for c in range(n) for r in range(k)]))
        manifest.append("%s %d %d" % (prefix, n, k))
    tensors.append(("norm.weight", "F16", [128], f16s([1.0] * 128)))
    write_st(os.path.join(out, "exl3.safetensors"), tensors)
    qc = {"quant_method": "exl3", "version": "dsv4-test", "bits": 4.5, "head_bits": 6, "codebook": "mul1"}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"quantization_config": qc}, f)
    with open(os.path.join(out, "quantization_config.json"), "w") as f:
        json.dump(dict(qc, tensor_storage=storage), f)
    with open(os.path.join(out, "cases.txt"), "w") as f:
        f.write("\n".join(manifest) + "\n")
    # variants the loader refuses: file stem -> (layer, tensor the message must name)
    bad = []
    T, *_ = make_layer(rng, "both", 2, 1, 128, 128)
    T.append(("both.mul1", "I32", [], struct.pack("<I", ref.MUL1_MULT)))
    bad.append(("both_flags", T, "both"))
    T, *_ = make_layer(rng, "oldmult", 2, 1, 128, 128, mult=0x12345679)
    bad.append(("old_multiplier", T, "oldmult.mcg"))
    words = [0] * (8 * 8 * 144)
    T = [("k9.trellis", "I16", [8, 8, 144], struct.pack("<%dH" % len(words), *words))]
    bad.append(("k9", T, "k9.trellis"))
    words = [0] * (4 * 8 * 32)
    T = [("unpadded.trellis", "I16", [4, 8, 32], struct.pack("<%dH" % len(words), *words))]
    bad.append(("unpadded", T, "unpadded.trellis"))
    T, *_ = make_layer(rng, "nosvh", 3, 0, 128, 128)
    T = [t for t in T if not t[0].endswith(".svh")]
    bad.append(("missing_svh", T, "nosvh.svh"))
    T, *_ = make_layer(rng, "shortsuh", 3, 0, 128, 128)
    T = [t if not t[0].endswith(".suh") else (t[0], "F16", [64], t[3][:128]) for t in T]
    bad.append(("short_suh", T, "shortsuh.suh"))
    with open(os.path.join(out, "bad", "cases.txt"), "w") as f:
        for stem, T, name in bad:
            write_st(os.path.join(out, "bad", stem + ".safetensors"), T)
            f.write("%s %s %s\n" % (stem, T[0][0].rsplit(".", 1)[0], name))


def e4m3(b):
    s = -1.0 if b & 0x80 else 1.0
    e, m = (b >> 3) & 15, b & 7
    return s * (m / 8.0 * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7))


E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def gen_dense(out):
    """dense.safetensors: the non-EXL3 forms dequant reads, with expected NAME.f32 ([n, k], exact)
    and dense.txt ("NAME" per weight)."""
    rng = random.Random(7)
    T, names = [], []

    def fp8(name, n, k, bn, bk, e8m0):
        q = [rng.choice([b for b in range(256) if b & 0x7f != 0x7f]) for _ in range(n * k)]
        sn, sk = -(-n // bn), -(-k // bk)
        if e8m0:
            se = [rng.randrange(117, 137) for _ in range(sn * sk)]
            sc = [2.0 ** (e - 127) for e in se]
            T.append((name + ".scale", "F8_E8M0", [sn, sk], bytes(se)))
        else:
            sc = [rng.uniform(1e-3, 1e-1) for _ in range(sn * sk)]
            sc = list(struct.unpack("<%df" % len(sc), struct.pack("<%df" % len(sc), *sc)))
            T.append((name + ".scale", "F32", [sn, sk], struct.pack("<%df" % len(sc), *sc)))
        T.append((name + ".weight", "F8_E4M3", [n, k], bytes(q)))
        return [e4m3(q[r * k + c]) * sc[(r // bn) * sk + c // bk] for r in range(n) for c in range(k)]

    def fp4(name, n, k, g):
        q = [rng.getrandbits(8) for _ in range(n * k // 2)]
        se = [rng.randrange(120, 134) for _ in range(n * k // g)]
        T.append((name + ".weight", "I8", [n, k // 2], bytes(q)))
        T.append((name + ".scale", "F8_E8M0", [n, k // g], bytes(se)))
        vals = []
        for r in range(n):
            for c in range(k):
                nib = (q[(r * k + c) // 2] >> (4 * (c % 2))) & 15
                v = (-1.0 if nib & 8 else 1.0) * E2M1[nib & 7]
                vals.append(v * 2.0 ** (se[(r * k + c) // g] - 127))
        return vals

    def plain(name, n, k, dt):
        v = [rng.uniform(-2, 2) for _ in range(n * k)]
        if dt == "F32":
            raw = struct.pack("<%df" % len(v), *v)
            v = list(struct.unpack("<%df" % len(v), raw))
        elif dt == "F16":
            raw = f16s(v)
            v = list(struct.unpack("<%de" % len(v), raw))
        else:  # BF16: truncate f32 bits (an exact bf16 value either way)
            u = [x >> 16 for x in struct.unpack("<%dI" % len(v), struct.pack("<%df" % len(v), *v))]
            raw = struct.pack("<%dH" % len(u), *u)
            v = list(struct.unpack("<%df" % len(u), struct.pack("<%dI" % len(u), *[x << 16 for x in u])))
        T.append((name + ".weight", dt, [n, k], raw))
        return v

    exp = {"fp8f32": fp8("fp8f32", 256, 384, 128, 128, False), "fp8e8m0": fp8("fp8e8m0", 256, 320, 64, 64, True),
           "fp4": fp4("fp4", 64, 256, 32), "bf16": plain("bf16", 32, 48, "BF16"),
           "f16": plain("f16", 16, 24, "F16"), "f32": plain("f32", 8, 40, "F32")}
    write_st(os.path.join(out, "dense.safetensors"), T)
    for name, v in exp.items():
        with open(os.path.join(out, name + ".f32"), "wb") as f:
            f.write(struct.pack("<%df" % len(v), *v))
        names.append(name)
    with open(os.path.join(out, "dense.txt"), "w") as f:
        f.write("\n".join(names) + "\n")


def read_st(path):
    """-> {name: (dtype, shape, raw bytes)} of one .safetensors file"""
    with open(path, "rb") as f:
        b = f.read()
    n = struct.unpack("<Q", b[:8])[0]
    hdr = json.loads(b[8:8 + n])
    base = 8 + n
    return {k: (v["dtype"], v["shape"], b[base + v["data_offsets"][0]:base + v["data_offsets"][1]])
            for k, v in hdr.items() if k != "__metadata__"}


# the quantize test checkpoint: name -> (kind, n, k); kind q = quantized, h = head, c = copied
CKPT = {"embed.weight": ("c", 64, 256), "layers.0.attn_norm.weight": ("c", 256, 0),
        "layers.0.attn.wq_a.weight": ("q", 128, 256), "layers.0.attn.wo_b.weight": ("q", 256, 128),
        "layers.0.ffn.experts.3.w2.weight": ("q", 256, 64), "layers.0.ffn.gate.weight": ("c", 8, 256),
        "head.weight": ("h", 64, 256)}


def gen_ckpt(out):
    """a small FP8-style checkpoint (BF16 Gaussian weights, one FP8 weight with block scales)"""
    rng = random.Random(11)
    os.makedirs(out, exist_ok=True)
    T = []
    e4m3_vals = sorted((e4m3(b), b) for b in range(256) if b & 0x7f != 0x7f)
    for name, (kind, n, k) in CKPT.items():
        if k == 0:
            v = [1.0 + 0.1 * rng.gauss(0, 1) for _ in range(n)]
            T.append((name, "F32", [n], struct.pack("<%df" % n, *v)))
        elif name.endswith("wo_b.weight"):
            q = []
            for _ in range(n * k):
                x = rng.gauss(0, 1) * 64
                q.append(min(e4m3_vals, key=lambda t: abs(t[0] - x))[1])
            T.append((name, "F8_E4M3", [n, k], bytes(q)))
            T.append((name[:-7] + ".scale", "F32", [2, 1], struct.pack("<2f", 2.0 ** -10, 2.0 ** -9)))
        else:
            v = [rng.gauss(0, 0.02) * (1 + r % 5) for r in range(n) for _ in range(k)]
            u = [x >> 16 for x in struct.unpack("<%dI" % len(v), struct.pack("<%df" % len(v), *v))]
            T.append((name, "BF16", [n, k], struct.pack("<%dH" % len(u), *u)))
    write_st(os.path.join(out, "model.safetensors"), T)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"hidden_size": 256,
                   "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}}, f)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        f.write("{}\n")
    with open(os.path.join(out, "layers.txt"), "w") as f:
        for name, (kind, n, k) in CKPT.items():
            if kind != "c":
                f.write("%s %d %d %s\n" % (name[:-7], n, k, kind))


def check_pack(src, dst, bits, head_bits, cbname):
    """the pack's files and tensors: copies byte-identical, quantized layers complete, configs"""
    problems = []
    a, b = read_st(os.path.join(src, "model.safetensors")), read_st(os.path.join(dst, "model.safetensors"))
    for name, (kind, n, k) in CKPT.items():
        pre = name[:-7]
        if kind == "c":
            if b.get(name) != a[name]:
                problems.append("%s not copied as stored" % name)
            continue
        K = head_bits if kind == "h" else bits
        want = {pre + ".trellis": ("I16", [-(-k // 128) * 8, -(-n // 128) * 8, 16 * K]),
                pre + ".suh": ("F16", [-(-k // 128) * 128]), pre + ".svh": ("F16", [-(-n // 128) * 128])}
        if cbname != "3inst":
            want[pre + "." + cbname] = ("I32", [])
        for t, (dt, shape) in want.items():
            if t not in b or b[t][:2] != (dt, shape):
                problems.append("%s: %s, expected %s %s" % (t, b.get(t, ("missing",))[:2], dt, shape))
        if name in b or pre + ".scale" in b:
            problems.append("%s: the source weight or its scale is still in the pack" % pre)
    cfg = json.load(open(os.path.join(dst, "config.json")))
    qc = cfg.get("quantization_config", {})
    if qc.get("quant_method") != "exl3" or qc.get("bits") != bits or qc.get("head_bits") != head_bits:
        problems.append("config.json quantization_config: %r" % qc)
    if qc.get("original_quantization_config", {}).get("quant_method") != "fp8":
        problems.append("config.json lost the original quantization_config")
    if qc.get("weight_block_size") != [128, 128]:
        problems.append("config.json quantization_config lost weight_block_size (FP8 tensors left in the pack need it)")
    qj = json.load(open(os.path.join(dst, "quantization_config.json")))
    for name, (kind, n, k) in CKPT.items():
        rec = qj.get("tensor_storage", {}).get(name[:-7])
        if kind != "c" and (not rec or rec.get("bits_per_weight") != (head_bits if kind == "h" else bits)):
            problems.append("quantization_config.json: record of %s: %r" % (name[:-7], rec))
    if not os.path.exists(os.path.join(dst, "tokenizer.json")):
        problems.append("tokenizer.json not copied")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def relerr(a, b, bound):
    """||A - B|| / ||B|| for two float32 files, against a bound"""
    x = struct.unpack("<%df" % (os.path.getsize(a) // 4), open(a, "rb").read())
    y = struct.unpack("<%df" % (os.path.getsize(b) // 4), open(b, "rb").read())
    if len(x) != len(y):
        print("  %s has %d values, %s %d" % (a, len(x), b, len(y)))
        return 1
    e = (sum((p - q) ** 2 for p, q in zip(x, y)) / sum(q * q for q in y)) ** 0.5
    if e > bound:
        print("  %s: relative error %.5f > %.5f" % (a, e, bound))
        return 1
    return 0


def pack_layers(src, pack):
    """"prefix n k" of each EXL3 layer of PACK, the logical size taken from SRC's weight"""
    a = read_st(os.path.join(src, "model.safetensors"))
    qj = json.load(open(os.path.join(pack, "quantization_config.json")))
    for pre in qj["tensor_storage"]:
        dt, shape, _ = a[pre + ".weight"]
        print(pre, shape[0], shape[1] * (2 if dt in ("I8", "U8") else 1))


def deq_ckpt(pack, deq, out):
    """PACK with each EXL3 layer replaced by DEQ/PREFIX.f32 as an F32 PREFIX.weight [n, k]"""
    os.makedirs(out, exist_ok=True)
    t = read_st(os.path.join(pack, "model.safetensors"))
    qj = json.load(open(os.path.join(pack, "quantization_config.json")))
    dims = dict((l.split()[0], (int(l.split()[1]), int(l.split()[2]))) for l in open(os.path.join(deq, "layers.txt")))
    T = []
    for name, (dt, shape, raw) in t.items():
        pre = name.rsplit(".", 1)[0]
        if pre not in qj["tensor_storage"]:
            T.append((name, dt, shape, raw))
        elif name.endswith(".trellis"):
            n, k = dims[pre]
            T.append((pre + ".weight", "F32", [n, k], open(os.path.join(deq, pre + ".f32"), "rb").read()))
    write_st(os.path.join(out, "model.safetensors"), T)
    cfg = json.load(open(os.path.join(pack, "config.json")))
    cfg["quantization_config"] = cfg["quantization_config"].get("original_quantization_config", {})
    json.dump(cfg, open(os.path.join(out, "config.json"), "w"))


def maxdiff(a, b, bound):
    """max |A - B| of two float32 files <= BOUND"""
    x = struct.unpack("<%df" % (os.path.getsize(a) // 4), open(a, "rb").read())
    y = struct.unpack("<%df" % (os.path.getsize(b) // 4), open(b, "rb").read())
    d = max(abs(p - q) for p, q in zip(x, y)) if len(x) == len(y) and x else float("inf")
    if d > bound:
        print("  %s vs %s: max difference %.3g > %.3g (%d vs %d values)" % (a, b, d, bound, len(x), len(y)))
        return 1
    return 0


def cmp(expected, got, kind):
    with open(got, "rb") as f:
        g = f.read()
    with open(expected, "rb") as f:
        e = f.read()
    if kind == "inner":
        if g == e:
            return 0
        n = min(len(g), len(e)) // 4
        gv, ev = struct.unpack("<%df" % n, g[:4 * n]), struct.unpack("<%df" % n, e[:4 * n])
        bad = [i for i in range(n) if gv[i] != ev[i]]
        print("  %s: %d bytes vs %d expected; %d of %d values differ, first at %s: %r vs %r"
              % (got, len(g), len(e), len(bad), n, bad[:1], gv[bad[0]] if bad else None, ev[bad[0]] if bad else None))
        return 1
    n = len(e) // 8
    if len(g) != 4 * n:
        print("  %s: %d bytes, expected %d" % (got, len(g), 4 * n))
        return 1
    gv, ev = struct.unpack("<%df" % n, g), struct.unpack("<%dd" % n, e)
    scale = max(abs(v) for v in ev)
    worst, wi = 0.0, -1
    for i in range(n):
        excess = abs(gv[i] - ev[i]) - (2.0 ** -24 * abs(ev[i]) + 1e-12 * scale)
        if excess > worst:
            worst, wi = excess, i
    if wi >= 0:
        print("  %s: value %d is %r, reference %r (beyond tolerance by %.3g)" % (got, wi, gv[wi], ev[wi], worst))
        return 1
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "gen":
        import importlib.util
        spec = importlib.util.spec_from_file_location("exl3_ref", sys.argv[3])
        ref = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(ref)
        gen(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "dense":
        os.makedirs(sys.argv[2], exist_ok=True)
        gen_dense(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "cmp":
        sys.exit(cmp(sys.argv[2], sys.argv[3], sys.argv[4]))
    elif len(sys.argv) == 3 and sys.argv[1] == "ckpt":
        gen_ckpt(sys.argv[2])
    elif len(sys.argv) == 7 and sys.argv[1] == "checkpack":
        sys.exit(check_pack(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]))
    elif len(sys.argv) == 4 and sys.argv[1] == "layers":
        pack_layers(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 5 and sys.argv[1] == "deqckpt":
        deq_ckpt(sys.argv[2], sys.argv[3], sys.argv[4])
    elif len(sys.argv) == 5 and sys.argv[1] == "maxdiff":
        sys.exit(maxdiff(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    elif len(sys.argv) == 5 and sys.argv[1] == "relerr":
        sys.exit(relerr(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    else:
        print(__doc__)
        sys.exit(2)
