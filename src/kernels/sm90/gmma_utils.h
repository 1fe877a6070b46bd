// CuTe plumbing for warpgroup GEMMs (wgmma) and views of their register fragments.
#pragma once

#include <cute/arch/mma_sm90.hpp>
#include <cute/atom/mma_traits_sm90_gmma.hpp>
#include <cute/tensor.hpp>
#include <cutlass/numeric_conversion.h>

namespace flashhop::sm90 {

// The SS wgmma (both operands in shared memory, K-major) of N = kN that CuTe declares only in its
// extended-shapes headers (N = 80, 112, ...). Those headers hold every extended shape of every type
// and double a kernel file's compile time, so the specializations live in wgmma_extended.h, which
// only the kernel files that need one include (tools/generate_instantiations.py).
template <class Element, int kN>
struct ExtendedSsOp {
  static_assert(kN < 0, "this key tile width needs kernels/sm90/wgmma_extended.h in the kernel's instantiation file");
};

// The SS wgmma for a (M, N, K) tile as one instruction of the tile's full N: CuTe's selector where
// it offers that width, else ExtendedSsOp. (A narrower instruction would re-read the A operand from
// shared memory once per N slice.)
template <class Element, class TileShapeMNK>
constexpr auto full_width_ss_op() {
  using Selected = decltype(cute::GMMA::ss_op_selector<Element, Element, float, TileShapeMNK>());
  constexpr int kN = cute::size<1>(TileShapeMNK{});
  if constexpr (cute::size<1>(typename cute::MMA_Traits<Selected>::Shape_MNK{}) == kN) {
    return Selected{};
  } else {
    return typename ExtendedSsOp<Element, kN>::type{};
  }
}

// C (+)= A B for one warpgroup, issued asynchronously. A comes from shared memory (descriptors) or
// registers; B from shared memory. kWait >= 0 waits until at most kWait wgmma batches are in flight.
// The operand fences keep the compiler from touching registers that an in-flight wgmma owns.
template <bool kZeroInit, int kWait, class TiledMma, class TensorA, class TensorB, class TensorC>
CUTLASS_DEVICE void warpgroup_gemm(TiledMma& tiled_mma, TensorA const& a, TensorB const& b, TensorC& c) {
  // A from shared memory is a tensor of wgmma descriptors; anything else is a register fragment.
  constexpr bool kAInRegisters = !cute::is_base_of<cute::GMMA::DescriptorIterator, typename TiledMma::FrgTypeA>::value;
  if constexpr (kAInRegisters) cute::warpgroup_fence_operand(const_cast<TensorA&>(a));
  cute::warpgroup_fence_operand(c);
  cute::warpgroup_arrive();
  if constexpr (kZeroInit) tiled_mma.accumulate_ = cute::GMMA::ScaleOut::Zero;
  CUTLASS_PRAGMA_UNROLL
  for (int k = 0; k < cute::size<2>(a); ++k) {
    cute::gemm(tiled_mma, a(cute::_, cute::_, k), b(cute::_, cute::_, k), c);
    tiled_mma.accumulate_ = cute::GMMA::ScaleOut::One;
  }
  cute::warpgroup_commit_batch();
  if constexpr (kWait >= 0) cute::warpgroup_wait<kWait>();
  cute::warpgroup_fence_operand(c);
  if constexpr (kAInRegisters) cute::warpgroup_fence_operand(const_cast<TensorA&>(a));
}

// A wgmma accumulator fragment is ((2 cols, 2 rows, N/8 col groups), MMA_M, MMA_N) per thread.
// Returns the (rows, cols) view: ((2, MMA_M), (2, N/8, MMA_N)).
template <class Layout>
CUTLASS_DEVICE constexpr auto accumulator_rowcol(Layout const& acc) {
  using namespace cute;
  static_assert(decltype(rank<0>(acc))::value == 3);
  return make_layout(make_layout(get<0, 1>(acc), get<1>(acc)),
                     make_layout(get<0, 0>(acc), get<0, 2>(acc), get<2>(acc)));
}

template <class Tensor>
CUTLASS_DEVICE auto rowcol_view(Tensor&& t) {
  return cute::make_tensor(t.data(), accumulator_rowcol(t.layout()));
}

// The accumulator of S = Q K^T, converted to 16 bits, is the register A operand of O = P V:
// a 16-bit A fragment covers K = 16, i.e. two accumulator column groups of 8.
// ((2, 2, N/8), MMA_M, MMA_N) -> ((2, 2, 2), MMA_M, (N/16, MMA_N)).
template <class Layout>
CUTLASS_DEVICE constexpr auto accumulator_as_a_operand(Layout const& acc) {
  using namespace cute;
  auto col_groups = logical_divide(get<0, 2>(acc), Tile<_2>{});  // (2, N/16)
  return make_layout(make_layout(get<0, 0>(acc), get<0, 1>(acc), get<0, 0>(col_groups)), get<1>(acc),
                     coalesce(make_layout(get<0, 1>(col_groups), get<2>(acc))));
}

// The same for an 8-bit P, whose A fragment covers K = 32 with four adjacent columns per register
// ((4, 2 rows, 2 halves of 16) per thread, CuTe's ALayout_64x32), where the accumulator holds pairs
// of adjacent columns ((2, 2 rows, 4 groups of 8)). Register j of a half takes the accumulator's
// pairs of groups 2h and 2h + 1: P's column 16 h + 4 t + j (thread t of its quad) holds the score of
// key 16 h + 8 (j / 2) + 2 t + j % 2 (fp8_key_of), an order that V^T's keys follow in shared
// memory (fp8_transpose.h), so that no value crosses threads.
// ((2, 2, N/8), 1, 1) -> (((2, 2), 2, 2), 1, N/32), a view of the same values.
template <class Layout>
CUTLASS_HOST_DEVICE constexpr auto accumulator_as_fp8_a_operand(Layout const& acc) {
  using namespace cute;
  // One wgmma of the tile's full N per thread: a compact ((2, 2, N/8), 1, 1) fragment.
  static_assert(decltype(size<1>(acc))::value == 1 && decltype(size<2>(acc))::value == 1);
  static_assert(decltype(stride<0, 0>(acc))::value == 1 && decltype(stride<0, 1>(acc))::value == 2 &&
                decltype(stride<0, 2>(acc))::value == 4);
  constexpr int kGroups = decltype(size<0, 2>(acc))::value;  // N / 8
  static_assert(kGroups % 4 == 0, "P's A fragments cover 32 columns");
  return cute::Layout<Shape<Shape<Shape<_2, _2>, _2, _2>, _1, Int<kGroups / 4>>,
                      Stride<Stride<Stride<_1, _4>, _2, _8>, _0, _16>>{};
}

// The key whose score P's column `column` holds within its tile (accumulator_as_fp8_a_operand).
CUTLASS_HOST_DEVICE constexpr int fp8_key_of(int column) {
  int const j = column % 4, t = column / 4 % 4, rest = column / 16 * 16;
  return rest + 8 * (j / 2) + 2 * t + j % 2;
}

// Element-wise conversion of a register fragment into another of the same size, vectorised by
// CUTLASS's array converter.
template <class SrcTensor, class DstTensor>
CUTLASS_DEVICE void convert_fragment_into(SrcTensor const& src, DstTensor& dst) {
  using From = typename SrcTensor::value_type;
  using To = typename DstTensor::value_type;
  constexpr int kNumel = decltype(cute::size(src))::value;
  static_assert(decltype(cute::size(dst))::value == kNumel);
  cutlass::NumericArrayConverter<To, From, kNumel> convert;
  *reinterpret_cast<cutlass::Array<To, kNumel>*>(dst.data()) =
      convert(*reinterpret_cast<cutlass::Array<From, kNumel> const*>(src.data()));
}

}  // namespace flashhop::sm90
