#!/usr/bin/env python3
"""Times PyTorch scaled_dot_product_attention (cuDNN and FlashAttention-2 backends), and
FlashAttention-3's forward where it is installed, on the grid of `flashhop-bench --sweep peers` or
`--sweep gqa`, in the same way, and prints one side-by-side table.

Grids, bf16, layout (batch, seqlen, nheads, d) as flashhop takes it, handed to SDPA as
(batch, nheads, seqlen, d) views (transpose(1, 2), no copy):
  peers (PEERS.md): d in {64, 128, 256}, nheads = 2048 / d, seqlen in {512, ..., 16384} with
        batch = 16384 / seqlen, causal no / yes.
  gqa:  d = 128, 32 query / 8 KV heads (SDPA's enable_gqa): decode (seqlen_q 1) batch 64 x
        seqlen_k 32768 and batch 8 x 8192; seqlen_q 16 and 128, seqlen_k 8192, batch 8, causal
        no / yes. flashhop-bench runs each with --pack-gqa on and off; the table shows both.

Method (the tool library's device/METHOD.md, as flashhop-bench): random normal inputs, as many input
sets as it takes to exceed three times the L2 cache, rotated between calls; warm-up calls (by count
and, with --warmup-ms, by time), then one CUDA event pair around each timed call and the median.
Each timing also gives the host's time to enqueue a call (median_time_ms); where it nears the
median, the log flags the cell HOST-BOUND: the GPU waited inside the event pairs for the host, and
the figure times the host. --graphs times CUDA-graph replays of each call instead (time_backend),
which take the host a few microseconds.
TFLOP/s with the FlashAttention convention, 4 * b * h * pairs * d, pairs = sq * sk, half for causal
with sq == sk, else the exact count of the bottom-right causal band (as flashhop-bench). K/V TB/s:
b * sk * h_kv * 2d * 2 bytes over the time, K and V counted once (the figure that bounds decoding).

Masks: flashhop's causal mask is aligned to the bottom-right corner. SDPA's is_causal is aligned to
the top-left, the same mask when seqlen_q == seqlen_k; otherwise the FA2 backend gets
causal_lower_right(sq, sk), which it runs as FA2's own causal mask (an error if the flash kernel
refuses: with sdpa_kernel(FLASH_ATTENTION) nothing else may run it), and the cuDNN backend, whose
causal mask in SDPA is top-left only, is not run.

FA3: the module `fa3_fwd_interface` of the PyPI wheel fa3-fwd (a forward-only build of
FlashAttention-3's hopper/ sources, CUDA 13.0, PyTorch's stable ABI; scripts/fetch_peers.sh fetches
it, scripts/gpu_run.sh installs it on the GPU machine), called as `flash_attn_func(q, k, v,
causal=..., num_splits=0)` on the (batch, seqlen, nheads, d) tensors (K/V with their own head count
for GQA); its mask is bottom-right, as flashhop's. Without it the FA3 column reads n/a.

cuDNN + LSE (`--backends` with cudnn_lse, not a default column): ATen's cuDNN attention op called
with compute_log_sumexp, as SDPA calls it for a training forward, so that cuDNN writes its rows'
LSE (float32) as flashhop's timed calls (without --no-lse), FA2's and FA3's do; SDPA's inference
call, the cuDNN column, asks for none.

Each peer's output on the first input set is compared with that of the first peer that ran (cuDNN,
else FA2): the largest absolute difference is printed and kept in the JSON, so that a peer that
computes something else shows.

With --flashhop-json FILE (flashhop-bench --json output of the same sweep) the table gets flashhop
columns and flashhop / best peer (in speed; for gqa, the faster of packed and unpacked). Runs on the
GPU machine: python3 with torch (and the FA3 wheel for its column).
"""
import argparse
import collections
import contextlib
import json
import math
import statistics
import time
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

try:
    import fa3_fwd_interface  # FlashAttention-3's forward (wheel fa3-fwd)
    FA3_MISSING = None
except (ImportError, OSError) as error:
    fa3_fwd_interface = None
    FA3_MISSING = f"not run: FA3 not installed ({error})"

SDPA_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "fa2": SDPBackend.FLASH_ATTENTION}
KNOWN_BACKENDS = ("cudnn", "cudnn_lse", "fa2", "fa3")
BACKENDS = ("cudnn", "fa2", "fa3")  # the default columns
BACKEND_TITLES = {"cudnn": "cuDNN", "cudnn_lse": "cuDNN + LSE", "fa2": "FA2", "fa3": "FA3"}
L2_MULTIPLE = 3  # rotated inputs span at least this many L2 caches
MAX_INPUT_SETS = 64
GEMM_SIZE = 8192


