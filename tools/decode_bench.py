#!/usr/bin/env python3
"""Times decoding over a KV cache and a variable-length prefill, flashhop beside its peers in one
run (issue grid of docs/PERFORMANCE.md's inference tables), on the GPU machine.

Decode: one query token per sequence, 32 query / 8 KV heads, d = 128, bf16, batch x cache length
1 x 1M, 64 x 32k and 128 x 8k (--cells). flashhop's flash_attn_with_kvcache over a contiguous
cache and over paged caches (--pages, shuffled page tables); FA3's flash_attn_with_kvcache (the
fa3-fwd wheel: contiguous caches only) and cuDNN through SDPA (enable_gqa, the cache as a
(batch, heads, seqlen, d) view) on the contiguous cache. Every call is captured in a CUDA graph and
the timed calls replay it (host time is not what is measured); the median of event-timed replays
after a warm-up of at least --warmup-ms. The figure is K + V bytes per second (each read once),
beside the copy bandwidth of the same GPU in the same run: a device-to-device copy of a 4 GiB
buffer, (read + write bytes) / time.

Prefill (--prefill): 16 sequences of random lengths in [128, 8192] (seed 0), causal, d = 128, 16
query / 16 KV heads: flashhop's flash_attn_varlen_func and FA3's, and flashhop's fixed-length
flash_attn_func on the same total tokens as sequences of 4096 (the fixed-length grid's cell),
TFLOP/s counting 2 * 2 * h * d * (L^2 / 2) per causal sequence of L tokens, as flashhop-bench.

Also flashhop's step with the token's key and value appended to the contiguous cache and rotated
(flashhop_append: rotary tables of d / 2 columns, causal), against the plain step.

Each peer's output is compared with flashhop's (largest absolute difference printed). --json FILE
keeps the results.
"""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import flashhop

try:
    import fa3_fwd_interface  # FlashAttention-3's forward (wheel fa3-fwd)
except ImportError:
    fa3_fwd_interface = None

NHEADS, NHEADS_KV, HEAD_DIM = 32, 8, 128


def median_ms(launch, warmup_ms, iters):
    """Median of `iters` event-timed calls of launch() after warm-up calls for warmup_ms."""
    launch()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    while (time.perf_counter() - begin) * 1e3 < warmup_ms:
        for _ in range(10):
            launch()
        torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, stop in events:
        start.record()
        launch()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in events)


