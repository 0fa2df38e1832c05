#!/usr/bin/env python3
"""Peer GPU benchmark: the transformers DeepseekV4ForCausalLM at V4-Flash shapes, random weights.

The other side of `dsv4 bench --synthetic v4-flash --layers N`: the same shapes (hidden 4096,
64 heads of 512, q_lora 1024, grouped output 8x1024, window 128, CSA/HCA compress ratios
alternating 4,128, indexer 64x128 top-512, 256 routed experts of 2048 with top-6 + 1 shared,
mHC x4, vocab 129280), built directly on one CUDA GPU in BF16 with random weights (normal
std 0.02 for matrices and expert tensors, norms and HC scales 1, biases/sinks/position biases 0),
run by the transformers reference code (eager attention, experts implementation "eager" unless
--experts-impl says otherwise), with torch.Tensor.topk replaced by a stable-sort top-k as in
tests/tools/v4_fixtures.py.

What it measures, in order, one labelled line each:
  1. Ceilings of this GPU: device-to-device copy bandwidth (a 2 GiB tensor copied into another;
     bytes read + bytes written over the time; best of 5 after one warm-up) and the BF16 dense
     matmul rate (8192x8192x8192; mean of 10 after 3 warm-ups), the "measured tensor-core peak".
  2. The model build: parameter count, GB of weights, build time, a finite-value check.
  3. Prefill, for each --prefill P: model(input_ids [1, P], use_cache=False, logits_to_keep=1),
     1 warm-up + median of 3; tok/s and achieved TFLOP/s with
         FLOPs = 2 * active_params * P,
         active_params = all params - embedding - lm_head - routed experts * (E - k) / E
     (k = 6 experts per token; attention-score / softmax / compressor-pooling FLOPs not counted).
  4. Decode: prefill --decode-context (64) tokens with use_cache=True, then 2 warm-up + D timed
     greedy steps of one token each, feeding past_key_values; per-step median and mean. If the
     cache path fails, it times a full forward over the growing sequence without a cache instead,
     labelled "no-cache decode (recomputes the prefix)".
  5. Bytes of weights read per decoded token in the model dtype (everything but the embedding
     and the routed experts, plus k routed experts per layer, plus lm_head) and the resulting
     effective bandwidth as a fraction of the measured copy bandwidth.
A final block of key=value lines (between "=== SUMMARY ===" and "=== END SUMMARY ===") repeats
the figures for scripts; "na" marks a figure whose step failed, failed_steps names the steps
that failed, and the exit status is 1 when any did (0 when all ran).

Timing: CUDA events on the current stream, with torch.cuda.synchronize() before each timed
region so the start event is not queued behind earlier work; since the eager model is largely
launch-bound, the event span then covers the host-side launch gaps too (≈ wall time).
Each step runs in its own try/except (CUDA out-of-memory included): a failure prints one
"FAILED" line on stdout (traceback on stderr) and the remaining steps still run.

Usage (on the GPU machine):  python3 bench/peer_transformers.py --layers 2 --prefill 64,4096 --decode 16
"""
import argparse
import gc
import math
import os
import re
import statistics
import sys
import time
import traceback

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def log(*a):
    print(*a, flush=True)


def v4_flash_config_json(layers, experts):
    """The config.json keys of dsv4's `--synthetic v4-flash --layers N` model."""
    return {
        "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": layers,
        "num_attention_heads": 64, "head_dim": 512, "qk_rope_head_dim": 64,
        "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024, "sliding_window": 128,
        "compress_ratios": [4 if i % 2 == 0 else 128 for i in range(layers)],
        "compress_rate_csa": 4, "compress_rate_hca": 128,
        "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
        "n_routed_experts": experts, "num_experts_per_tok": 6, "n_shared_experts": 1,
        "moe_intermediate_size": 2048, "num_hash_layers": 0, "swiglu_limit": 10.0,
        "routed_scaling_factor": 1.5, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
        "rms_norm_eps": 1e-6, "rope_theta": 10000, "compress_rope_theta": 160000,
        "max_position_embeddings": 1048576, "bos_token_id": 0, "eos_token_id": 1,
        "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                         "beta_fast": 32, "beta_slow": 1},
    }