def peers_cell(head_dim, seqlen, causal):
    """One configuration of the peers grid (PEERS.md): 16384 tokens, 2048 / d heads, bf16."""
    return {"batch": 16384 // seqlen, "seqlen_q": seqlen, "seqlen_k": seqlen, "nheads": 2048 // head_dim,
            "nheads_kv": 2048 // head_dim, "head_dim": head_dim, "dtype": "bf16", "causal": causal}


def peers_grid(head_dims, seqlens):
    for head_dim in head_dims:
        for causal in (False, True):
            for seqlen in seqlens:
                yield peers_cell(head_dim, seqlen, causal)


def gqa_grid():
    shapes = [(64, 1, 32768, False), (8, 1, 8192, False)]
    shapes += [(8, seqlen_q, 8192, causal) for seqlen_q in (16, 128) for causal in (False, True)]
    for batch, seqlen_q, seqlen_k, causal in shapes:
        yield {"batch": batch, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "nheads": 32, "nheads_kv": 8,
               "head_dim": 128, "dtype": "bf16", "causal": causal}


def bottom_right_causal(c):
    return c["causal"] and c["seqlen_q"] != c["seqlen_k"]


def forward_flops(c):
    sq, sk = c["seqlen_q"], c["seqlen_k"]
    if not c["causal"]:
        pairs = sq * sk
    elif sq == sk:
        pairs = sq * sk / 2
    else:  # query i sees keys 0 .. i + sk - sq
        pairs = sum(min(sk, max(0, i + sk - sq + 1)) for i in range(sq))
    return 4.0 * c["batch"] * c["nheads"] * pairs * c["head_dim"]


def kv_bytes(c):
    return c["batch"] * c["seqlen_k"] * c["nheads_kv"] * 2 * c["head_dim"] * 2


Timing = collections.namedtuple("Timing", "ms host_ms")
HOST_BOUND = 0.9  # host enqueue time per call over the median GPU time at which a timing is host-bound
HOST_PROBE_CALLS = 20  # timed calls whose enqueue time gives the host's time per call


def median_time_ms(launch, warmup, iters, warmup_ms=0.0):
    """Median of `iters` event-timed calls of launch(i) after a warm-up of at least `warmup` calls
    and `warmup_ms` milliseconds of wall-clock time (as flashhop-bench: then batches of about 50 ms
    of calls, each waited for). The warm-up's clock starts once the first call has ended: cuDNN's
    first call of a shape builds its execution plan on the host for a second or more, with the GPU
    idle, which otherwise takes the place of the warm-up, so that the timed calls of a short shape
    ran on a GPU not yet at its power limit (docs/PERFORMANCE.md, Method).
    Returns Timing(ms, host_ms): host_ms is the host's time per call to enqueue the first
    HOST_PROBE_CALLS timed calls with their events, right after a synchronize, too few to fill the
    launch queue (a full queue would hold the host back to the GPU's pace). Where it nears ms
    (HOST_BOUND), the stream runs dry between calls: the GPU waits inside each event pair for the
    host to enqueue the call, and the median times the host, not the GPU."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
    launch(0)
    torch.cuda.synchronize()
    begin = time.perf_counter()
    calls = 1
    while calls < warmup:
        launch(calls)
        calls += 1
    if warmup_ms > 0:
        torch.cuda.synchronize()
        call_ms = (time.perf_counter() - begin) * 1e3 / (calls - 1) if calls > 1 else 0.0
        batch = min(100000, max(1, int(50 / call_ms))) if call_ms > 0 else 1
        while (time.perf_counter() - begin) * 1e3 < warmup_ms:
            for _ in range(batch):
                launch(calls)
                calls += 1
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    probe_calls = min(HOST_PROBE_CALLS, iters)
    enqueue_begin = time.perf_counter()
    for i, (start, stop) in enumerate(events):
        start.record()
        launch(calls + i)
        stop.record()
        if i + 1 == probe_calls:
            host_ms = (time.perf_counter() - enqueue_begin) * 1e3 / probe_calls
    torch.cuda.synchronize()
    return Timing(statistics.median(start.elapsed_time(stop) for start, stop in events), host_ms)


def gemm_tflops(warmup, iters, warmup_ms):
    a = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(GEMM_SIZE, GEMM_SIZE, device="cuda", dtype=torch.bfloat16)
    ms = median_time_ms(lambda i: torch.matmul(a, b), warmup, iters, warmup_ms).ms
    return 2.0 * GEMM_SIZE ** 3 / (ms * 1e-3) / 1e12


def input_sets(c, l2_bytes):
    """Random (q, k, v) sets in flashhop's layout, enough of them to defeat the L2 cache."""
    b, d = c["batch"], c["head_dim"]
    q_shape = (b, c["seqlen_q"], c["nheads"], d)
    kv_shape = (b, c["seqlen_k"], c["nheads_kv"], d)
    set_bytes = 2 * math.prod(q_shape) * 2 + kv_bytes(c)  # q and the output, k and v, bf16
    count = max(1, min(MAX_INPUT_SETS, math.ceil(L2_MULTIPLE * l2_bytes / set_bytes)))
    return [tuple(torch.randn(shape, device="cuda", dtype=torch.bfloat16)
                  for shape in (q_shape, kv_shape, kv_shape))
            for _ in range(count)]


def not_matched(backend, c):
    """Why `backend` has no run of c's problem through SDPA, or None."""
    if backend in ("cudnn", "cudnn_lse") and bottom_right_causal(c):
        return "not run: SDPA's cuDNN causal mask is top-left only, flashhop's is bottom-right"
    if backend == "cudnn_lse" and c["nheads"] != c["nheads_kv"]:
        return "not run: ATen's cuDNN attention op takes equal head counts"
    if backend == "fa3":
        return FA3_MISSING
    return None


def in_backend_layout(backend, tensors):
    """SDPA's backends take and return (batch, nheads, seqlen, d): flashhop's layout transposed (views,
    no copy); FA3 takes flashhop's layout as it is. The transpose is its own inverse, so the same call
    brings a backend's output back to flashhop's layout."""
    return tuple(tensors) if backend == "fa3" else tuple(t.transpose(1, 2) for t in tensors)


def attention_call(backend, c):
    """A function of one (q, k, v) set in_backend_layout(backend) that runs `backend` on it and returns
    O in that layout; SDPA's backends run it inside backend_context(backend) only."""
    if backend == "cudnn_lse":
        # SDPA's cuDNN call of a training forward: the same kernel family, with the row LSE
        # (softmax stats, float32) written, as flashhop's and FA3's calls write theirs. SDPA itself
        # asks for it only when an input requires grad.
        return lambda q, k, v: torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, dropout_p=0.0, is_causal=c["causal"])[0]
    if backend == "fa3":
        # num_splits=0: FA3 picks the split-KV count itself (one wherever the query tiles fill the
        # SMs, as on the whole peers grid; more for decoding), as its KV-cache entry point does.
        return lambda q, k, v: fa3_fwd_interface.flash_attn_func(q, k, v, causal=c["causal"], num_splits=0)
    if bottom_right_causal(c):
        mask = {"attn_mask": causal_lower_right(c["seqlen_q"], c["seqlen_k"])}
    else:
        mask = {"is_causal": c["causal"]}
    enable_gqa = c["nheads"] != c["nheads_kv"]
    return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa, **mask)


