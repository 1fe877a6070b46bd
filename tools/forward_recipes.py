"""The recipe of every compiled forward kernel configuration: the one table that the kernels, the
plan, dispatch, validation and CMake read (through tools/generate_instantiations.py, which writes
src/kernels/sm90/fwd_recipes.h, the instantiation files and their CMake list from it).

A recipe is a (head dims, mask kind, packed GQA rows, tile choice, FP8) configuration; each is
compiled once per dtype of its kind (dtypes_of: FP8 recipes for e4m3 inputs, the others for bf16
and fp16). A head dim's rows are its kernels: one per mask kind, packed rows or not, with the
default tile choice, plus a row per tile choice that has tiles of its own. Adding a head dim is
adding its rows and running the generator.

Shared memory: 228 KB per SM, at most 227 KB per CTA; the CTA holds Q (block_m x d), `stages` K
tiles (block_n x d) and V tiles (block_n x dv), and O (block_m x dv) where it fits (o_buffer); FP8
(1-byte Q, K and V, 2-byte O) also `stages` tiles of V transposed (fp8_transpose.h).
Registers per consumer thread: 240 with two consumer warpgroups, 160 with three, 232 with one
(two CTAs per SM); S takes block_n / 2 floats, O dv / 2, P block_n / 4 packed registers.
The evidence behind each choice is in docs/PERFORMANCE.md's decision log (D<n>).
"""
from dataclasses import dataclass, field

DTYPES = {"bf16": ("cutlass::bfloat16_t", "DType::kBFloat16"), "fp16": ("cutlass::half_t", "DType::kFloat16"),
          "e4m3": ("cutlass::float_e4m3_t", "DType::kFloat8E4M3")}
FP8_DTYPES = ("e4m3",)
O_BYTES = 2  # bf16 / fp16 O, also of the FP8 kernels
SHARED_BYTES_PER_CTA = 227 * 1024
BARRIER_BYTES = 2048  # room left for the mbarriers and the tile ring next to the tensors

# The tile choice (plan.cpp picks it per call): narrow band (the middle query row sees fewer than
# wide_band_keys keys), wide band (it sees at least that many; without a mask, all seqlen_k keys),
# short rows (too few query rows to fill the tall tiles). Packed GQA rows take the mask kind's
# default choice.
CHOICES = ("narrow", "wide", "short")
DEFAULT_CHOICE = {"nomask": "wide", "local": "narrow"}

# How a consumer warpgroup walks the key tiles of a query tile (ForwardMainloop::walk):
# - single: one loop that branches on the mask per key tile;
# - per_kind: a loop per kind of key tile (right edge, whole tiles, left edge), soft-capping
#   branched on inside;
# - whole_per_softcap: the edge loops branch on soft-capping, the whole tiles' loop is compiled
#   once per soft-capping choice;
# - per_softcap: the whole walk compiled once per soft-capping choice (no mask).
LOOP_SHAPES = ("single", "per_kind", "whole_per_softcap", "per_softcap")


@dataclass(frozen=True)
class Recipe:
    head_dims: tuple  # (d, dv)
    mask: str  # "nomask" or "local" (causal and sliding windows)
    pack_gqa: bool
    choice: str  # one of CHOICES
    block_m: int  # query rows per CTA: 64 per consumer warpgroup
    block_n: int  # key rows per K / V stage
    loops: str  # one of LOOP_SHAPES
    why: str  # the reason for the tiles, in a line
    stages: int = 2
    mma_pingpong: bool = True  # the consumers' GEMM turns go round robin (MmaScheduler)
    softmax_chains: int = 1  # interleaved dependency chains of each row's max and sum
    mask_by_chunks: bool = False  # band tiles masked by warp column chunks of 32 keys
    softcap_per_kernel: bool = False  # a kernel per soft-capping choice instead of a branch
    fp8: bool = False  # e4m3 Q, K and V (bf16 O), V transposed by producer warps
    ptxas_register_usage_level: int = -1  # -1: ptxas's default
    # Derived by the rules below (derive()); a row may not set them.
    derived: dict = field(default_factory=dict, compare=False)

    @property
    def name(self):
        d, dv = self.head_dims
        dims = f"{d}" if d == dv else f"{d}x{dv}"
        suffix = "_packgqa" if self.pack_gqa else ("" if self.choice == DEFAULT_CHOICE[self.mask] else f"_{self.choice}")
        return f"{'fp8_' if self.fp8 else ''}hdim{dims}_{self.mask}{suffix}"

    @property
    def consumers(self):
        return self.block_m // 64


def dtypes_of(r):
    """The dtypes a recipe is compiled for."""
    return [dtype for dtype in DTYPES if (dtype in FP8_DTYPES) == r.fp8]


def tensor_bytes(r, o_rows):
    d, dv = r.head_dims
    element_bytes = 1 if r.fp8 else 2
    vt_tiles = r.stages * r.block_n * dv if r.fp8 else 0
    return element_bytes * (r.block_m * d + r.stages * r.block_n * (d + dv) + vt_tiles) + O_BYTES * o_rows * dv


