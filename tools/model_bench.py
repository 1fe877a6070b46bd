#!/usr/bin/env python3
"""End-to-end speed of a Llama-style model of about 1.2B parameters (Llama 3.2 1B's shape: 16
layers, hidden 2048, 32 query and 8 KV heads of head dim 64, MLP 8192, vocabulary 128256; random
weights from the config, bfloat16, one GPU) with its attention run by each of:
  flashhop           attn_implementation="flashhop" (flashhop.integrations.transformers)
  sdpa_cudnn         attn_implementation="sdpa" inside sdpa_kernel(CUDNN_ATTENTION); where cuDNN
                     refuses transformers' grouped-query call (enable_gqa), the same with the KV
                     heads repeated first, as transformers does whenever it passes a mask (marked *)
  flash_attention_3  attn_implementation="flash_attention_3", where transformers finds
                     FlashAttention-3 (its flash_attn_interface package); reported unavailable otherwise
  identity           attention replaced by its query (no attention at all): the rest of the step
and prints one markdown table.

Rows: prefill, batch 1, of 8k, 32k and 128k tokens (the forward without a cache, logits of the last
position only), in tokens/s; a training step, batch 1, of 8k and 32k tokens: forward and backward
of the decoder stack with the loss mean(h^2) of its last hidden states. The LM head and its
cross-entropy are left out of the step: they are the same for every attention, and the float32
logits of 32k tokens over a 128k vocabulary alone would take 16 GB. attention share: 1 - t(identity)
/ t(implementation), the part of the time that goes away without attention (its kernels, and the
layout work around them).

Method: one model, its attention switched with set_attn_implementation; per cell, --warmup untimed
calls, then --iters calls timed one CUDA event pair each, the median reported. A cell that fails
(out of memory, a backend that refuses the shapes) shows its error instead of a number.
Runs on the GPU machine: python3 with torch, transformers 5 and the flashhop package importable.
"""
import argparse
import contextlib
import json
import statistics

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AttentionInterface, AutoModelForCausalLM, LlamaConfig
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask
from transformers.utils import is_flash_attn_3_available

import flashhop.integrations.transformers  # noqa: F401  (registers attn_implementation="flashhop")

LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                rope_theta=500000.0, tie_word_embeddings=True)


def identity_attention(module, query, key, value, attention_mask, **kwargs):
    """No attention: the query, in the (batch, seqlen, nheads, head_dim) layout attention returns."""
    return query.transpose(1, 2), None


def sdpa_repeat_kv_attention(module, query, key, value, attention_mask, **kwargs):
    """transformers' SDPA attention given as many KV heads as query heads."""
    groups = query.shape[1] // key.shape[1]
    return sdpa_attention_forward(module, query, repeat_kv(key, groups), repeat_kv(value, groups), attention_mask,
                                  **kwargs)


AttentionInterface.register("identity", identity_attention)
AttentionMaskInterface.register("identity", flash_attention_mask)
AttentionInterface.register("sdpa_repeat_kv", sdpa_repeat_kv_attention)
AttentionMaskInterface.register("sdpa_repeat_kv", AttentionMaskInterface._global_mapping["sdpa"])

# name: (attn_implementation, the context its calls run in)
IMPLEMENTATIONS = {
    "flashhop": ("flashhop", contextlib.nullcontext),
    "sdpa_cudnn": ("sdpa", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
    "flash_attention_3": ("flash_attention_3", contextlib.nullcontext),
    "identity": ("identity", contextlib.nullcontext),
}


def median_ms(call, warmup, iters):
    for _ in range(warmup):
        call()
    times = []
    for _ in range(iters):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        call()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end))
    return statistics.median(times)


def prefill(model, ids):
    with torch.no_grad():
        model(ids, use_cache=False, logits_to_keep=1)


def training_step(model, ids):
    model.zero_grad(set_to_none=True)
    hidden = model.model(ids, use_cache=False).last_hidden_state
    hidden.float().square().mean().backward()