def backend_context(backend):
    return sdpa_kernel(SDPA_BACKENDS[backend]) if backend in SDPA_BACKENDS else contextlib.nullcontext()


def time_backend(backend, c, sets, warmup, iters, warmup_ms, graphs=False):
    """Timing of `backend` on c over the rotated input sets. With `graphs`, each set's call is
    captured once in a CUDA graph and the timed calls replay them: a replay costs the host a few
    microseconds, so a backend whose eager call takes the host longer than the GPU is timed on the
    GPU's work alone. Before the captures each call runs once eagerly on the capturing stream, as
    PyTorch's recipe has it, so that lazy set-up (cuDNN's plan, per-stream handles and workspaces)
    happens outside the graphs."""
    call = attention_call(backend, c)
    # Laid out once, so that a timed call only launches: per-call transposes held short calls (decoding,
    # about 80 us) back on the CPU.
    inputs = [in_backend_layout(backend, qkv) for qkv in sets]
    with backend_context(backend):
        if not graphs:
            return median_time_ms(lambda i: call(*inputs[i % len(inputs)]), warmup, iters, warmup_ms)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for qkv in inputs:
                call(*qkv)
        torch.cuda.synchronize()
        captured = []
        for qkv in inputs:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=side):
                call(*qkv)
            captured.append(graph)
        return median_time_ms(lambda i: captured[i % len(captured)].replay(), warmup, iters, warmup_ms)


