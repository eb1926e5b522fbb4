// Internal to kernels/cuda: the Hopper (sm_90a) warpgroup MMA building blocks of the grouped GEMM's
// prefill path (grouped_gemm.cu) and of the prefill attention kernel (attention_wgmma.cuh). A
// warpgroup is 4 consecutive warps (128 threads) that issue wgmma together; B (and A, except in
// the register-A form) is read straight from shared memory through 64-bit matrix descriptors, so
// no ldmatrix and no register fragments of it.
//
// Only compiled into sm_90a code: elsewhere the functions trap, and the host must not pick a
// kernel that calls them (internal::WgmmaAvailable, launch.h, checks the build and the device).
#ifndef VAMP_KERNELS_CUDA_WGMMA_CUH_
#define VAMP_KERNELS_CUDA_WGMMA_CUH_

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define VAMP_WGMMA_DEVICE 1
#else
#define VAMP_WGMMA_DEVICE 0
#endif

namespace vamp::kernels::cuda::internal {

// PTX ISA "Matrix Descriptor Format" (wgmma): bits 0-13 the shared address / 16, 16-29 the
// leading-dimension byte offset / 16, 32-45 the stride-dimension byte offset / 16, 62-63 the
// swizzle mode (1: 128-byte). For a K-major tile of rows 128 bytes long (64 bf16) stored with the
// 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8), 8-row atoms of 1,024 bytes
// aligned to 1,024), the stride between 8-row groups is 1,024 bytes and the leading offset is not
// used (one k16 slice never leaves its atom); the k16 slice ks starts 32 * ks bytes into the row.
__device__ __forceinline__ uint64_t SwizzledKMajorDescriptor(uint32_t shared_address) {
  return static_cast<uint64_t>((shared_address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// An MN-major tile (the matrix's N, or M, index contiguous: B of O = P V with V stored
// [key][dim]) in the same 128-byte swizzle: blocks of 64 bf16 along N, each stored as rows of 128
// bytes, one row per k index (16-byte chunk c of row k at chunk c ^ (k % 8), 8-row atoms of 1,024
// bytes aligned to 1,024). CUTLASS's canonical MN-major SW128 layout ((8,n),(8,k)):((1,LBO),
// (8,SBO)) in 16-byte units: the leading offset is the stride between 64-wide N blocks
// (`n_block_bytes`), the stride offset the one between 8-row k groups (1,024 bytes); the k16 slice
// ks starts 16 * 128 * ks bytes in (whole atoms).
__device__ __forceinline__ uint64_t SwizzledMnMajorDescriptor(uint32_t shared_address,
                                                              uint32_t n_block_bytes) {
  return static_cast<uint64_t>((shared_address & 0x3FFFF) >> 4) |
         (static_cast<uint64_t>((n_block_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Orders this thread's generic-proxy writes to shared memory (cp.async, st.shared) before later
// async-proxy reads of it (wgmma operands). Each writer runs it before the barrier that publishes
// its writes.
__device__ __forceinline__ void FenceProxyAsyncShared() {
#if VAMP_WGMMA_DEVICE
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#else
  __trap();
#endif
}

// Before the first wgmma that touches accumulators written by ordinary instructions.
__device__ __forceinline__ void WgmmaFence() {
#if VAMP_WGMMA_DEVICE
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

__device__ __forceinline__ void WgmmaCommit() {
#if VAMP_WGMMA_DEVICE
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}

// Waits until at most kPending committed wgmma groups of this warpgroup are outstanding; the
// others are done (their accumulators readable, their operands' shared memory free).
template <int kPending>
__device__ __forceinline__ void WgmmaWait() {
#if VAMP_WGMMA_DEVICE
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
#else
  __trap();
#endif
}

// Inline-asm pieces of the wrappers below: the accumulator registers of a 16- to 128-float tile
// (operands %0 .. %N-1, the instruction's first operand) and their "+f" bindings.
#define VAMP_WGMMA_D64_REGS                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
  "%56, %57, %58, %59, %60, %61, %62, %63}"
#define VAMP_WGMMA_D32_REGS                                                                     \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define VAMP_WGMMA_D32_OPERANDS(d)                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define VAMP_WGMMA_D64_OPERANDS(d)                                                               \
  VAMP_WGMMA_D32_OPERANDS(d), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),   \
      "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
      "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), \
      "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), \
      "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define VAMP_WGMMA_D16_REGS "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}"
#define VAMP_WGMMA_D128_REGS                                                                       \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, "    \
  "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "     \
  "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "     \
  "%56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, "     \
  "%74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, "     \
  "%92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, " \
  "%109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, "     \
  "%124, %125, %126, %127}"
#define VAMP_WGMMA_D16_OPERANDS(d)                                                                \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15])
#define VAMP_WGMMA_D128_OPERANDS(d)                                                              \
  VAMP_WGMMA_D64_OPERANDS(d), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]),   \
      "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), \
      "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), \
      "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), \
      "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), \
      "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]),           \
      "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]),        \
      "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]),        \
      "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),        \
      "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]),        \
      "+f"(d[127])