def run_cell(model, implementation, work, seqlen, args):
    """The cell's median time in ms, or the error that stopped it."""
    attn_implementation, context = IMPLEMENTATIONS[implementation]
    if implementation == "flash_attention_3" and not is_flash_attn_3_available():
        return {"error": "unavailable: transformers finds no FlashAttention-3 (flash_attn_interface)"}
    cell = time_cell(model, attn_implementation, context, work, seqlen, args)
    if implementation == "sdpa_cudnn" and "error" in cell:
        cell = dict(time_cell(model, "sdpa_repeat_kv", context, work, seqlen, args), variant="sdpa_repeat_kv",
                    sdpa_error=cell["error"])
    return cell


def time_cell(model, attn_implementation, context, work, seqlen, args):
    ids = torch.randint(0, LLAMA_1B["vocab_size"], (1, seqlen), device="cuda")
    try:
        model.set_attn_implementation(attn_implementation)
        model.train(work is training_step)
        with context():
            return {"ms": median_ms(lambda: work(model, ids), args.warmup, args.iters)}
    except (RuntimeError, ValueError, ImportError, NotImplementedError) as error:
        first_line = str(error).split("\n", 1)[0][:120]
        return {"error": f"{type(error).__name__}: {first_line}"}
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def tokens(seqlen):
    return f"{seqlen // 1024}k" if seqlen % 1024 == 0 else str(seqlen)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prefill", type=int, nargs="*", default=[8192, 32768, 131072], help="prefill lengths")
    parser.add_argument("--train", type=int, nargs="*", default=[8192, 32768], help="training-step lengths")
    parser.add_argument("--implementations", nargs="+", default=list(IMPLEMENTATIONS), choices=list(IMPLEMENTATIONS))
    parser.add_argument("--layers", type=int, default=LLAMA_1B["num_hidden_layers"],
                        help="decoder layers (fewer: quicker)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    config = LlamaConfig(**dict(LLAMA_1B, num_hidden_layers=args.layers))
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    parameters = sum(p.numel() for p in model.parameters())
    device = torch.cuda.get_device_name()
    print(f"{device}, torch {torch.__version__}, Llama-style model of {parameters / 1e9:.2f}B parameters "
          f"({args.layers} layers), bfloat16, batch 1; median of {args.iters} after {args.warmup} warm-up calls")

    rows = [("prefill", prefill, seqlen) for seqlen in args.prefill]
    rows += [("training step", training_step, seqlen) for seqlen in args.train]
    results = []
    for kind, work, seqlen in rows:
        cells = {name: run_cell(model, name, work, seqlen, args) for name in args.implementations}
        for cell in cells.values():
            if "ms" in cell:
                cell["tokens_per_s"] = seqlen / cell["ms"] * 1e3
        identity_ms = cells.get("identity", {}).get("ms")
        for name, cell in cells.items():
            if name != "identity" and "ms" in cell and identity_ms is not None:
                cell["attention_share"] = 1.0 - identity_ms / cell["ms"]
        results.append({"row": kind, "seqlen": seqlen, "cells": cells})

    shown = [name for name in args.implementations if name != "identity"]
    print("\n| row | tokens | " + " | ".join(f"{name} tokens/s (attention share)" for name in shown) + " |")
    print("|---|---|" + "---|" * len(shown))
    for result in results:
        texts = []
        for name in shown:
            cell = result["cells"][name]
            if "ms" not in cell:
                texts.append(cell["error"])
            else:
                share = cell.get("attention_share")
                texts.append(f"{cell['tokens_per_s']:,.0f}" + ("*" if "variant" in cell else "")
                             + ("" if share is None else f" ({share:.0%})"))
        print(f"| {result['row']} | {tokens(result['seqlen'])} | " + " | ".join(texts) + " |")
    if any("variant" in cell for result in results for cell in result["cells"].values()):
        print("\n* cuDNN refused transformers' grouped-query SDPA call; timed with the KV heads repeated first")
    if "identity" in args.implementations:
        print("\nidentity (no attention): " + ", ".join(
            f"{r['row']} {tokens(r['seqlen'])} {r['cells']['identity'].get('tokens_per_s', 0):,.0f} tokens/s"
            for r in results))
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"device": device, "torch": torch.__version__, "parameters": parameters, "layers": args.layers,
                       "warmup": args.warmup, "iters": args.iters, "results": results}, out, indent=2)


if __name__ == "__main__":
    main()