def max_differences(c, qkv, backends):
    """Largest |O - O_ref| of each backend in `backends` on one input set, the reference being the
    first of them; the reference itself is left out."""
    outputs = {}
    for name in backends:
        with backend_context(name):
            out = attention_call(name, c)(*in_backend_layout(name, qkv))
        (outputs[name],) = in_backend_layout(name, (out.float(),))
    reference = outputs[backends[0]]
    return {name: (out - reference).abs().max().item() for name, out in outputs.items()
            if name != backends[0]}


def config_key(c, pack_gqa="auto"):
    """With c's pack_gqa where it has one (flashhop-bench's JSON), else `pack_gqa`."""
    return (c["head_dim"], bool(c["causal"]), c["seqlen_q"], c["seqlen_k"], c["batch"], c["nheads"],
            c["nheads_kv"], c.get("pack_gqa", pack_gqa))


def load_flashhop(path):
    with open(path) as f:
        report = json.load(f)
    return {config_key(r["config"]): r for r in report["results"]}, report


def flashhop_result(flashhop, c, pack_gqa="auto"):
    """flashhop-bench's result for peer configuration c, or None."""
    return flashhop.get(config_key(c, pack_gqa)) if flashhop is not None else None


def flashhop_cell(ours, value):
    if ours is None:
        return "-"
    if ours["status"] != "ok":
        return "error"
    failed = ours.get("check") is not None and not ours["check"]["passed"]
    return value(ours) + (" (check FAILED)" if failed else "")


def peer_cell(peer, value):
    return value(peer) if "ms" in peer else "n/a" if "skipped" in peer else "error"


def markdown_table(results, flashhop, backends):
    lines = ["| d | causal | seqlen (batch) | flashhop | " + " | ".join(BACKEND_TITLES[n] for n in backends)
             + " | flashhop / best peer |",
             "|---|---|---|---|" + "---|" * len(backends) + "---|"]
    for r in results:
        c = r["config"]
        peers = [r["backends"][name].get("tflops") for name in backends]
        cells = [peer_cell(r["backends"][name], lambda p: f"{p['tflops']:.0f}") for name in backends]
        ours = flashhop_result(flashhop, c)
        ours_cell = flashhop_cell(ours, lambda o: f"{o['tflops']:.0f}")
        best = max((t for t in peers if t is not None), default=None)
        ok = ours is not None and ours["status"] == "ok"
        ratio_cell = f"{ours['tflops'] / best:.2f}" if ok and best else "-"
        lines.append(f"| {c['head_dim']} | {'yes' if c['causal'] else 'no'} | "
                     f"{c['seqlen_q']} ({c['batch']}) | {ours_cell} | " + " | ".join(cells) + f" | {ratio_cell} |")
    return "\n".join(lines)


def gqa_table(results, flashhop, backends):
    """K/V TB/s (TFLOP/s) of flashhop packed and unpacked and of each peer, one row per shape."""
    lines = ["| seqlen_q | seqlen_k | batch | causal | flashhop packed | flashhop unpacked | "
             + " | ".join(BACKEND_TITLES[n] for n in backends) + " | flashhop / best peer |",
             "|---|---|---|---|---|---|" + "---|" * len(backends) + "---|"]

    def value(r):
        return f"{r['kv_tbps']:.2f} ({r['tflops']:.0f})"

    for r in results:
        c = r["config"]
        ours = [flashhop_result(flashhop, c, pack_gqa) for pack_gqa in ("on", "off")]
        peers = [r["backends"][name] for name in backends]
        ours_ms = [o["ms"] for o in ours if o is not None and o["status"] == "ok"]
        peers_ms = [p["ms"] for p in peers if "ms" in p]
        ratio_cell = f"{min(peers_ms) / min(ours_ms):.2f}" if ours_ms and peers_ms else "-"
        cells = [flashhop_cell(o, value) for o in ours] + [peer_cell(p, value) for p in peers]
        lines.append(f"| {c['seqlen_q']} | {c['seqlen_k']} | {c['batch']} | "
                     f"{'yes' if c['causal'] else 'no'} | " + " | ".join(cells) + f" | {ratio_cell} |")
    return "\n".join(lines)


def host_note(peer):
    return f" host {peer['host_ms']:.3f} ms/call" + (" (HOST-BOUND)" if peer["host_bound"] else "")


