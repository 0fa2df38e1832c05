"""Peer numbers for bench_cuda's linear table (docs/bench.md): PyTorch's FP8 scaled matmul
(torch._scaled_mm, e4m3 weights) and BF16 matmul (torch.nn.functional.linear) at the same
[n, k] shapes, batch 1 and a prefill batch, timed as bench_cuda times ours: each shape's
weight rotated over >= 512 MB of copies (L2 cannot serve them), the calls captured in a CUDA
graph, median of 10 replays. GB/s counts the weight bytes as PyTorch stores them (FP8: n*k
plus its scales; BF16: 2*n*k). The FP4 expert shapes have no FP4 matmul in PyTorch on sm_90:
their peer rows are FP8 and BF16 at the expert's shape. First, the run's tensor-core peaks
(BF16 and FP8 8192^3 matmuls); `--peak`: those alone.

FP8 scaling: the first form _scaled_mm accepts here, tried in order: 128x128 weight blocks
with 1x128 activation blocks (DeepSeek's layout, ours), per-row/per-column, per-tensor. A batch
that _scaled_mm refuses (rows not a multiple of 16) is padded to 16 rows and says so.
"""
import sys
import torch

SHAPES = [
    ("wq_a", 1024, 4096),
    ("wq_b", 32768, 1024),
    ("wo_b", 4096, 8192),
    ("expert w1", 2048, 4096),
    ("expert w2", 4096, 2048),
    ("gate", 4096, 4096),
]
BATCHES = [1, 2, 4, 5, 8, 16, 64, 512, 4096]  # issue 12's row counts, bench_cuda's
REPS = 10


def time_graph(fn, calls):
    """Median us per call of `calls` calls of fn(c) captured in one graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for c in range(3):
            fn(c)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for c in range(calls):
            fn(c)
    for _ in range(3):
        g.replay()
    t = []
    for _ in range(REPS):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b))
    t.sort()
    return t[REPS // 2] * 1e3 / calls


def fp8_form(n, k, m):
    """(label, make_scales(m_rows)) of the first scaling _scaled_mm runs at [m, k] x [k, n]."""
    dev = "cuda"
    x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
    forms = [
        ("block 128x128", lambda mm: (torch.rand(mm, k // 128, device=dev) + 0.5,
                                      (torch.rand(k // 128, n // 128, device=dev) + 0.5))),
        ("block 128x128 (t)", lambda mm: (torch.rand(mm, k // 128, device=dev) + 0.5,
                                          (torch.rand(n // 128, k // 128, device=dev) + 0.5).t())),
        ("row/col", lambda mm: (torch.rand(mm, 1, device=dev) + 0.5, torch.rand(1, n, device=dev) + 0.5)),
        ("tensor", lambda mm: (torch.tensor(1.0, device=dev), torch.tensor(1.0, device=dev))),
    ]
    errs = []
    for label, mk in forms:
        sa, sb = mk(m)
        try:
            if label.startswith("block"):
                # 1x128 activation blocks want scale_a column-major (outer dim contiguous)
                sa = sa.t().contiguous().t()
            torch._scaled_mm(x, w.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
            return label, mk
        except Exception as e:  # noqa: BLE001 - we report why each form was refused
            errs.append(f"{label}: {str(e).splitlines()[0][:120]}")
    return None, errs


def peaks():
    """The tensor cores' ceilings this run compares against: an 8192^3 BF16 matmul and the same
    in FP8 (_scaled_mm, per-tensor scales), TFLOP/s of the median replay."""
    N = 8192
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    us = time_graph(lambda c: torch.matmul(a, b), 4)
    print(f"peak: bf16 matmul {N}^3 {2 * N ** 3 / us / 1e6:.1f} TFLOP/s", flush=True)
    a8, b8 = a.to(torch.float8_e4m3fn), b.t().contiguous().t().to(torch.float8_e4m3fn)
    one = torch.ones((), device="cuda")
    try:
        us = time_graph(lambda c: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), 4)
        print(f"peak: fp8 _scaled_mm {N}^3 {2 * N ** 3 / us / 1e6:.1f} TFLOP/s", flush=True)
    except RuntimeError as e:
        print(f"peak: fp8 _scaled_mm refused: {e}", flush=True)


def main():
    torch.manual_seed(0)
    p = torch.cuda.get_device_properties(0)
    print(f"peer: torch {torch.__version__}, {p.name}")
    peaks()
    if "--peak" in sys.argv:
        return 0
    print(f"{'weight':<12} {'[n, k]':<14} {'T':>4} {'peer':<24} {'us/call':>9} {'GB/s':>7} {'TFLOP/s':>8}")
    for name, n, k in SHAPES:
        for T in BATCHES:
            sh = f"[{n},{k}]"
            # BF16
            bytes_bf = 2 * n * k
            count = (512 << 20) // bytes_bf + 1
            ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for _ in range(count)]
            x = torch.randn(T, k, device="cuda", dtype=torch.bfloat16)
            calls = 16 if T > 8 else max(64, count)
            us = time_graph(lambda c: torch.nn.functional.linear(x, ws[c % count]), calls)
            print(f"{name:<12} {sh:<14} {T:>4} {'bf16 linear':<24} {us:9.2f} {bytes_bf / us / 1e3:7.0f} "
                  f"{2 * n * k * T / us / 1e6:8.2f}", flush=True)
            del ws
            # FP8
            m = T
            label, mk = fp8_form(n, k, m)
            pad = ""
            if label is None and T % 16:
                m = 16
                label, mk = fp8_form(n, k, m)
                pad = f", {T} padded to 16"
            if label is None:
                print(f"{name:<12} {sh:<14} {T:>4} fp8 _scaled_mm refused: {'; '.join(mk)}", flush=True)
                continue
            sa, sb = mk(m)
            if label.startswith("block"):
                sa = sa.t().contiguous().t()
            bytes_f8 = n * k + sb.numel() * 4
            count = (512 << 20) // bytes_f8 + 1
            ws = [torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn) for _ in range(count)]
            x8 = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            calls = 16 if T > 8 else max(64, count)
            us = time_graph(lambda c: torch._scaled_mm(x8, ws[c % count].t(), scale_a=sa, scale_b=sb,
                                                       out_dtype=torch.bfloat16), calls)
            print(f"{name:<12} {sh:<14} {T:>4} {'fp8 ' + label + pad:<24} {us:9.2f} {bytes_f8 / us / 1e3:7.0f} "
                  f"{2 * n * k * T / us / 1e6:8.2f}", flush=True)
            del ws
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
