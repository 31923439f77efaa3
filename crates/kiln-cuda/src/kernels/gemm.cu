// ---- block products on the tensor cores, without cuBLAS ----------------------------------
//
// out (n x rows, rows ld apart) = x (n x cols, f16) W^T (W: rows x cols, f16) [+ out]
// [+ bias], f32 sums: the products of more than DEC_MAX_TOK tokens where cuBLAS is not loaded
// (products.rs gemm). A block takes BM tokens x BN weight rows; its warps WM x WN of them,
// each as (WM / 16) x (WN / 8) mma.sync m16n8k16 tiles; k advances GM_BK columns at a time
// through shared memory, the next step's tiles copied (cp.async) while this one multiplies.
// Rows and tokens past the ends are read as zeros and not written; cols % 8 == 0.

#define GM_BK 32
// Row padding (f16 values): rows 80 bytes apart, so 16-byte copies stay aligned and the eight
// rows of an ldmatrix fall in distinct banks.
#define GM_PAD 8
#define GM_LD (GM_BK + GM_PAD)

// Rows r0 .. r0 + R of src (lim rows, cols columns), columns k0 .. k0 + GM_BK, copied into a
// stage's tile: 16 bytes (8 columns) a copy, zeros past either end.
template <int R, int THREADS>
__device__ __forceinline__ void gm_tile(u16* dst, const u16* src, int r0, int lim, int k0,
                                        int cols) {
#pragma unroll
    for (int c = threadIdx.x; c < R * GM_BK / 8; c += THREADS) {
        const int r = c / (GM_BK / 8), kc = (c % (GM_BK / 8)) * 8;
        const bool ok = r0 + r < lim && k0 + kc < cols;
        cp_async16(dst + r * GM_LD + kc, ok ? src + (size_t)(r0 + r) * cols + k0 + kc : src, ok);
    }
}

// Shared memory of a block: STAGES k steps of both tiles (dynamic: products.rs gemm_own
// passes it, device.rs raises the 48 KiB bound for the kernels that need more).
#define GM_SMEM(BM, BN, STAGES) ((STAGES) * ((BM) + (BN)) * GM_LD * 2)

template <int BM, int BN, int WM, int WN, int STAGES>
__device__ __forceinline__ void gemm_f16_impl(const u16* __restrict__ x,
                                              const u16* __restrict__ w,
                                              const float* __restrict__ bias, int n, int rows,
                                              int cols, int add, float* out, int ld) {
    constexpr int WARPS_N = BN / WN;
    constexpr int THREADS = 32 * (BM / WM) * WARPS_N;
    constexpr int MT = WM / 16, NT = WN / 8;
    extern __shared__ __align__(16) u16 gm_smem[];
    // Stage st's rows: xs(st) + r * GM_LD, ws(st) + r * GM_LD.
    auto xs = [&](int st) { return gm_smem + st * BM * GM_LD; };
    auto ws = [&](int st) { return gm_smem + (STAGES * BM + st * BN) * GM_LD; };
    pdl_begin();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
    const int wm = (warp / WARPS_N) * WM, wn = (warp % WARPS_N) * WN;
    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    const int steps = (cols + GM_BK - 1) / GM_BK;
    // k step t's tiles into its stage, 16 bytes (8 columns) a copy; one copy group a step,
    // empty past the last, so that group counts stay those of the steps.
    auto load = [&](int t) {
        if (t < steps) {
            const int st = t % STAGES, k0 = t * GM_BK;
            gm_tile<BM, THREADS>(xs(st), x, m0, n, k0, cols);
            gm_tile<BN, THREADS>(ws(st), w, n0, rows, k0, cols);
        }
        cp_async_commit();
    };
    // STAGES - 1 steps in flight ahead of the one multiplied.
#pragma unroll
    for (int t = 0; t < STAGES - 1; t++) load(t);
    for (int t = 0; t < steps; t++) {
        cp_async_wait<STAGES - 2>();
        // Step t is in; every warp is past step t - 1, whose stage the next copy takes.
        __syncthreads();
        load(t + STAGES - 1);
        const u16* xt = xs(t % STAGES);
        const u16* wt = ws(t % STAGES);
#pragma unroll
        for (int k16 = 0; k16 < GM_BK; k16 += 16) {
            // A fragments: lane l gives row l % 16, columns k16 + 8 (l / 16) of its tile.
            u32 a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; i++)
                ldmatrix_x4(a[i],
                            xt + (wm + 16 * i + (lane & 15)) * GM_LD + k16 + 8 * (lane >> 4));
            // B fragments, two n-tiles a load: lane l gives row 8 (j + l / 16) + l % 8,
            // columns k16 + 8 ((l / 8) % 2) (registers: tile j k-low, k-high, tile j + 1 ...).
            u32 b[NT][2];
#pragma unroll
            for (int j = 0; j < NT; j += 2) {
                u32 r[4];
                ldmatrix_x4(r, wt + (wn + 8 * (j + (lane >> 4)) + (lane & 7)) * GM_LD + k16 +
                                   8 * ((lane >> 3) & 1));
                b[j][0] = r[0];
                b[j][1] = r[1];
                b[j + 1][0] = r[2];
                b[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int j = 0; j < NT; j++) mma16816(acc[i][j], a[i], b[j][0], b[j][1]);
        }
    }
    pdl_trigger();
    // acc[i][j]: tokens wm + 16 i + lane / 4 (values 0, 1) and + 8 (values 2, 3), rows
    // wn + 8 j + 2 (lane % 4) and + 1.
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int tok = m0 + wm + 16 * i + gid + 8 * (e >> 1);
                const int row = n0 + wn + 8 * j + 2 * tig + (e & 1);
                if (tok >= n || row >= rows) continue;
                float v = acc[i][j][e];
                if (bias) v += bias[row];
                float* o = out + (size_t)tok * ld + row;
                *o = add ? *o + v : v;
            }
}

// gemm_f16_64: 64 x 64 blocks of four warps (32 x 32 each), four k steps in flight (40 KiB),
// for products of a few hundred tokens or rows; gemm_f16_128: 128 x 128 blocks of eight warps
// (64 x 32), four in flight (80 KiB), where such blocks still fill the multiprocessors.
#define GEMM_F16(NAME, BM, BN, WM, WN, STAGES)                                                \
    extern "C" __global__ void __launch_bounds__(32 * (BM / WM) * (BN / WN))                 \
        NAME(const u16* x, const u16* w, const float* bias, int n, int rows, int cols,        \
             int add, float* out, int ld) {                                                  \
        gemm_f16_impl<BM, BN, WM, WN, STAGES>(x, w, bias, n, rows, cols, add, out, ld);      \
    }
GEMM_F16(gemm_f16_64, 64, 64, 32, 32, 4)
GEMM_F16(gemm_f16_128, 128, 128, 64, 32, 4)
