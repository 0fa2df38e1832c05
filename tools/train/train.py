#!/usr/bin/env python3
"""Trains dsv4's default model, "mini": a small DeepSeek-V4 that answers in English.

Runs on the GPU machine (PyTorch, transformers' DeepseekV4ForCausalLM, Hugging Face tokenizers).
Input: the rendered conversations of make_data.py (`dsv4 render` output, one JSON string a line,
gzipped). Output folder:
  tokenizer.json, tokenizer_config.json   byte-level BPE with DeepSeek's pre-tokenizer
  config.json, model.safetensors          the release layout: FP8 e4m3 blocks of 128x128 with
                                          ue8m0 scales, routed experts FP4 e2m1 with per-32 ue8m0
                                          scales, BF16 embeddings, head, router and compressors
  cases.json, expected.safetensors        the oracle: transformers' logits in float64 on the
                                          dequantized weights (the fixtures' method), per prompt
  reply.json                              prompt ids and the oracle's greedy reply to each
                                          question, with its smallest top-two logit gap
  train_log.csv, recipe.json              loss curve, every setting and the seed

Training is bf16 autocast over fp32 master weights, AdamW, warmup + cosine, for a wall-clock
budget. For the last quarter of the steps every weight that the export quantizes is trained
through its quantized value (straight-through), so the exported model is the one that was
trained, not a rounded copy of it.

    python3 train.py --data train.txt.gz --out OUT --seconds 420 --seed 1
"""
import argparse
import gzip
import json
import math
import os
import random
import re
import sys
import time

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers, Regex
from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

SPECIAL = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>", "<｜User｜>", "<｜Assistant｜>",
           "<think>", "</think>", "<｜System｜>"]
BOS, EOS, PAD = 0, 1, 2

# DeepSeek-V3/V4's pre-tokenizer (its tokenizer.json), then byte-level without a prefix space.
DIGITS = r"\p{N}{1,3}"
CJK = r"[一-龥぀-ゟ゠-ヿ]+"
WORDS = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
         r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

N_LOGIT_CASES = 2   # logits are stored for the first questions only: the tree travels to the GPU machine
QUESTIONS = ["What does ephemeral mean?", "What does water mean?", "Define happy.", "What is a dog?"]

CONFIG = dict(
    architectures=["DeepseekV4ForCausalLM"], model_type="deepseek_v4", torch_dtype="bfloat16",
    vocab_size=4096, hidden_size=256, num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=1,
    head_dim=64, q_lora_rank=128, o_groups=2, o_lora_rank=64, moe_intermediate_size=128,
    n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1, index_n_heads=4, index_head_dim=32,
    index_topk=8, sliding_window=64,
    layer_types=["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
                 "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"],
    compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 16},
    mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe", "moe"],
    partial_rotary_factor=0.25, rope_theta=10000.0, compress_rope_theta=160000.0,
    hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6, swiglu_limit=10.0, scoring_func="sqrtsoftplus",
    norm_topk_prob=True, routed_scaling_factor=1.5, num_nextn_predict_layers=0, tie_word_embeddings=False,
    max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=BOS, eos_token_id=EOS,
    quantization_config={"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                         "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    expert_dtype="fp4")
HF_SKIP = ("quantization_config", "expert_dtype", "architectures", "model_type", "torch_dtype")
BLOCK = 128
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def log(*a):
    print(*a, flush=True)


# ---- tokenizer -------------------------------------------------------------------------------