def derive(r):
    """The choices that follow from a row's tiles by one rule each."""
    local = r.mask == "local"
    # O's shared-memory buffer: its own where it fits next to Q and the K / V rings (the next Q can
    # then load while the epilogue runs); else, unmasked and unpacked on two warpgroups, one
    # warpgroup's rows taken in turn where those fit (D45); else Q's buffer once Q is read.
    if tensor_bytes(r, r.block_m) + BARRIER_BYTES <= SHARED_BYTES_PER_CTA:
        o_buffer = "own"
    elif (not local and not r.pack_gqa and r.consumers == 2 and
          tensor_bytes(r, 64) + BARRIER_BYTES <= SHARED_BYTES_PER_CTA):
        o_buffer = "take_turns"
    else:
        o_buffer = "in_q"
    # Which round of equal tiles is split over the CTAs by keys (split_round.h): none with a mask
    # (its tiles come from a queue), above d = 128 or with three warpgroups (the merge spills: D121),
    # nor with FP8 (not measured yet); packed rows only a single round (D51), others the last.
    if local or r.head_dims[0] > 128 or r.consumers > 2 or r.fp8:
        split = "none"
    else:
        split = "single_round" if r.pack_gqa else "last_round"
    return {
        "o_buffer": o_buffer,
        "split": split,
        # Q released inside the walk's last step, not after it: where O leaves Q alone, unmasked (D36).
        "release_q_in_walk": o_buffer != "in_q" and not local,
        # The next tile's Q prefetched into L2 where it must wait for this tile's O store (D117, D39).
        "prefetch_next_q": o_buffer == "in_q" and not r.pack_gqa,
        # The row totals computed under the last P V, but with three warpgroups (D99).
        "totals_under_last_pv": r.consumers <= 2,
        # A warpgroup whose rows all lie past the last row skips the tile: packed rows (D54), and
        # 192-row band tiles (D73).
        "skip_rows_past_end": (r.pack_gqa and r.consumers > 1) or (local and r.consumers > 2),
        # A warpgroup skips the edge key tiles its rows do not see: band tiles narrower than the
        # query tile, where at most one such tile lies between two warpgroups' rows (D41, D74).
        "skip_unseen_key_tiles": (local and r.consumers > 1 and r.block_n >= 64 * (r.consumers - 1)
                                  and r.block_n < r.block_m),
        # Also compiled for variable-length batches: each head dim's rows of the mask kind's default
        # choice, packed and not (plan.cpp takes them for every variable-length call), where O
        # leaves through its own buffer or Q's (stored row by row).
        "varlen": r.choice == DEFAULT_CHOICE[r.mask] and o_buffer != "take_turns",
    }