def graphed(call):
    """call() captured in a CUDA graph (after one eager call on the capturing stream, so that lazy
    set-up stays outside), and its output; the graph's replay as a launcher."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        out = call()
    torch.cuda.synchronize()
    return graph.replay, out


def time_graphed(name, call, args):
    """(median ms, output) of call() replayed from a CUDA graph, or None where it cannot run this
    cell (shape, layout; printed as n/a)."""
    try:
        replay, out = graphed(call)
        return median_ms(replay, args.warmup_ms, args.iters), out
    except Exception as error:
        print(f"  {name}: n/a ({type(error).__name__}: {str(error).splitlines()[0][:120]})")
        return None


def copy_bandwidth(warmup_ms, iters):
    """Device-to-device copy of 4 GiB: (read + write bytes) per second."""
    src = torch.empty(1 << 31, dtype=torch.int16, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms(lambda: dst.copy_(src), warmup_ms, iters)
    del src, dst
    return 2 * (1 << 32) / (ms * 1e-3)


def paged_cache(k_cache, v_cache, page_size, generator):
    """The contiguous cache laid on shuffled pages of `page_size` rows, and its page table."""
    batch, seqlen = k_cache.shape[:2]
    pages_per_sequence = seqlen // page_size
    num_pages = batch * pages_per_sequence
    order = torch.randperm(num_pages, generator=generator).to("cuda")
    table = order.view(batch, pages_per_sequence).to(torch.int32)
    k_pages = torch.empty((num_pages, page_size) + k_cache.shape[2:], dtype=k_cache.dtype, device="cuda")
    v_pages = torch.empty_like(k_pages)
    k_pages[order] = k_cache.reshape(num_pages, page_size, *k_cache.shape[2:])
    v_pages[order] = v_cache.reshape(num_pages, page_size, *v_cache.shape[2:])
    return k_pages, v_pages, table


def decode_cell(batch, seqlen, pages, args, generator):
    torch.manual_seed(0)
    q = torch.randn(batch, 1, NHEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    k_cache = torch.randn(batch, seqlen, NHEADS_KV, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    v_cache = torch.randn_like(k_cache)
    cache_seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    kv_bytes = 2 * k_cache.numel() * k_cache.element_size()
    row = {"batch": batch, "seqlen_k": seqlen}
    outputs = {}

    def run(name, call):
        timed = time_graphed(name, call, args)
        if timed is None:
            return
        ms, out = timed
        outputs[name] = out.reshape(batch, NHEADS, HEAD_DIM).float()
        row[name] = {"ms": ms, "kv_tbps": kv_bytes / (ms * 1e-3) / 1e12}
        print(f"  {name}: {ms * 1e3:.1f} us, {row[name]['kv_tbps']:.2f} TB/s")

    run("flashhop", lambda: flashhop.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens))
    for page in pages:
        k_pages, v_pages, table = paged_cache(k_cache, v_cache, page, generator)
        run(f"flashhop_page{page}", lambda: flashhop.flash_attn_with_kvcache(
            q, k_pages, v_pages, cache_seqlens=cache_seqlens, page_table=table))
        del k_pages, v_pages, table
    if fa3_fwd_interface is not None:
        run("fa3", lambda: fa3_fwd_interface.flash_attn_with_kvcache(q, k_cache, v_cache, cache_seqlens=cache_seqlens,
                                                                      num_splits=0))
    q_sdpa, k_sdpa, v_sdpa = (t.transpose(1, 2) for t in (q, k_cache, v_cache))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q_sdpa, k_sdpa, v_sdpa, enable_gqa=True).transpose(1, 2)
    run("cudnn", cudnn)
    # Last, as it writes the cache's last row: the same step with the token's key and value
    # appended there and rotated.
    k_new, v_new = (torch.randn(batch, 1, NHEADS_KV, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    angles = torch.rand(seqlen, HEAD_DIM // 2, device="cuda")
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    before = cache_seqlens - 1
    run("flashhop_append", lambda: flashhop.flash_attn_with_kvcache(
        q, k_cache, v_cache, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin, cache_seqlens=before, causal=True))
    del cos, sin, angles
    if "flashhop" in outputs:
        for name, out in outputs.items():
            if name not in ("flashhop", "flashhop_append"):
                row[name]["max_diff"] = (out - outputs["flashhop"]).abs().max().item()
    return row


def prefill(args):
    """16 causal sequences of random lengths, varlen, against the fixed-length call on as many tokens."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(128, 8193, (16,), generator=generator).tolist()
    heads = 16
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(total, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    flops = sum(4 * heads * HEAD_DIM * n * n / 2 for n in lengths)
    result = {"lengths": lengths}
    outputs = {}

    def run(name, call, call_flops):
        timed = time_graphed(name, call, args)
        if timed is None:
            return
        ms, outputs[name] = timed
        result[name] = {"ms": ms, "tflops": call_flops / (ms * 1e-3) / 1e12}
        print(f"  {name}: {ms:.3f} ms, {result[name]['tflops']:.0f} TFLOP/s")

    longest = max(lengths)
    run("flashhop_varlen", lambda: flashhop.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest, causal=True),
        flops)
    if fa3_fwd_interface is not None:
        run("fa3_varlen", lambda: fa3_fwd_interface.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest,
                                                                           causal=True), flops)
        if "flashhop_varlen" in outputs and "fa3_varlen" in outputs:
            result["fa3_varlen"]["max_diff"] = (outputs["fa3_varlen"].float() -
                                                outputs["flashhop_varlen"].float()).abs().max().item()
    seqlen = 4096
    batch = max(1, round(total / seqlen))
    qf, kf, vf = (torch.randn(batch, seqlen, heads, HEAD_DIM, dtype=torch.bfloat16, device="cuda") for _ in range(3))
    run(f"flashhop_fixed_{batch}x{seqlen}", lambda: flashhop.flash_attn_func(qf, kf, vf, causal=True),
        batch * 4 * heads * HEAD_DIM * seqlen * seqlen / 2)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cells", default="1x1048576,64x32768,128x8192", help="batch x cache length, comma-separated")
    parser.add_argument("--pages", default="16,64", help="page sizes of the paged caches, comma-separated")
    parser.add_argument("--prefill", action="store_true", help="also the variable-length prefill")
    parser.add_argument("--warmup-ms", type=float, default=1000.0)
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, FA3 wheel: {fa3_fwd_interface is not None}")
    copy = copy_bandwidth(args.warmup_ms, args.iters)
    print(f"copy bandwidth (read + write): {copy / 1e12:.2f} TB/s")
    pages = [int(p) for p in args.pages.split(",") if p]
    generator = torch.Generator().manual_seed(0)
    rows = []
    for cell in args.cells.split(","):
        batch, seqlen = (int(x) for x in cell.split("x"))
        print(f"decode {batch} x {seqlen}")
        rows.append(decode_cell(batch, seqlen, pages, args, generator))
        torch.cuda.empty_cache()
    names = ["flashhop", "flashhop_append"] + [f"flashhop_page{p}" for p in pages] + ["fa3", "cudnn"]
    print("\n| batch x keys | " + " | ".join(names) + " | flashhop / copy | flashhop / best peer |")
    print("|---" * (len(names) + 3) + "|")
    for row in rows:
        cells = [f"{row[n]['kv_tbps']:.2f}" if n in row else "n/a" for n in names]
        peers = [row[n]["kv_tbps"] for n in ("fa3", "cudnn") if n in row]
        ours = row.get("flashhop", {}).get("kv_tbps", math.nan)
        best = max(peers) if peers else math.nan
        print(f"| {row['batch']} x {row['seqlen_k']} | " + " | ".join(cells) +
              f" | {ours / (copy / 1e12):.3f} | {ours / best:.3f} |")
    result = {"device": torch.cuda.get_device_name(), "copy_tbps": copy / 1e12, "decode": rows}
    if args.prefill:
        print("prefill, 16 causal sequences")
        result["prefill"] = prefill(args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