// d += A x B^T for a 64 x 128 float32 tile, k 16: A is 64 rows and B 128 rows of a K-major bf16
// tile (descriptors above). Accumulator layout (PTX ISA "Register Fragments and Shared Memory
// Matrix Layouts", m64nNk16 .f32): warp w of the warpgroup, lane l, g = l / 4, t2 = 2 (l % 4);
// d[4j + 0..1] = D[16w + g][8j + t2 .. +1], d[4j + 2..3] = D[16w + g + 8][8j + t2 .. +1].
__device__ __forceinline__ void WgmmaM64N128K16Bf16(float (&d)[64], uint64_t desc_a,
                                                    uint64_t desc_b) {
#if VAMP_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VAMP_WGMMA_D64_REGS
      ", %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : VAMP_WGMMA_D64_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

// d += A x B^T for a 64 x 64 float32 tile, k 16, both operands K-major in shared memory (as
// WgmmaM64N128K16Bf16, half the columns): d[4j + 0..1] = D[16w + g][8j + t2 .. +1],
// d[4j + 2..3] = D[16w + g + 8][8j + t2 .. +1].
__device__ __forceinline__ void WgmmaM64N64K16Bf16(float (&d)[32], uint64_t desc_a,
                                                   uint64_t desc_b) {
#if VAMP_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " VAMP_WGMMA_D32_REGS
      ", %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : VAMP_WGMMA_D32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

// d += A x B for a 64 x 128 float32 tile, k 16, with A in registers and B MN-major in shared
// memory (SwizzledMnMajorDescriptor; the instruction's transpose-B flag set). A's register
// fragment (PTX ISA "Register Fragments", m64nNk16 .bf16 A): warp w of the warpgroup holds rows
// 16w..16w+15 in the mma.m16n8k16 A layout, a[0] = (row g, cols t2, t2+1), a[1] = (row g+8,
// same), a[2] = (row g, cols t2+8, t2+9), a[3] = (row g+8, same); this is the accumulator layout
// of two adjacent 8-column blocks, so a score tile's accumulators feed the next product directly.
// `a` must stay unchanged until the wgmma has been waited for.
__device__ __forceinline__ void WgmmaM64N128K16Bf16RegA(float (&d)[64], const uint32_t (&a)[4],
                                                        uint64_t desc_b) {
#if VAMP_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " VAMP_WGMMA_D64_REGS
      ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n"
      "}\n"
      : VAMP_WGMMA_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

}  // namespace vamp::kernels::cuda::internal

// As WgmmaM64N64K16Bf16 for a 64 x 32 tile: d[4j + e], j < 4.
__device__ __forceinline__ void WgmmaM64N32K16Bf16(float (&d)[16], uint64_t desc_a,
                                                   uint64_t desc_b) {
#if VAMP_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 " VAMP_WGMMA_D16_REGS
      ", %16, %17, p, 1, 1, 0, 0;\n"
      "}\n"
      : VAMP_WGMMA_D16_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

// As WgmmaM64N128K16Bf16RegA for a 64 x 256 tile (B two 128-column halves of MN-major blocks):
// d[4j + e], j < 32.
__device__ __forceinline__ void WgmmaM64N256K16Bf16RegA(float (&d)[128], const uint32_t (&a)[4],
                                                        uint64_t desc_b) {
#if VAMP_WGMMA_DEVICE
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " VAMP_WGMMA_D128_REGS
      ", {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n"
      "}\n"
      : VAMP_WGMMA_D128_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
#else
  __trap();
#endif
}

#undef VAMP_WGMMA_D64_REGS
#undef VAMP_WGMMA_D32_REGS
#undef VAMP_WGMMA_D64_OPERANDS
#undef VAMP_WGMMA_D32_OPERANDS
#undef VAMP_WGMMA_D16_REGS
#undef VAMP_WGMMA_D128_REGS
#undef VAMP_WGMMA_D16_OPERANDS
#undef VAMP_WGMMA_D128_OPERANDS

#endif  // VAMP_KERNELS_CUDA_WGMMA_CUH_