def parse_args():
    ap = argparse.ArgumentParser(description="transformers DeepseekV4 peer benchmark (V4-Flash shapes, random weights, one GPU)")
    ap.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    ap.add_argument("--experts", type=int, default=256, help="routed experts per layer (default 256 = V4-Flash; fewer to fit memory)")
    ap.add_argument("--prefill", default="64,4096", help="comma-separated prefill lengths (default 64,4096)")
    ap.add_argument("--decode", type=int, default=16, help="timed decode steps (default 16)")
    ap.add_argument("--decode-context", type=int, default=64, help="tokens prefilled before decoding (default 64)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"], help="model dtype (default bf16)")
    ap.add_argument("--experts-impl", default="eager", choices=["eager", "grouped_mm", "batched_mm"],
                    help="transformers experts implementation (default eager, as the oracle fixtures use)")
    ap.add_argument("--native-topk", action="store_true",
                    help="keep torch's own Tensor.topk instead of the oracle's stable-sort top-k")
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    try:
        a.prefill_list = [int(x) for x in a.prefill.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--prefill must be a comma-separated list of integers, got {a.prefill!r}")
    if a.layers < 1:
        ap.error("--layers must be >= 1")
    if a.experts < 6:
        ap.error("--experts must be >= 6 (num_experts_per_tok)")
    if any(p < 1 for p in a.prefill_list):
        ap.error("--prefill lengths must be >= 1")
    if a.decode < 1 or a.decode_context < 1:
        ap.error("--decode and --decode-context must be >= 1")
    return a


# summary: key -> value (printed in insertion order at the end)
SUMMARY = {}
FAILED = []


def fmt(x, nd=3):
    if x is None:
        return "na"
    if isinstance(x, float):
        if math.isnan(x) or math.isinf(x):
            return "na"
        return f"{x:.{nd}f}"
    return str(x)


def cleanup():
    gc.collect()
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
    except Exception:
        pass


def run_step(label, fn, *args):
    """Run one measurement; on failure print a clear line (and the traceback on stderr) and go on."""
    import torch
    ok, res, why = False, None, ""
    try:
        res = fn(*args)
        ok = True
    except torch.cuda.OutOfMemoryError as e:
        why = "CUDA out of memory: " + str(e).strip().splitlines()[0][:300]
        traceback.print_exc(file=sys.stderr)
    except Exception as e:  # one failure must not lose the rest
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        why = f"{type(e).__name__}: {msg}"
        traceback.print_exc(file=sys.stderr)
    if not ok:
        log(f"[{label}] FAILED: {why}")
        FAILED.append(re.sub(r"[^A-Za-z0-9_.-]+", "_", label))
    cleanup()
    return res if ok else None


def main():
    args = parse_args()
    t_start = time.perf_counter()

    try:
        import torch
    except Exception as e:
        log(f"[env] FAILED: cannot import torch: {e}")
        FAILED.append("import_torch")
        print_summary(t_start)
        return 2
    torch.set_grad_enabled(False)
    SUMMARY["peer"] = "transformers"
    SUMMARY["torch_version"] = torch.__version__
    SUMMARY["cuda_version"] = str(torch.version.cuda)
    try:
        import transformers
        from transformers import DeepseekV4Config, DeepseekV4ForCausalLM
        SUMMARY["transformers_version"] = transformers.__version__
    except Exception as e:
        log(f"[env] torch {torch.__version__} (CUDA {torch.version.cuda})")
        log(f"[env] FAILED: cannot import DeepseekV4Config / DeepseekV4ForCausalLM from transformers: {type(e).__name__}: {e}")
        SUMMARY["transformers_version"] = "na"
        FAILED.append("import_transformers")
        print_summary(t_start)
        return 2
    if not torch.cuda.is_available():
        log(f"[env] torch {torch.__version__}, transformers {transformers.__version__}")
        log("[env] FAILED: no CUDA device visible to torch")
        FAILED.append("no_cuda")
        print_summary(t_start)
        return 2

    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    gpu_name = torch.cuda.get_device_name(dev)
    SUMMARY["gpu"] = gpu_name.replace(" ", "_")
    SUMMARY["gpu_mem_GiB"] = fmt(props.total_memory / 2**30, 1)
    log(f"[env] torch {torch.__version__} (CUDA {torch.version.cuda}), transformers {transformers.__version__}, python {sys.version.split()[0]}")
    log(f"[env] GPU: {gpu_name}, {props.total_memory / 2**30:.1f} GiB, sm_{props.major}{props.minor}, {props.multi_processor_count} SMs")
    try:
        import transformers.models.deepseek_v4.modeling_deepseek_v4 as mdv4
        log(f"[env] modeling file: {mdv4.__file__}")
    except Exception:
        pass

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    elt = torch.empty((), dtype=dtype).element_size()
    SUMMARY["layers"] = args.layers
    SUMMARY["experts"] = args.experts
    SUMMARY["dtype"] = args.dtype
    SUMMARY["experts_impl"] = args.experts_impl
    SUMMARY["attn_impl"] = "eager"
    SUMMARY["stable_topk"] = "no" if args.native_topk else "yes"
    log(f"[config] V4-Flash shapes, layers={args.layers}, routed experts={args.experts}"
        f"{' (reduced from 256 to fit memory; per-token active compute unchanged)' if args.experts != 256 else ''}"
        f", dtype={args.dtype}, attention=eager, experts={args.experts_impl}")

    if not args.native_topk:
        # Same approach as tests/tools/v4_fixtures.py: the indexer's ReLU scores tie, and the
        # reference is made to break ties by position (descending score, lower index first).
        def _stable_topk(self, k, dim=-1, largest=True, sorted=True):
            vals, idx = torch.sort(self, dim=dim, descending=largest, stable=True)
            return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))
        torch.Tensor.topk = _stable_topk
        log("[config] torch.Tensor.topk replaced by a stable-sort top-k (as the oracle fixtures do)")

    def ev():
        return torch.cuda.Event(enable_timing=True)

    # ---------------------------------------------------------------- 1. ceilings
    def ceiling_copy():
        nbytes = 2 << 30
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        src.fill_(7)
        dst = torch.empty_like(src)
        dst.copy_(src)  # warm-up
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            s, e = ev(), ev()
            torch.cuda.synchronize()
            s.record()
            dst.copy_(src)
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e))
        del src, dst
        gbs = 2 * nbytes / (best * 1e-3) / 1e9
        log(f"[ceiling] device-to-device copy: 2 GiB -> 2 GiB, best of 5 (after 1 warm-up): {best:.3f} ms, "
            f"{gbs:.1f} GB/s (bytes read + bytes written, 1 GB = 1e9 B)")
        SUMMARY["copy_bw_GBps"] = fmt(gbs, 1)
        return gbs

    def ceiling_mm():
        n = 8192
        g = torch.Generator(device=dev).manual_seed(args.seed)
        a = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device=dev, dtype=torch.bfloat16, generator=g)
        c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        s, e = ev(), ev()
        s.record()
        for _ in range(10):
            torch.mm(a, b, out=c)
        e.record()
        e.synchronize()
        ms = s.elapsed_time(e) / 10
        del a, b, c
        tf = 2 * n ** 3 / (ms * 1e-3) / 1e12
        log(f"[ceiling] BF16 dense matmul {n}x{n}x{n}: mean of 10 (after 3 warm-ups): {ms:.3f} ms, "
            f"{tf:.1f} TFLOP/s (measured tensor-core peak)")
        SUMMARY["bf16_mm_TFLOPs"] = fmt(tf, 1)
        return tf

    SUMMARY["copy_bw_GBps"] = "na"
    SUMMARY["bf16_mm_TFLOPs"] = "na"
    copy_bw = run_step("ceiling copy", ceiling_copy)
    mm_peak = run_step("ceiling matmul", ceiling_mm)

    # ---------------------------------------------------------------- 2. model
    cfg_json = v4_flash_config_json(args.layers, args.experts)
    drop = ("quantization_config", "expert_dtype", "architectures", "model_type", "torch_dtype")
    state = {}

    def build():
        cfg = DeepseekV4Config(**{k: v for k, v in cfg_json.items() if k not in drop})
        cfg._attn_implementation = "eager"
        cfg._experts_implementation = args.experts_impl
        log(f"[config] layer_types={cfg.layer_types} mlp_layer_types={cfg.mlp_layer_types} "
            f"compress_rates={cfg.compress_rates}")
        log(f"[config] rope_parameters={cfg.rope_parameters}")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        prev = torch.get_default_dtype()
        torch.set_default_dtype(dtype)
        try:
            try:
                with torch.device(dev):
                    model = DeepseekV4ForCausalLM(cfg)
            except torch.cuda.OutOfMemoryError:
                raise
            except Exception as e:
                # fallback: construct in host memory, then move the tensors one by one (below)
                log(f"[model] note: construction under torch.device('cuda') failed ({type(e).__name__}: "
                    f"{str(e).strip()[:200]}); constructing on the CPU and moving to the GPU (slower)")
                cleanup()
                model = DeepseekV4ForCausalLM(cfg)
        finally:
            torch.set_default_dtype(prev)
        # every config object the modules hold (a copy may have been taken) runs eager attention
        # and the requested experts implementation
        seen = set()
        for m in model.modules():
            c = getattr(m, "config", None)
            if c is not None and id(c) not in seen and hasattr(c, "_attn_implementation"):
                seen.add(id(c))
                try:
                    c._attn_implementation = "eager"
                    c._experts_implementation = args.experts_impl
                except Exception as e:
                    log(f"[model] note: could not set implementations on a config: {type(e).__name__}: {e}")
        model.eval()
        # Uniform dtype for the parameters (buffers such as the rope inv_freq keep theirs), on the GPU.
        moved = 0
        for p in model.parameters():
            if p.device.type != "cuda" or (p.is_floating_point() and p.dtype != dtype):
                p.data = p.data.to(device=dev, dtype=dtype if p.is_floating_point() else p.dtype)
                moved += 1
        for mod in model.modules():
            for bn, b in list(getattr(mod, "_buffers", {}).items()):
                if b is not None and b.device.type != "cuda":
                    mod._buffers[bn] = b.to(dev)
                    moved += 1
        if moved:
            log(f"[model] note: {moved} tensors were moved to the GPU / cast to {args.dtype} after construction")
        # Explicit random init (deterministic, finite, well scaled), whatever the default init did.
        g = torch.Generator(device=dev).manual_seed(args.seed)
        for name, p in model.named_parameters():
            if name.endswith("position_bias"):
                p.zero_()
            elif p.dim() >= 2:
                p.normal_(0.0, 0.02, generator=g)
            elif "norm" in name or name.endswith("scale"):
                p.fill_(1.0)
            else:  # sinks, HC bases, anything else 1-D
                p.zero_()
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.zero_()
            elif name.endswith("tid2eid"):
                b.copy_(torch.randint(0, args.experts, b.shape, device=b.device, generator=g).to(b.dtype))
        # finite check over everything (chunked to keep the temporaries small)
        flags = []
        for _, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_floating_point():
                for ch in t.detach().reshape(-1).split(1 << 28):
                    flags.append(torch.isfinite(ch).all())
        all_finite = bool(torch.stack(flags).all().item()) if flags else True
        torch.cuda.synchronize()
        build_s = time.perf_counter() - t0

        n_total = n_embed = n_head = n_routed = 0
        for name, p in model.named_parameters():
            n = p.numel()
            n_total += n
            if name.endswith("embed_tokens.weight"):
                n_embed += n
            elif name.endswith("lm_head.weight"):
                n_head += n
            elif ".mlp.experts." in name:
                n_routed += n
        k = cfg.num_experts_per_tok
        E = args.experts
        n_dense = n_total - n_embed - n_head - n_routed
        n_active = n_dense + n_routed * k / E
        bytes_total = sum(p.numel() * p.element_size() for p in model.parameters())
        state.update(model=model, cfg=cfg, k=k, n_total=n_total, n_embed=n_embed, n_head=n_head,
                     n_routed=n_routed, n_dense=n_dense, n_active=n_active)
        log(f"[model] DeepseekV4ForCausalLM built on {gpu_name} in {build_s:.1f} s: {n_total / 1e9:.3f} B params, "
            f"{bytes_total / 1e9:.2f} GB in {args.dtype} (embedding {n_embed / 1e6:.1f} M, lm_head {n_head / 1e6:.1f} M, "
            f"routed experts {n_routed / 1e9:.3f} B, rest {n_dense / 1e6:.1f} M); "
            f"all values finite: {'yes' if all_finite else 'NO'}; GPU memory allocated "
            f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB")
        log(f"[model] init: normal(0, 0.02) for every matrix / expert tensor, norms and HC scales 1, "
            f"sinks / HC bases / position biases / router correction bias 0 (seed {args.seed})")
        log(f"[model] active params per token = all - embedding - lm_head - routed*(E-k)/E "
            f"= {n_total} - {n_embed} - {n_head} - {n_routed}*({E}-{k})/{E} = {n_active / 1e6:.2f} M")
        SUMMARY["params_total"] = n_total
        SUMMARY["params_embed"] = n_embed
        SUMMARY["params_head"] = n_head
        SUMMARY["params_routed"] = n_routed
        SUMMARY["params_dense_rest"] = n_dense
        SUMMARY["params_active_per_token"] = int(round(n_active))
        SUMMARY["weights_GB"] = fmt(bytes_total / 1e9, 2)
        SUMMARY["build_s"] = fmt(build_s, 1)
        SUMMARY["weights_finite"] = "yes" if all_finite else "no"
        if not all_finite:
            log("[model] WARNING: non-finite weights after init; timings below may be meaningless")
        return model

    for key in ("params_total", "params_embed", "params_head", "params_routed", "params_dense_rest",
                "params_active_per_token", "weights_GB", "build_s", "weights_finite"):
        SUMMARY[key] = "na"
    model = run_step("model build", build)
    if model is None:
        state.clear()
        cleanup()

    gen = torch.Generator(device=dev).manual_seed(args.seed + 1)

    def rand_ids(n):
        return torch.randint(2, cfg_json["vocab_size"], (1, n), device=dev, generator=gen)

    def timed(fn):
        torch.cuda.synchronize()
        s, e = ev(), ev()
        s.record()
        r = fn()
        e.record()
        e.synchronize()
        return s.elapsed_time(e), r

    # sanity forward (also the first, cold, forward)
    def sanity():
        ids = rand_ids(64)
        torch.cuda.reset_peak_memory_stats()
        ms, out = timed(lambda: model(input_ids=ids, use_cache=False, logits_to_keep=1))
        lg = out.logits.float()
        fin = bool(torch.isfinite(lg).all().item())
        log(f"[sanity] cold forward, 64 tokens, use_cache=False: {ms:.1f} ms; logits shape {tuple(out.logits.shape)}, "
            f"finite: {'yes' if fin else 'NO'}, max|logit| {lg.abs().max().item():.3f}, std {lg.std().item():.4f}")
        SUMMARY["logits_finite"] = "yes" if fin else "no"
        del out, lg

    SUMMARY["logits_finite"] = "na"
    if model is not None:
        run_step("sanity forward", sanity)

    # ---------------------------------------------------------------- 3. prefill
    def prefill(P):
        ids = rand_ids(P)

        def fwd():
            return model(input_ids=ids, use_cache=False, logits_to_keep=1)

        torch.cuda.reset_peak_memory_stats()
        warm_ms, out = timed(fwd)  # warm-up
        fin = bool(torch.isfinite(out.logits).all().item())
        del out
        times = []
        for _ in range(3):
            ms, out = timed(fwd)
            del out
            times.append(ms)
        med = statistics.median(times)
        tok_s = P / (med * 1e-3)
        flops = 2.0 * state["n_active"] * P
        tf = flops / (med * 1e-3) / 1e12
        frac = tf / mm_peak if mm_peak else None
        peak_gib = torch.cuda.max_memory_allocated() / 2**30
        log(f"[prefill P={P}] use_cache=False, logits_to_keep=1: median of 3 (after 1 warm-up of {warm_ms:.1f} ms): "
            f"{med:.2f} ms, {tok_s:.1f} tok/s, {tf:.2f} TFLOP/s"
            f"{f' = {100 * frac:.2f}% of the measured BF16 peak' if frac else ''} "
            f"[FLOPs = 2 * active_params * P = 2 * {state['n_active'] / 1e6:.2f} M * {P}; attention scores not counted]; "
            f"runs {', '.join(f'{t:.2f}' for t in times)} ms; peak GPU memory {peak_gib:.1f} GiB; logits finite: {'yes' if fin else 'NO'}")
        SUMMARY[f"prefill_{P}_ms"] = fmt(med, 3)
        SUMMARY[f"prefill_{P}_tok_s"] = fmt(tok_s, 1)
        SUMMARY[f"prefill_{P}_TFLOPs"] = fmt(tf, 3)
        SUMMARY[f"prefill_{P}_frac_peak"] = fmt(frac, 4) if frac else "na"
        return med

    SUMMARY["flops_formula"] = "2*params_active_per_token*P"
    for P in args.prefill_list:
        for key in ("ms", "tok_s", "TFLOPs", "frac_peak"):
            SUMMARY[f"prefill_{P}_{key}"] = "na"
        if model is None:
            log(f"[prefill P={P}] SKIPPED: no model")
            continue
        run_step(f"prefill P={P}", prefill, P)

    # ---------------------------------------------------------------- 4. decode
    ctx, D, WARM = args.decode_context, args.decode, 2
    SUMMARY["decode_mode"] = "na"
    SUMMARY["decode_context"] = ctx
    SUMMARY["decode_steps"] = D
    for key in ("decode_ms_median", "decode_ms_mean", "decode_tok_s"):
        SUMMARY[key] = "na"

    def report_decode(mode, label, times, extra=""):
        med, mean = statistics.median(times), statistics.fmean(times)
        log(f"[decode, {label}] context {ctx}, {WARM} warm-up + {len(times)} timed greedy steps: "
            f"median {med:.2f} ms/token, mean {mean:.2f} ms/token, {1000 / med:.2f} tok/s (1000/median); "
            f"min {min(times):.2f}, max {max(times):.2f} ms{extra}")
        SUMMARY["decode_mode"] = mode
        SUMMARY["decode_ms_median"] = fmt(med, 3)
        SUMMARY["decode_ms_mean"] = fmt(mean, 3)
        SUMMARY["decode_tok_s"] = fmt(1000 / med, 2)
        return med

    def decode_cache():
        ids = rand_ids(ctx)
        pos = torch.arange(ctx + WARM + D + 1, device=dev).unsqueeze(0)
        torch.cuda.reset_peak_memory_stats()
        pf_ms, out = timed(lambda: model(input_ids=ids, use_cache=True, logits_to_keep=1))
        pkv = out.past_key_values
        if pkv is None:
            raise RuntimeError("prefill with use_cache=True returned no past_key_values")
        nxt = out.logits[:, -1, :].argmax(-1, keepdim=True)  # greedy, [1, 1]
        del out
        log(f"[decode, KV cache] prefill of {ctx} tokens with use_cache=True: {pf_ms:.1f} ms; cache {type(pkv).__name__}"
            f" with layers {sorted({type(l).__name__ for l in getattr(pkv, 'layers', [])})}")
        times, nonfinite, t = [], False, ctx
        for i in range(WARM + D):
            torch.cuda.synchronize()
            s, e = ev(), ev()
            s.record()
            o = model(input_ids=nxt, past_key_values=pkv, use_cache=True, position_ids=pos[:, t:t + 1],
                      logits_to_keep=1)
            nxt = o.logits[:, -1, :].argmax(-1, keepdim=True)
            e.record()
            e.synchronize()
            if o.past_key_values is not None:
                pkv = o.past_key_values
            if not bool(torch.isfinite(o.logits).all().item()):
                nonfinite = True
            del o
            t += 1
            if i >= WARM:
                times.append(s.elapsed_time(e))
        peak_gib = torch.cuda.max_memory_allocated() / 2**30
        return report_decode("kv_cache", "KV cache (past_key_values)", times,
                             f"; peak GPU memory {peak_gib:.1f} GiB; logits finite: {'NO' if nonfinite else 'yes'}")

    def decode_nocache():
        seq = rand_ids(ctx)
        torch.cuda.reset_peak_memory_stats()
        times = []
        for i in range(WARM + D):
            ms, o = timed(lambda: model(input_ids=seq, use_cache=False, logits_to_keep=1))
            nxt = o.logits[:, -1, :].argmax(-1, keepdim=True)
            del o
            seq = torch.cat([seq, nxt], dim=1)
            if i >= WARM:
                times.append(ms)
        peak_gib = torch.cuda.max_memory_allocated() / 2**30
        return report_decode("no_cache_recompute", "no-cache decode (recomputes the prefix)", times,
                             f"; sequence grows {ctx}..{ctx + WARM + D - 1} tokens, every step a full forward "
                             f"without past_key_values; peak GPU memory {peak_gib:.1f} GiB")

    dec_ms = None
    if model is None:
        log("[decode] SKIPPED: no model")
    else:
        dec_ms = run_step("decode kv-cache", decode_cache)
        if dec_ms is None:
            log("[decode] the KV-cache path failed; falling back to a no-cache decode (recomputes the prefix)")
            dec_ms = run_step("decode no-cache", decode_nocache)
            if dec_ms is None:
                SUMMARY["decode_mode"] = "failed"

    # ---------------------------------------------------------------- 5. weight bytes per token
    for key in ("decode_weight_bytes_per_token", "decode_weight_GB_per_token", "decode_floor_ms_at_copy_bw",
                "decode_eff_weight_GBps", "decode_frac_copy_bw"):
        SUMMARY[key] = "na"

    def weight_bytes():
        k, E = state["k"], args.experts
        dense_b = state["n_dense"] * elt
        routed_b = state["n_routed"] * k / E * elt
        head_b = state["n_head"] * elt
        total = dense_b + routed_b + head_b
        SUMMARY["decode_weight_bytes_per_token"] = int(round(total))
        SUMMARY["decode_weight_GB_per_token"] = fmt(total / 1e9, 4)
        line = (f"[decode weights] bytes of weights read per decoded token ({args.dtype}): "
                f"dense (all but embedding / routed experts / lm_head) {dense_b / 1e9:.4f} GB + routed {k} of {E} experts "
                f"per layer {routed_b / 1e9:.4f} GB + lm_head {head_b / 1e9:.4f} GB = {total / 1e9:.4f} GB "
                f"(embedding row and KV cache not counted)")
        if copy_bw:
            floor_ms = total / (copy_bw * 1e9) * 1e3
            SUMMARY["decode_floor_ms_at_copy_bw"] = fmt(floor_ms, 4)
            line += f"; at the measured copy bandwidth {copy_bw:.1f} GB/s that is a floor of {floor_ms:.3f} ms/token"
            if dec_ms:
                eff = total / (dec_ms * 1e-3) / 1e9
                frac = eff / copy_bw
                SUMMARY["decode_eff_weight_GBps"] = fmt(eff, 1)
                SUMMARY["decode_frac_copy_bw"] = fmt(frac, 4)
                line += (f"; measured median {dec_ms:.2f} ms/token -> {eff:.1f} GB/s of weights = "
                         f"{100 * frac:.2f}% of the copy bandwidth")
                if SUMMARY.get("decode_mode") == "no_cache_recompute":
                    line += " (no-cache decode: the step recomputes the prefix, so this fraction is not a decode figure)"
        log(line)

    if state:
        run_step("decode weight bytes", weight_bytes)
    else:
        log("[decode weights] SKIPPED: no model")

    print_summary(t_start)
    return 1 if FAILED else 0


_PRINTED = []


def print_summary(t_start):
    if _PRINTED:
        return
    _PRINTED.append(True)
    SUMMARY["failed_steps"] = ",".join(FAILED) if FAILED else "none"
    SUMMARY["total_s"] = fmt(time.perf_counter() - t_start, 1)
    log("=== SUMMARY ===")
    for k, v in SUMMARY.items():
        log(f"{k}={str(v).replace(' ', '_')}")
    log("=== END SUMMARY ===")


if __name__ == "__main__":
    _t0 = time.perf_counter()
    try:
        rc = main()
    except SystemExit:
        raise
    except BaseException as exc:  # a bug outside the per-step guards: still print what was measured
        traceback.print_exc(file=sys.stderr)
        log(f"[script] FAILED: {type(exc).__name__}: {str(exc).strip()[:300]}")
        FAILED.append("script")
        print_summary(_t0)
        rc = 130 if isinstance(exc, KeyboardInterrupt) else 1
    sys.exit(rc)
