"""The recipe of every compiled backward kernel configuration (tools/generate_instantiations.py
writes src/kernels/sm90/bwd_recipes.h, the instantiation files and their CMake entries from it).

A recipe is a (head dims, mask kind) configuration, compiled once per dtype of forward_recipes.DTYPES
(each file holds the kernel with and without soft-capping). Two consumer warpgroups share the CTA's
block_n key rows (bwd_recipe.h's DkvSplit) while it walks query tiles of block_m rows; its shared
memory holds K and V (block_n x d, block_n x dv), `stages` Q and dO tiles, two dS tiles (block_m x
block_n; two of P^T too with the columns split) and dQ in fp32 (block_m x d). Registers per
consumer thread (240): with key rows split (block_n 128), dK and dV accumulators d / 2 and dv / 2
floats, S^T and dP^T block_m / 2 each, dQ d block_m / 256; with columns split (block_n 64), dK and
dV d / 4 and dv / 4, S^T and dP^T 16 each, dQ d / 4.
"""
from dataclasses import dataclass

ELEMENT_BYTES = 2
SHARED_BYTES_PER_CTA = 227 * 1024


@dataclass(frozen=True)
class Recipe:
    head_dims: tuple  # (d, dv)
    mask: str  # "nomask" or "local"
    why: str
    block_m: int = 64
    block_n: int = 128
    stages: int = 2
    split: str = "key_rows"  # or "columns"

    @property
    def name(self):
        d, dv = self.head_dims
        return f"hdim{d}" + ("" if d == dv else f"x{dv}") + f"_{self.mask}"


def shared_bytes(r):
    d, dv = r.head_dims
    score_tiles = 2 * (2 if r.split == "columns" else 1)  # two dS, and two P^T with the columns split
    tensors = ELEMENT_BYTES * (r.block_n * (d + dv) + r.stages * r.block_m * (d + dv) +
                               score_tiles * r.block_m * r.block_n)
    return tensors + 4 * r.block_m * d + 2 * 4 * r.stages * r.block_m + 1024


def _rows():
    rows = []
    key_rows = "two consumer warpgroups of 64 key rows; dQ's columns split between them"
    for d in (64, 96, 128):
        for mask in ("nomask", "local"):
            if d == 64:  # 128 query rows: the accumulators of d = 128 on 64, twice the work per step
                why = "two consumer warpgroups of 64 key rows and 64 query rows of dQ; 128-row query tiles"
                rows.append(Recipe((d, d), mask, why=why, block_m=128))
            else:
                rows.append(Recipe((d, d), mask, why=key_rows))
    wide = "two consumer warpgroups on 64 key rows, each with half the columns of dK, dV and dQ"
    for dims, stages in (((192, 192), 2), ((192, 128), 2), ((256, 256), 1)):
        for mask in ("nomask", "local"):
            why = wide + ("" if stages > 1 else "; one Q and dO stage (two would pass 227 KB)")
            rows.append(Recipe(dims, mask, why=why, block_n=64, stages=stages, split="columns"))
    for r in rows:
        assert shared_bytes(r) <= SHARED_BYTES_PER_CTA, r.name
    return rows


RECIPES = _rows()