def train_tokenizer(lines, vocab):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(DIGITS), behavior="isolated"),
        pre_tokenizers.Split(Regex(CJK), behavior="isolated"),
        pre_tokenizers.Split(Regex(WORDS), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    split = re.compile("|".join(re.escape(s) for s in SPECIAL))
    tr = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, min_frequency=2,
                             initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator((p for l in lines for p in split.split(l) if p), trainer=tr)
    for i, s in enumerate(SPECIAL):
        assert tok.token_to_id(s) == i, s
    return tok


# ---- quantization (the release checkpoint's forms) -------------------------------------------

def pow2_ceil(x):
    return torch.exp2(torch.ceil(torch.log2(x.clamp(min=1e-30))))


def fp8_blocks(w):
    """w [N,K] -> (q e4m3 [N,K], scale [ceil(N/B), ceil(K/B)] (powers of two), dequant like w)."""
    N, K = w.shape
    sn, sk = -(-N // BLOCK), -(-K // BLOCK)
    wp = F.pad(w.float(), (0, sk * BLOCK - K, 0, sn * BLOCK - N))
    b = wp.view(sn, BLOCK, sk, BLOCK)
    s = pow2_ceil(b.abs().amax(dim=(1, 3)) / 448.0)
    q = (b / s[:, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * s[:, None, :, None]).view(sn * BLOCK, sk * BLOCK)[:N, :K]
    return q.view(sn * BLOCK, sk * BLOCK)[:N, :K].contiguous(), s, deq.to(w.dtype)


def fp4_rows(w, g=32):
    """w [..., N, K] -> (codes uint8 [..., N, K] sign<<3|mag, scale [..., N, K/g], dequant like w)."""
    *lead, K = w.shape
    wb = w.float().reshape(*lead, K // g, g)
    s = pow2_ceil(wb.abs().amax(-1) / 6.0)
    x = wb / s[..., None]
    grid = torch.tensor(E2M1, device=w.device)
    idx = (x.abs()[..., None] - grid).abs().argmin(-1)          # ties -> the lower code
    neg = (x < 0) & (idx > 0)
    vals = grid[idx] * torch.where(neg, -1.0, 1.0)
    deq = (vals * s[..., None]).reshape(*lead, K)
    code = (idx + 8 * neg.long()).reshape(*lead, K).to(torch.uint8)
    return code, s, deq.to(w.dtype)


class FakeFP8(torch.nn.Module):
    def forward(self, w):
        return w + (fp8_blocks(w)[2] - w).detach()


class FakeFP4(torch.nn.Module):
    def forward(self, w):
        return w + (fp4_rows(w)[2] - w).detach()


# ---- names: transformers -> release checkpoint -----------------------------------------------

def release_name(hf):
    n = hf[len("model."):] if hf.startswith("model.") else hf
    leaf = {"embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
            "hc_head.hc_fn": "hc_head_fn", "hc_head.hc_base": "hc_head_base", "hc_head.hc_scale": "hc_head_scale"}
    if n in leaf:
        return leaf[n]
    for a, b in [(".self_attn.compressor.indexer.scorer.weights_proj.", ".attn.indexer.weights_proj."),
                 (".self_attn.compressor.indexer.q_b_proj.", ".attn.indexer.wq_b."),
                 (".self_attn.compressor.indexer.", ".attn.indexer.compressor."),
                 (".self_attn.", ".attn."), (".mlp.", ".ffn."),
                 (".input_layernorm.", ".attn_norm."), (".post_attention_layernorm.", ".ffn_norm."),
                 (".attn_hc.fn", ".hc_attn_fn"), (".attn_hc.base", ".hc_attn_base"),
                 (".attn_hc.scale", ".hc_attn_scale"), (".ffn_hc.fn", ".hc_ffn_fn"),
                 (".ffn_hc.base", ".hc_ffn_base"), (".ffn_hc.scale", ".hc_ffn_scale"),
                 (".sinks", ".attn_sink"), (".q_a_proj.", ".wq_a."), (".q_b_proj.", ".wq_b."),
                 (".q_a_norm.", ".q_norm."), (".o_a_proj.", ".wo_a."), (".o_b_proj.", ".wo_b."),
                 (".gate.e_score_correction_bias", ".gate.bias"),
                 (".shared_experts.gate_proj.", ".shared_experts.w1."),
                 (".shared_experts.down_proj.", ".shared_experts.w2."),
                 (".shared_experts.up_proj.", ".shared_experts.w3.")]:
        n = n.replace(a, b)
    n = n.replace("compressor.kv_proj.", "compressor.wkv.").replace("compressor.gate_proj.", "compressor.wgate.")
    n = n.replace("compressor.position_bias", "compressor.ape").replace("compressor.kv_norm.", "compressor.norm.")
    return n.replace(".attn.kv_proj.", ".attn.wkv.")


BF16_KEEP = ("compressor.wkv.", "compressor.wgate.", "indexer.weights_proj.", "ffn.gate.weight", "embed.weight",
             "head.weight")


def quant_kind(hf, t):
    """'fp4' (routed experts), 'fp8', 'bf16' (kept linears) or 'f32' (everything else)."""
    if hf.endswith("experts.gate_up_proj") or hf.endswith("experts.down_proj"):
        return "fp4"
    rn = release_name(hf)
    if t.dim() == 2 and rn.endswith(".weight") and "norm" not in rn:
        return "bf16" if any(k in rn for k in BF16_KEEP) else "fp8"
    return "f32"


def add_fake_quant(model):
    from torch.nn.utils import parametrize
    for hf, p in list(model.named_parameters()):
        k = quant_kind(hf, p)
        if k in ("fp8", "fp4"):
            mod_name, pname = hf.rsplit(".", 1)
            parametrize.register_parametrization(model.get_submodule(mod_name), pname,
                                                 FakeFP8() if k == "fp8" else FakeFP4())


def export(model, cfg):
    """Release-layout tensors; installs the exact dequantized values into `model` (float64)."""
    out = {}
    params = dict(model.named_parameters())
    params.update(dict(model.named_buffers()))
    I = cfg.moe_intermediate_size
    e8 = torch.float8_e8m0fnu
    for hf, t in model.state_dict().items():
        if "rotary_emb" in hf:
            continue
        k = quant_kind(hf, t)
        if k == "fp4":
            base = release_name(hf.rsplit(".", 1)[0])
            code, s, deq = fp4_rows(t)
            parts = [("w1", slice(0, I)), ("w3", slice(I, 2 * I))] if hf.endswith("gate_up_proj") \
                else [("w2", slice(None))]
            for e in range(t.shape[0]):
                for wname, sl in parts:
                    c = code[e, sl].long()
                    packed = (c[:, 0::2] | (c[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
                    out[f"{base}.{e}.{wname}.weight"] = packed.cpu()
                    out[f"{base}.{e}.{wname}.scale"] = s[e, sl].to(e8).cpu()
            params[hf].data.copy_(deq)
            continue
        rn = release_name(hf)
        if hf.endswith("tid2eid"):
            out[rn] = t.to(torch.int32).cpu()
        elif k == "fp8":
            q, s, deq = fp8_blocks(t)
            out[rn] = q.cpu()
            out[rn[:-len("weight")] + "scale"] = s.to(e8).cpu()
            params[hf].data.copy_(deq)
        elif k == "bf16":
            b = t.to(torch.bfloat16)
            out[rn] = b.cpu()
            params[hf].data.copy_(b.double())
        else:
            out[rn] = t.float().cpu()
            params[hf].data.copy_(t.float().double())
    return {k: v.contiguous() for k, v in out.items()}


# ---- data ------------------------------------------------------------------------------------

def pack(seqs, L, rng):
    """Whole conversations packed greedily into rows of L (longer ones dropped), PAD-filled."""
    order = list(range(len(seqs)))
    rng.shuffle(order)
    rows, cur = [], []
    for i in order:
        s = seqs[i]
        if len(s) > L:
            continue
        if len(cur) + len(s) > L:
            rows.append(cur + [PAD] * (L - len(cur)))
            cur = []
        cur = cur + s
    if cur:
        rows.append(cur + [PAD] * (L - len(cur)))
    return torch.tensor(rows, dtype=torch.long)


def stable_topk():
    """The engine's rule for top-k: descending, ties to the lower index (the indexer's scores tie)."""
    def topk(self, k, dim=-1, largest=True, sorted=True):
        vals, idx = torch.sort(self, dim=dim, descending=largest, stable=True)
        return torch.return_types.topk((vals.narrow(dim, 0, k), idx.narrow(dim, 0, k)))
    torch.Tensor.topk = topk


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=420)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--qat", type=float, default=0.25, help="fraction of steps trained through quantization")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    random.seed(a.seed)
    torch.manual_seed(a.seed)
    rng = random.Random(a.seed)
    dev = "cuda"
    t0 = time.time()

    with gzip.open(a.data, "rt", encoding="utf-8") as f:
        lines = [json.loads(l) for l in f]
    log(f"data: {len(lines)} conversations, {sum(map(len, lines)) / 1e6:.1f} M chars")
    tok = train_tokenizer(lines, CONFIG["vocab_size"])
    tok.save(os.path.join(a.out, "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": SPECIAL[BOS], "eos_token": SPECIAL[EOS],
                   "pad_token": SPECIAL[PAD], "add_bos_token": False, "add_eos_token": False,
                   "model_max_length": CONFIG["max_position_embeddings"]}, f, indent=1, ensure_ascii=False)
    seqs = [e.ids for e in tok.encode_batch(lines, add_special_tokens=False)]
    n_tok = sum(map(len, seqs))
    log(f"tokenizer: vocab {tok.get_vocab_size()}, {n_tok / 1e6:.2f} M tokens, {time.time() - t0:.0f} s")

    cfg = DeepseekV4Config(**{k: v for k, v in CONFIG.items() if k not in HF_SKIP})
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"
    model = DeepseekV4ForCausalLM(cfg)
    g = torch.Generator().manual_seed(a.seed)
    for name, b in model.named_buffers():
        if name.endswith("tid2eid"):      # hash routing: a fixed random expert set per token id
            V, k = b.shape
            b.copy_(torch.stack([torch.randperm(cfg.n_routed_experts, generator=g)[:k] for _ in range(V)]))
    model.to(dev).train()
    n_par = sum(p.numel() for p in model.parameters())
    log(f"model: {n_par / 1e6:.2f} M parameters")

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    nodecay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": nodecay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8)
    rows = pack(seqs, a.seq, rng)
    log(f"rows: {rows.shape[0]} of {a.seq} tokens ({(rows != PAD).float().mean() * 100:.0f}% filled)")
    warm, step, total, epoch, pos = 100, 0, None, 0, 0
    perm = torch.randperm(rows.shape[0], generator=g)
    curve = []
    t_train = time.time()
    qat_on = False
    while total is None or step < total:
        if pos + a.batch > rows.shape[0]:
            epoch += 1
            pos = 0
            perm = torch.randperm(rows.shape[0], generator=g)
        x = rows[perm[pos:pos + a.batch]].to(dev)
        pos += a.batch
        labels = x.masked_fill(x == PAD, -100)
        lr = a.lr * min(1.0, (step + 1) / warm)
        if total is not None:
            lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, step / total)))
        for grp in opt.param_groups:
            grp["lr"] = lr
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=x, labels=labels, use_cache=False)
        loss = out.loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step == 30:        # the budget fixes the step count once a step's time is known
            torch.cuda.synchronize()
            per = (time.time() - t_train) / step
            total = max(60, int((a.seconds - (time.time() - t0)) / (per * 1.15)))
            log(f"  {per * 1e3:.0f} ms a step: {total} steps in all")
        if total is not None and not qat_on and step >= total * (1 - a.qat):
            add_fake_quant(model)
            qat_on = True
            log(f"  step {step}: training through the quantized weights from here")
        if step % 50 == 0 or step == 1:
            l = loss.item()
            curve.append((step, epoch, round(l, 4), lr, round(time.time() - t_train, 1)))
            log(f"  step {step} epoch {epoch} loss {l:.4f} lr {lr:.2e} {time.time() - t_train:.0f} s")
    with open(os.path.join(a.out, "train_log.csv"), "w") as f:
        f.write("step,epoch,loss,lr,seconds\n")
        for r in curve:
            f.write(",".join(map(str, r)) + "\n")

    # remove the parametrizations, keep the trained (unquantized) values, then export
    from torch.nn.utils import parametrize
    for name, mod in list(model.named_modules()):
        if parametrize.is_parametrized(mod):
            for pname in list(mod.parametrizations.keys()):
                parametrize.remove_parametrizations(mod, pname, leave_parametrized=False)
    model = model.double().eval()
    torch.set_grad_enabled(False)
    stable_topk()
    tensors = export(model, cfg)
    save_file(tensors, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(CONFIG, f, indent=2, ensure_ascii=False)

    # oracle: float64 logits of each question's prompt followed by the greedy reply
    prompts = ["".join([SPECIAL[BOS], SPECIAL[3], q, SPECIAL[4], SPECIAL[6]]) for q in QUESTIONS]
    cases, expected, replies = [], {}, []
    for ci, (q, p) in enumerate(zip(QUESTIONS, prompts)):
        ids = tok.encode(p, add_special_tokens=False).ids
        gen, gaps = [], []
        for _ in range(48):
            lg = model(input_ids=torch.tensor([ids + gen], device=dev), use_cache=False).logits[0, -1]
            top = torch.topk(lg, 2)
            gaps.append((top.values[0] - top.values[1]).item())
            nxt = int(top.indices[0])
            gen.append(nxt)
            if nxt == EOS:
                break
        full = ids + gen
        if ci < N_LOGIT_CASES:
            logits = model(input_ids=torch.tensor([full], device=dev), use_cache=False).logits[0]
            expected[f"case{ci}.logits"] = logits.float().cpu()
            expected[f"case{ci}.ids"] = torch.tensor(full, dtype=torch.int32)
            cases.append({"ids": full, "prefill": len(ids)})
        text = tok.decode(gen, skip_special_tokens=True)
        replies.append({"question": q, "prompt": p, "prompt_ids": ids, "reply_ids": gen, "reply": text,
                        "min_top2_gap": min(gaps)})
        log(f"  {q!r} -> {text!r} (smallest top-2 gap {min(gaps):.4f})")
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(a.out, "expected.safetensors"))
    with open(os.path.join(a.out, "cases.json"), "w") as f:
        json.dump({"cases": cases}, f)
    with open(os.path.join(a.out, "reply.json"), "w") as f:
        json.dump({"replies": replies}, f, indent=1, ensure_ascii=False)
    with open(os.path.join(a.out, "recipe.json"), "w") as f:
        json.dump({"args": vars(a), "config": CONFIG, "steps": step, "epochs": epoch, "rows": rows.shape[0],
                   "tokens": n_tok, "parameters": n_par, "final_loss": curve[-1][2] if curve else None,
                   "torch": torch.__version__, "seconds": round(time.time() - t0)}, f, indent=1, ensure_ascii=False)
    log(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