def _rows():
    R = Recipe
    rows = []

    def add(dims, mask, *, pack=False, choice=None, **kw):
        rows.append(R(dims, mask, pack, choice or DEFAULT_CHOICE[mask], **kw))

    # d = 64: the softmax is as long as the GEMMs, so three warpgroups hide each one's softmax
    # behind the two others' GEMMs where the rows fill 192-row tiles.
    d = (64, 64)
    add(d, "nomask", block_m=192, block_n=128, loops="per_softcap", softmax_chains=4, softcap_per_kernel=True,
        why="three warpgroups: each K/V tile serves 192 rows (D20); four softmax chains (D115); a kernel per soft-capping choice (D102)")
    add(d, "nomask", pack=True, block_m=64, block_n=128, loops="per_softcap", mma_pingpong=False,
        softmax_chains=4, why="one warpgroup, two CTAs per SM: one CTA's tile boundary overlaps the other's key tiles (D48)")
    add(d, "nomask", choice="short", block_m=64, block_n=128, loops="per_softcap", mma_pingpong=False,
        softmax_chains=4, why="query rows filling 192-row tiles below 4/5: the packed rows' 64-row tiles (D50)")
    add(d, "local", block_m=128, block_n=128, loops="per_kind", mask_by_chunks=True,
        why="a 192-row tile wastes more of the diagonal tiles of narrow bands (D114); chunk masking (D61); a loop per kind (D119)")
    add(d, "local", pack=True, block_m=64, block_n=128, loops="per_kind", mma_pingpong=False, mask_by_chunks=True,
        why="as the unmasked packed rows (D48)")
    add(d, "local", choice="wide", block_m=192, block_n=128, loops="single", mask_by_chunks=True,
        why="wide bands gain from 192-row tiles (D114, D73, D74); a single loop: a loop per kind spills at 160 registers (D120)")

    # d = 96: as d = 64 on two warpgroups, with the widest key tile the registers allow unmasked.
    d = (96, 96)
    add(d, "nomask", block_m=128, block_n=192, loops="per_softcap", why="S 96 + P 48 + O 48 live floats fit N = 192")
    add(d, "nomask", pack=True, block_m=128, block_n=192, loops="per_softcap", why="as unpacked")
    add(d, "local", block_m=128, block_n=128, loops="whole_per_softcap", why="narrower key tiles waste less of the diagonal")
    add(d, "local", pack=True, block_m=128, block_n=128, loops="whole_per_softcap", why="as unpacked")

    # d = 128: 128 x 128 tiles (N = 176 lost to 128: D10), two warpgroups, O in a buffer of its own.
    d = (128, 128)
    add(d, "nomask", block_m=128, block_n=128, loops="per_softcap", softmax_chains=4, softcap_per_kernel=True,
        why="four softmax chains (D27); a kernel per soft-capping choice (D105)")
    add(d, "nomask", pack=True, block_m=128, block_n=128, loops="per_softcap", softmax_chains=4,
        why="packed rows keep 128-row tiles: 64-row ones lost on short queries over long keys (D52)")
    add(d, "nomask", choice="short", block_m=64, block_n=64, loops="per_softcap", mma_pingpong=False,
        softmax_chains=4, why="query rows that 128-row tiles pad by more than 5/4: 64 x 64, two CTAs per SM (D53)")
    add(d, "local", block_m=128, block_n=128, loops="whole_per_softcap", mask_by_chunks=True,
        why="narrow bands masked by chunks (D62, D63); whole tiles per soft-capping choice (D23, D118)")
    add(d, "local", pack=True, block_m=128, block_n=128, loops="whole_per_softcap", why="packed rows mask every column")
    add(d, "local", choice="wide", block_m=128, block_n=128, loops="whole_per_softcap", ptxas_register_usage_level=0,
        why="wide bands mask every column (D62); ptxas register-usage level 0 schedules the walk better (D98)")
    add(d, "local", choice="short", block_m=64, block_n=64, loops="whole_per_softcap", mma_pingpong=False,
        why="as the unmasked short rows (D53)")

    # d = 192: the widest N (a multiple of 16) that fits two stages.
    for d in ((192, 192), (192, 128)):
        why = "N = 112 fits two stages (dv = 192: 216 KB with O in Q's buffer; dv = 128: 220 KB with O's own)"
        add(d, "nomask", block_m=128, block_n=112, loops="per_kind", why=why)
        add(d, "nomask", pack=True, block_m=128, block_n=112, loops="per_kind", why=why)
        add(d, "local", block_m=128, block_n=112, loops="single", why=why + "; a loop per kind spills (D120)")
        add(d, "local", pack=True, block_m=128, block_n=112, loops="single", why=why + "; a loop per kind spills (D120)")

    # d = 256: O alone takes 128 registers, so S stays small; 80-key tiles are the most that fits
    # (224 KB, O in Q's buffer), 64-key tiles waste less on narrow bands and short keys (D116, D31, D35); ping-pong (D11).
    d = (256, 256)
    add(d, "nomask", block_m=128, block_n=80, loops="per_kind", why="80 keys: the widest that fits with O in Q's buffer")
    add(d, "nomask", pack=True, block_m=128, block_n=80, loops="per_kind", why="as unpacked")
    add(d, "nomask", choice="narrow", block_m=128, block_n=64, loops="per_kind",
        why="below 2048 keys 64-key tiles, with one warpgroup's O taken in turn (D35, D45)")
    add(d, "local", block_m=128, block_n=64, loops="whole_per_softcap",
        why="narrow bands on 64-key tiles (D116, D31); whole tiles per soft-capping choice (D110)")
    add(d, "local", pack=True, block_m=128, block_n=64, loops="whole_per_softcap", why="as unpacked")
    add(d, "local", choice="wide", block_m=128, block_n=80, loops="per_kind",
        why="wide bands on 80-key tiles (D31); a loop per kind (D110)")

    # FP8: two consumer warpgroups (the transposer's register budget: barriers.h), three for d = 64's
    # unpacked rows without mask, key tiles of a multiple of 32 (P's A fragments), O in a buffer of
    # its own (16-bit O does not fit 8-bit Q's); packed rows on the same tiles.
    fp8_tiles = {(64, 64): 128, (96, 96): 128, (128, 128): 128, (192, 192): 96, (192, 128): 96, (256, 256): 64}
    for d, block_n in fp8_tiles.items():
        why = f"{block_n} keys: the widest multiple of 32 whose Q, K, V, V^T and O fit"
        for pack in (False, True):
            block_m = 192 if d == (64, 64) and not pack else 128
            add(d, "nomask", pack=pack, fp8=True, block_m=block_m, block_n=block_n, loops="per_softcap",
                why=why + ("; three warpgroups: each K / V tile serves 192 rows" if block_m == 192 else ""))
            add(d, "local", pack=pack, fp8=True, block_m=128, block_n=block_n, loops="whole_per_softcap", why=why)

    for r in rows:
        r.derived.update(derive(r))
        assert not r.fp8 or (r.consumers in (2, 3) and r.block_n % 32 == 0 and r.derived["o_buffer"] == "own"), r.name
    return rows


RECIPES = _rows()
