#!/usr/bin/env python3
"""How evenly the causal tile queue (src/kernels/sm90/tile_scheduler.h) spreads work over the CTAs.

  tools/simulate_queue.py [--ctas 132] [--overhead 2] [--block-m 128] [--noise 0] [--tail-heads N]

A model, not a measurement: a tile of query rank r (0 = a head's last query tile) costs its key
tiles, nm - r for nm query tiles per head under a causal mask with seqlen_q = seqlen_k and equal
query and key tiles, plus `overhead` key tiles' worth for its start and end. The CTAs take the
queue's tiles in order as they free up, each starting with one. Prints, for the peers' grid (16k
tokens, 2048 / d heads, causal), the fraction of a perfect balance (total work / CTAs over the
time the last CTA ends) with the queue head by head and with the tail group as the scheduler
forms it (CausalScheduler::tail_group_heads, mirrored below). With --noise F, each CTA runs at
its own speed and each tile takes its own time, both scaled by a uniform factor in [1 - F, 1 + F]
(the mean over five seeds), as real SMs and tiles do: how robust the order is. --tail-heads N
models a tail group of N heads (at most the grid's) in place of the scheduler's.
"""
import argparse
import heapq
import random

SEEDS = 5

TAIL_GROUP_L2_BYTES = 48 << 20  # CausalScheduler::kTailGroupL2Bytes


def tail_group_heads(num_m_blocks, head_batches, ctas, kv_bytes, heads_per_kv=1):
    """CausalScheduler::tail_group_heads."""
    slack, over = ctas // 16, num_m_blocks % ctas
    if num_m_blocks + slack >= ctas and (over <= slack or over >= ctas - slack):
        return 1
    balance = -(-4 * ctas // num_m_blocks)
    in_l2 = max(1, TAIL_GROUP_L2_BYTES // max(kv_bytes, 1)) * heads_per_kv
    return max(1, min(balance, in_l2, head_batches))


def queue(num_m_blocks, head_batches, tail):
    """Tile costs in key tiles, in queue order: head by head, longest first, then the tail group
    by rank across its heads."""
    head_by_head = [num_m_blocks - r for _ in range(head_batches - tail) for r in range(num_m_blocks)]
    by_rank = [num_m_blocks - r for r in range(num_m_blocks) for _ in range(tail)]
    return head_by_head + by_rank


def balance(costs, ctas, overhead, noise=0.0):
    """Total work / CTAs over the makespan, the CTAs taking tiles in order as they free up; with
    noise, the mean over SEEDS draws of CTA speeds and tile times."""
    seeds = SEEDS if noise > 0 else 1
    total = 0.0
    for seed in range(seeds):
        draw = random.Random(seed)
        speed = [1 + draw.uniform(-noise, noise) for _ in range(ctas)]
        free_at = [(0.0, cta) for cta in range(ctas)]
        heapq.heapify(free_at)
        end = 0.0
        for cost in costs:
            t, cta = heapq.heappop(free_at)
            t += (cost + overhead) * speed[cta] * (1 + draw.uniform(-noise, noise))
            end = max(end, t)
            heapq.heappush(free_at, (t, cta))
        total += sum(c + overhead for c in costs) / ctas / end
    return total / seeds


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ctas", type=int, default=132)
    parser.add_argument("--overhead", type=float, default=2.0)
    parser.add_argument("--block-m", type=int, default=128, help="query rows per tile (the key tiles taken as tall)")
    parser.add_argument("--noise", type=float, default=0.0, help="spread of CTA speeds and tile times (0.02: +-2%%)")
    parser.add_argument("--tail-heads", type=int, default=0, help="tail group size to model (0: the scheduler's)")
    args = parser.parse_args()
    print("| d | seqlen | query tiles per head | heads x batch | tail group | head by head | with tail group |")
    print("|---|---|---|---|---|---|---|")
    for d in (64, 128, 256):
        for seqlen in (512, 1024, 2048, 4096, 8192, 16384):
            nm = -(-seqlen // args.block_m)
            head_batches = 2048 // d * (16384 // seqlen)
            ctas = min(args.ctas, nm * head_batches)
            tail = tail_group_heads(nm, head_batches, ctas, seqlen * 2 * d * 2)
            if args.tail_heads > 0:
                tail = min(args.tail_heads, head_batches)
            plain = balance(queue(nm, head_batches, 1), ctas, args.overhead, args.noise)
            grouped = balance(queue(nm, head_batches, tail), ctas, args.overhead, args.noise)
            print(f"| {d} | {seqlen} | {nm} | {head_batches} | {tail} | {plain:.3f} | {grouped:.3f} |")


if __name__ == "__main__":
    main()
