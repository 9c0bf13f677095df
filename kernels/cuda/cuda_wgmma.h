/* Hopper warpgroup matrix products (wgmma, sm_90a) for bf16 operands with fp32 accumulators,
 * as cuda_attn_tc.cu uses them. C++ (nvcc) only.
 *
 * A warpgroup is 4 consecutive warps starting at a warp index divisible by 4; one wgmma
 * computes d[64 x N] (+)= A[64 x 16] B[16 x N], warp w of the group holding rows 16 w ..
 * 16 w + 15 of d in the layout of mma.sync m16n8 accumulators: d[4 j + e] is row g + 8 (e >> 1),
 * column 8 j + 2 t + (e & 1) of the warp's rows (lane = 4 g + t). A comes from shared memory
 * (a descriptor) or from registers (the m16n8k16 A fragment of the warp's 16 rows); B from
 * shared memory.
 *
 * Shared-memory tiles here use one layout, "halves": a tile of R rows (R a multiple of 8) and
 * HD bf16 columns (a multiple of 64) is HD / 64 blocks of R x 64, block h holding columns
 * 64 h .. 64 h + 63; in a block, row r is 128 bytes at r * 128 and its 16-byte chunk c sits at
 * chunk c ^ (r & 7) (the hardware's 128-byte swizzle; the tile starts 1024-byte aligned). Such a
 * tile serves as a "K-major" operand (its rows are the M or N index, its columns the k index:
 * the scores' k and q rows) and as an "MN-major" B (its rows are the k index, its columns the N
 * index: the v or dout rows of a P V product).
 *
 * Ordering: the products read shared memory through the async proxy, so data written there by
 * ordinary stores or cp.async needs fence_async_smem() by each writing thread, then a barrier,
 * before a product reads it; registers feeding a product (accumulators, an A fragment) must not
 * be touched between wgmma_fence() and the wait that retires it. */
#ifndef MC_KERNELS_CUDA_WGMMA_H
#define MC_KERNELS_CUDA_WGMMA_H

#include <stdint.h>

/* Byte offset of 16-byte chunk c (of HD / 8) of row r in a halves tile of R rows. */
static __device__ __forceinline__ uint32_t wg_off(int R, int r, int c) {
  return (uint32_t)((c >> 3) * R * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

/* The shared-memory matrix descriptor: start address, leading and stride byte offsets (each
 * encoded >> 4 in 14 bits), 128-byte swizzle. */
static __device__ __forceinline__ uint64_t wg_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFF) << 16) |
         ((uint64_t)((sbo >> 4) & 0x3FFF) << 32) | ((uint64_t)1 << 62);
}
/* k-step kk (columns 16 kk .. 16 kk + 15) of rows r0 .. of a halves tile of R rows at `tile`
 * (r0 a multiple of 8), K-major: the 16 columns are 32 bytes inside each row of block kk / 4;
 * 8-row groups 1024 bytes apart. */
static __device__ __forceinline__ uint64_t wg_kmajor(uint32_t tile, int R, int kk, int r0 = 0) {
  return wg_desc(tile + (uint32_t)((kk >> 2) * R * 128 + r0 * 128 + (kk & 3) * 32), 16, 1024);
}
/* k-step kk (rows 16 kk .. 16 kk + 15) of a halves tile of R rows, MN-major (its columns the
 * N index): blocks of 64 columns R * 128 bytes apart (leading), 8-row groups 1024 (stride). */
static __device__ __forceinline__ uint64_t wg_mnmajor(uint32_t tile, int R, int kk) {
  return wg_desc(tile + (uint32_t)(kk * 16 * 128), (uint32_t)(R * 128), 1024);
}

static __device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* Makes this thread's earlier shared-memory writes visible to the async proxy (the products). */
static __device__ __forceinline__ void fence_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

/* Pins the registers of x at this point of the instruction stream: after wgmma_wait, so that
 * no read of the results (or reuse of an A fragment's registers) is moved above it. */
template <int N>
static __device__ __forceinline__ void wg_pin(float (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
template <int N>
static __device__ __forceinline__ void wg_pin(uint32_t (&x)[N]) {
#pragma unroll
  for (int i = 0; i < N; i++) asm volatile("" : "+r"(x[i])::"memory");
}

/* The products. TB: 0 for a K-major B (descriptor of rows = N index), 1 for an MN-major B. The
 * accumulators are read and written (accumulate 0 overwrites them); the asm is volatile and
 * the accumulators are its outputs, so the compiler keeps them in registers across the
 * fence/commit/wait sequence. */
/* d[64 x 32] (+)= A (64 x 16, shared, descriptor da) B^T (B 32 x 16, shared, descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_ss(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, %19;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}

/* d[64 x 32] (+)= A (64 x 16, registers: the warp's 16 rows as an m16n8k16 A fragment) B (descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, %22;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB));
}

/* d[64 x 64] (+)= A (64 x 16, shared, descriptor da) B^T (B 64 x 16, shared, descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_ss(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}

/* d[64 x 64] (+)= A (64 x 16, registers: the warp's 16 rows as an m16n8k16 A fragment) B (descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB));
}

/* d[64 x 128] (+)= A (64 x 16, shared, descriptor da) B^T (B 128 x 16, shared, descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db), "r"(accumulate), "n"(TB));
}

/* d[64 x 128] (+)= A (64 x 16, registers: the warp's 16 rows as an m16n8k16 A fragment) B (descriptor db) */
template <int TB>
static __device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TB));
}

#endif