def difference_note(peer):
    if "max_abs_diff" not in peer:
        return ""
    d = peer["max_abs_diff"]
    return f" (max |O - {BACKEND_TITLES[d['against']]}| {d['value']:.2g})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", metavar="OUT", help="write every result as JSON")
    parser.add_argument("--flashhop-json", metavar="FILE", help="flashhop-bench --json output to merge")
    parser.add_argument("--sweep", choices=("peers", "gqa"), default="peers",
                        help="the flashhop-bench sweep to mirror")
    parser.add_argument("--head-dims", default="64,128,256", help="subset of the peers grid's head dims")
    parser.add_argument("--seqlens", default="512,1024,2048,4096,8192,16384",
                        help="subset of the peers grid's sequence lengths")
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--warmup-ms", type=float, default=0.0,
                        help="the warm-up also lasts at least this many milliseconds (wall clock)")
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--graphs", action="store_true",
                        help="time CUDA graph replays of each call instead of eager calls (time_backend)")
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="peers to run, of " + ", ".join(KNOWN_BACKENDS) + " (cudnn_lse: cuDNN writing its "
                             "LSE as well)")
    args = parser.parse_args()
    backends = args.backends.split(",")
    if unknown := [name for name in backends if name not in KNOWN_BACKENDS]:
        parser.error(f"unknown backends {unknown}, known: {', '.join(KNOWN_BACKENDS)}")

    if not torch.cuda.is_available():
        sys.exit("peers_sdpa.py: no CUDA device visible to torch")
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 50 << 20)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {l2_bytes >> 20} MiB; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, cuDNN {torch.backends.cudnn.version()}; "
          f"FA3: {FA3_MISSING or fa3_fwd_interface.__file__}")
    gemm = gemm_tflops(args.warmup, args.iters, args.warmup_ms)
    print(f"torch.matmul bf16 {GEMM_SIZE}^3: {gemm:.1f} TFLOP/s (median)\n", flush=True)

    if args.sweep == "peers":
        grid = peers_grid([int(x) for x in args.head_dims.split(",")],
                          [int(x) for x in args.seqlens.split(",")])
    else:
        grid = gqa_grid()
    results = []
    for c in grid:
        sets = input_sets(c, l2_bytes)
        entry = {"config": c, "input_sets": len(sets), "backends": {}}
        for name in backends:
            if reason := not_matched(name, c):
                entry["backends"][name] = {"skipped": reason}
                continue
            try:
                ms, host_ms = time_backend(name, c, sets, args.warmup, args.iters, args.warmup_ms, args.graphs)
                entry["backends"][name] = {"ms": ms, "tflops": forward_flops(c) / (ms * 1e-3) / 1e12,
                                           "kv_tbps": kv_bytes(c) / (ms * 1e-3) / 1e12, "host_ms": host_ms,
                                           "host_bound": host_ms >= HOST_BOUND * ms}
            except RuntimeError as error:  # e.g. no kernel of this backend for the configuration
                torch.cuda.synchronize()
                entry["backends"][name] = {"error": str(error).splitlines()[0]}
        ran = [name for name in backends if "ms" in entry["backends"][name]]
        if len(ran) > 1:
            for name, difference in max_differences(c, sets[0], ran).items():
                entry["backends"][name]["max_abs_diff"] = {"against": ran[0], "value": difference}
        del sets
        results.append(entry)
        cells = "  ".join(f"{BACKEND_TITLES[n]} " + (f"{r['ms']:.3f} ms {r['tflops']:.1f} TFLOP/s "
                                                     f"{r['kv_tbps']:.2f} TB/s K/V" + host_note(r)
                                                     + difference_note(r)
                                                     if "ms" in r
                                                     else r["skipped"] if "skipped" in r
                                                     else f"ERROR {r['error']}")
                          for n, r in entry["backends"].items())
        print(f"d={c['head_dim']} causal={'yes' if c['causal'] else 'no'} sq={c['seqlen_q']} "
              f"sk={c['seqlen_k']} b={c['batch']} h={c['nheads']}/{c['nheads_kv']}: {cells}", flush=True)

    flashhop = None
    if args.flashhop_json:
        flashhop, report = load_flashhop(args.flashhop_json)
        print(f"\nflashhop-bench's cuBLAS bf16 GEMM: {report['gemm']['tflops']} TFLOP/s")
    if args.sweep == "peers":
        print("\nTFLOP/s, forward, bf16:\n")
        print(markdown_table(results, flashhop, backends))
    else:
        print("\nK/V TB/s (TFLOP/s), forward, bf16, d = 128, 32 query / 8 KV heads; flashhop packed: "
              "--pack-gqa on:\n")
        print(gqa_table(results, flashhop, backends))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "peers_sdpa.py", "sweep": args.sweep, "device": props.name,
                       "torch": torch.__version__, "cuda": torch.version.cuda,
                       "cudnn": torch.backends.cudnn.version(), "gemm_bf16_tflops": gemm,
                       "warmup": args.warmup, "warmup_ms": args.warmup_ms, "iters": args.iters,
                       "graphs": args.graphs, "results": results}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
