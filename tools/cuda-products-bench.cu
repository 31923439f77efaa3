// kiln's one-token decode products (kernels/products.cu) timed alone, shape by shape, on an
// NVIDIA GPU: the matrices of the Qwen3-0.6B, Qwen3-4B and Llama-3.2-3B shapes (Q4_0, random
// blocks), each launched as products.rs launches it (grid, warps a row, the gate/up pair's
// kernel, the quantized output for the next product), over enough copies of the matrix that
// the L2 never holds it, back to back with programmatic dependent launch (as a replayed decode
// step chains them) and without. Beside each, a variant whose weights come into shared memory
// through cp.async, S chunks of 32 blocks a warp in flight (registers hold no load), checked
// to give the same bits; BENCHMARKS.md (thirty-first session) has what it measured.
//
// On the GPU machine, from the repository root:
//   nvcc -O3 -arch=sm_90 -std=c++17 -I crates/kiln-cuda/src/kernels \
//       tools/cuda-products-bench.cu -o /tmp/products-bench && /tmp/products-bench
//
// The host part is left out under NVRTC, which can then check the device code on a machine
// without nvcc (as device.rs's test compiles the kernels).
#include "common.cu"
#include "products.cu"
#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#endif

__device__ __forceinline__ void cpa16(void* s, const void* g) {
    const u32 a = (u32)__cvta_generic_to_shared(s);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(g) : "memory");
}
__device__ __forceinline__ void cpa_commit() {
    asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int N>
__device__ __forceinline__ void cpa_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

#define SCHUNK 576  // one row's 32 blocks: 512 B nibbles + 64 B scales

// matvec_dec_impl's one-token product (four rows a warp, Q4_0) with its weights staged: a
// warp's rows for 32 blocks at a time (a chunk: each lane's block of each row, and the rows'
// scales) go into its ring of S chunks by cp.async before they are needed, S ahead of the
// arithmetic; each lane then sums the same blocks in the same order as kiln's kernel, so the
// outputs are the same bits (checked below). GU: a gate/up pair (eight rows a warp staged).
template <int S, int GU>
__device__ void mvs_impl(const Mats& ms, const u8* xqb, int cols, const float* ss_in, float eps,
                         int mode, int kw, const QOut& qo) {
    constexpr int ROWS = 4, RW = GU ? 8 : 4;
    extern __shared__ __align__(16) u8 smem[];
    __shared__ float red[WARPS * DEC_KW_MAX][2 * ROWS];
    __shared__ float outv[WARPS * ROWS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int slot = warp / kw, part = warp % kw;
    const int nb = cols / 32;
    const int total = GU ? ms.m[0].rows : ms.row0[ms.n_mats];
    const int row = (blockIdx.x * WARPS + slot) * ROWS;
    const bool live = row < total;
    int mi = 0, rr = row;
    if (!GU) {
        mi = (ms.n_mats > 1 && row >= ms.row0[1]) + (ms.n_mats > 2 && row >= ms.row0[2]);
        rr = row - (mi == 0 ? ms.row0[0] : (mi == 1 ? ms.row0[1] : ms.row0[2]));
    }
    const Mat m = mi == 0 ? ms.m[0] : (mi == 1 ? ms.m[1] : ms.m[2]);
    const Mat m1 = ms.m[1];
    u8* wbuf = smem + (size_t)warp * S * RW * SCHUNK;
    const int n_it = live && nb > part * 32 ? (nb - part * 32 + 32 * kw - 1) / (32 * kw) : 0;
    auto issue = [&](int i) {
        if (i < n_it) {
            const int c0 = (i * kw + part) * 32;
            const int cnt = min(32, nb - c0);
            u8* st = wbuf + (i % S) * RW * SCHUNK;
#pragma unroll
            for (int j = 0; j < RW; j++) {
                const Mat& mm = j < ROWS ? m : m1;
                const size_t rb = (size_t)(rr + (j % ROWS)) * nb + c0;
                if (lane < cnt) cpa16(st + j * SCHUNK + lane * 16, mm.q + (rb + lane) * 16);
                if (lane < cnt / 8)
                    cpa16(st + j * SCHUNK + 512 + lane * 16, mm.s + rb * 2 + lane * 16);
            }
        }
        cpa_commit();
    };
    pdl_trigger();
#pragma unroll
    for (int i = 0; i < S; i++) issue(i);
    const bool adds = live && lane == 0 && !GU;
    float bias[ROWS], res[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; j++) bias[j] = adds && m.bias ? m.bias[rr + j] : 0.0f;
    pdl_wait();
#pragma unroll
    for (int j = 0; j < ROWS; j++) res[j] = adds && mode == MODE_ADD ? m.out[rr + j] : 0.0f;
    const float r = dec_inv_rms(ss_in, nb, cols, eps, lane);
    const XQ g = xq_layout(xqb, cols, 1);
    const XTok x = xtok(g, 0, cols);
    float a0[ROWS], a1[ROWS];
#pragma unroll
    for (int j = 0; j < ROWS; j++) a0[j] = a1[j] = 0.0f;
    for (int i = 0; i < n_it; i++) {
        cpa_wait<S - 1>();
        __syncwarp();
        const u8* st = wbuf + (i % S) * RW * SCHUNK;
        const int b = (i * kw + part) * 32 + lane;
        if (b < nb) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                WBlk w;
                w.q = *(const uint4*)(st + j * SCHUNK + lane * 16);
                w.r = make_uint4(0, 0, 0, 0);
                w.s = *(const u16*)(st + j * SCHUNK + 512 + lane * 2);
                w.s2 = 0;
                a0[j] = wblk_acc<FMT_Q4_0>(a0[j], w, wblk_unpack<FMT_Q4_0>(w, FMT_Q4_0, b),
                                           FMT_Q4_0, b, x);
                if (GU) {
                    WBlk u;
                    u.q = *(const uint4*)(st + (ROWS + j) * SCHUNK + lane * 16);
                    u.r = make_uint4(0, 0, 0, 0);
                    u.s = *(const u16*)(st + (ROWS + j) * SCHUNK + 512 + lane * 2);
                    u.s2 = 0;
                    a1[j] = wblk_acc<FMT_Q4_0>(a1[j], u, wblk_unpack<FMT_Q4_0>(u, FMT_Q4_0, b),
                                               FMT_Q4_0, b, x);
                }
            }
        }
        __syncwarp();
        issue(i + S);
    }
    cpa_wait<0>();
#pragma unroll
    for (int j = 0; j < ROWS; j++) {
        a0[j] = warp_sum(a0[j]);
        if (GU) a1[j] = warp_sum(a1[j]);
    }
    if (kw > 1) {
        if (lane == 0) {
#pragma unroll
            for (int j = 0; j < ROWS; j++) {
                red[warp][j] = a0[j];
                red[warp][ROWS + j] = a1[j];
            }
        }
        __syncthreads();
        if (part != 0) return;
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            a0[j] = a1[j] = 0.0f;
            for (int p = 0; p < kw; p++) {
                a0[j] = __fadd_rn(a0[j], red[warp + p][j]);
                a1[j] = __fadd_rn(a1[j], red[warp + p][ROWS + j]);
            }
        }
    }
    if (live && lane == 0) {
#pragma unroll
        for (int j = 0; j < ROWS; j++) {
            const float v = dec_out(a0[j], a1[j], r, bias[j], res[j], mode);
            (GU ? ms.m[0].out[row + j] : m.out[rr + j]) = v;
            outv[slot * ROWS + j] = v;
        }
    }
    if (!qo.xq) return;
    __syncthreads();
    if (warp != 0) return;
    dec_quant_out(qo, outv[lane], blockIdx.x, 0, 1, total, lane);
}

#define MVS(S, GU, MINB)                                                                           \
    extern "C" __global__ void __launch_bounds__(256, MINB)                                        \
        mvs_##S##_##GU(Mats ms, const u8* xqb, int cols, int ntok, const float* ss_in, float eps,  \
                       int mode, int kw, QOut qo) {                                                \
        mvs_impl<S, GU>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                                  \
    }                                                                                              \
    extern "C" __global__ void __launch_bounds__(512, 1)                                           \
        mvs2_##S##_##GU(Mats ms, const u8* xqb, int cols, int ntok, const float* ss_in, float eps, \
                        int mode, int kw, QOut qo) {                                               \
        mvs_impl<S, GU>(ms, xqb, cols, ss_in, eps, mode, kw, qo);                                  \
    }
MVS(2, 0, 2)
MVS(3, 0, 2)
MVS(4, 0, 2)
MVS(6, 0, 1)
MVS(1, 1, 2)
MVS(2, 1, 2)
MVS(3, 1, 1)

#ifndef __CUDACC_RTC__
// ---- host ----------------------------------------------------------------------------------
#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

typedef void (*Kern)(Mats, const u8*, int, int, const float*, float, int, int, QOut);

struct Shape {
    const char* name;
    int rows, cols, gu, mode, qout, ss;
};

static int num_sms;

// Microseconds a launch of k takes, iters launches in a row over mats in turn (after as many
// to warm up), chained with programmatic dependent launch (pdl) or plainly.
static float launch_set(Kern k, int smem, int threads, int blocks, std::vector<Mats>& mats,
                        const u8* xq, int cols, const float* ss_in, int mode, int kw, QOut qo,
                        int iters, bool pdl, cudaStream_t st) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = st;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = pdl ? 1 : 0;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int w = 0; w < 2; w++) {
        if (w == 1) CK(cudaEventRecord(e0, st));
        for (int i = 0; i < iters; i++) {
            Mats m = mats[i % mats.size()];
            CK(cudaLaunchKernelEx(&cfg, k, m, xq, cols, 1, ss_in, 1e-6f, mode, kw, qo));
        }
    }
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    return ms * 1000.0f / iters;
}

int main(int argc, char** argv) {
    CK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    std::vector<Shape> shapes = {
        {"0.6B qkv", 4096, 1024, 0, MODE_STORE, 0, 0},
        {"0.6B o", 1024, 2048, 0, MODE_ADD, 1, 1},
        {"0.6B gate/up", 3072, 1024, 1, MODE_GATE_UP, 1, 0},
        {"0.6B down", 1024, 3072, 0, MODE_ADD, 1, 1},
        {"4B qkv", 6144, 2560, 0, MODE_STORE, 0, 0},
        {"4B o", 2560, 4096, 0, MODE_ADD, 1, 1},
        {"4B gate/up", 9728, 2560, 1, MODE_GATE_UP, 1, 0},
        {"4B down", 2560, 9728, 0, MODE_ADD, 1, 1},
        {"3B qkv", 5120, 3072, 0, MODE_STORE, 0, 0},
        {"3B o", 3072, 3072, 0, MODE_ADD, 1, 1},
        {"3B gate/up", 8192, 3072, 1, MODE_GATE_UP, 1, 0},
        {"3B down", 3072, 8192, 0, MODE_ADD, 1, 1},
    };
    struct V {
        const char* name;
        Kern k1, k2;  // 256-thread and 512-thread builds
        int s, gu;
    };
    std::vector<V> vars = {
        {"mvs S2", mvs_2_0, mvs2_2_0, 2, 0}, {"mvs S3", mvs_3_0, mvs2_3_0, 3, 0},
        {"mvs S4", mvs_4_0, mvs2_4_0, 4, 0}, {"mvs S6", mvs_6_0, mvs2_6_0, 6, 0},
        {"mvs S1", mvs_1_1, mvs2_1_1, 1, 1}, {"mvs S2", mvs_2_1, mvs2_2_1, 2, 1},
        {"mvs S3", mvs_3_1, mvs2_3_1, 3, 1},
    };
    for (auto& v : vars) {
        CK(cudaFuncSetAttribute(v.k1, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
        CK(cudaFuncSetAttribute(v.k2, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    }
    srand(1);
    for (auto& sh : shapes) {
        const int nb = sh.cols / 32;
        const int nm = sh.gu ? 2 : 1;
        const size_t qb = (size_t)sh.rows * nb * 16, sb = (size_t)sh.rows * nb * 2;
        const size_t mbytes = nm * (qb + sb);
        int copies = (int)((600ull << 20) / mbytes) + 1;
        if (copies < 4) copies = 4;
        u8 *q, *s;
        CK(cudaMalloc(&q, qb * nm * copies));
        CK(cudaMalloc(&s, sb * nm * copies));
        {
            std::vector<u8> h(qb * nm * copies);
            for (auto& c : h) c = rand() & 0xff;
            CK(cudaMemcpy(q, h.data(), h.size(), cudaMemcpyHostToDevice));
            std::vector<u16> hs(sb / 2 * nm * copies);
            for (auto& c : hs) c = 0x2000 + (rand() & 0x3ff);  // f16 around 0.008
            CK(cudaMemcpy(s, hs.data(), sb * nm * copies, cudaMemcpyHostToDevice));
        }
        float *x, *out, *ssb;
        CK(cudaMalloc(&x, sh.cols * 4));
        CK(cudaMalloc(&out, sh.rows * 4 * 2));
        CK(cudaMalloc(&ssb, 65536 * 4));
        std::vector<float> hx(sh.cols);
        for (auto& v : hx) v = (rand() / (float)RAND_MAX - 0.5f);
        CK(cudaMemcpy(x, hx.data(), sh.cols * 4, cudaMemcpyHostToDevice));
        std::vector<float> hss(65536, 1.0f);
        CK(cudaMemcpy(ssb, hss.data(), 65536 * 4, cudaMemcpyHostToDevice));
        u8 *xq, *xqo;
        CK(cudaMalloc(&xq, 4 * sh.cols + 4096));
        CK(cudaMalloc(&xqo, 4 * sh.rows + 4096));
        CK(cudaMemset(xqo, 0, 4 * sh.rows + 4096));
        quant_act<<<1, 1024>>>(x, sh.cols, 1, nullptr, 0.0f, xq);
        CK(cudaDeviceSynchronize());
        std::vector<Mats> mats(copies);
        for (int c = 0; c < copies; c++) {
            Mats& m = mats[c];
            memset(&m, 0, sizeof m);
            for (int i = 0; i < nm; i++) {
                m.m[i].q = q + (c * nm + i) * qb;
                m.m[i].s = s + (c * nm + i) * sb;
                m.m[i].out = out;
                m.m[i].rows = sh.rows;
                m.m[i].fmt = FMT_Q4_0;
                m.m[i].ld_out = sh.rows;
            }
            m.n_mats = nm;
            m.row0[0] = 0;
            for (int i = 1; i < 4; i++) m.row0[i] = sh.rows * (i <= nm ? i : nm);
            if (sh.gu) m.row0[1] = m.row0[2] = m.row0[3] = sh.rows;
        }
        const float* ss_in = sh.ss ? ssb : nullptr;
        QOut qo = {};
        if (sh.qout) {
            qo.xq = xqo;
            qo.ss = sh.ss ? ssb + 32768 : nullptr;
        }
        // kiln's launch (products.rs matvec, one token).
        const int total = sh.rows;
        const bool narrow = (total + 31) / 32 < num_sms && nb >= 64;
        const int kw = narrow ? 2 : 1;
        const int blocks = (total + 31) / 32;
        Kern base = (Kern)matvec_dec_q4_0_4_1;
        const char* bname = "kiln _4_1";
        if (sh.gu && kw == 1 && blocks > 2 * num_sms) {
            base = (Kern)matvec_dec_q4_0_4_1g;
            bname = "kiln _4_1g";
        }
        const int iters = copies * 4 < 400 ? 400 : copies * 4;
        // Reference output (bits) from kiln's kernel on copy 0.
        std::vector<Mats> m0(1, mats[0]);
        CK(cudaMemset(out, 0, sh.rows * 4));
        launch_set(base, 0, 256 * kw, blocks, m0, xq, sh.cols, ss_in, sh.mode, kw, qo, 1, false,
                   st);
        CK(cudaStreamSynchronize(st));
        std::vector<float> ref(sh.rows), got(sh.rows);
        std::vector<u8> refq(4 * sh.rows), gotq(4 * sh.rows);
        CK(cudaMemcpy(ref.data(), out, sh.rows * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(refq.data(), xqo, 4 * sh.rows, cudaMemcpyDeviceToHost));
        printf("== %s: %d x %d%s, %.2f MB, %d copies, kw %d, %d blocks\n", sh.name, sh.rows,
               sh.cols, sh.gu ? " (pair)" : "", mbytes / 1e6, copies, kw, blocks);
        for (int rep = 0; rep < 2; rep++) {
            float tb = launch_set(base, 0, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode, kw,
                                  qo, iters, true, st);
            float tn = launch_set(base, 0, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode, kw,
                                  qo, iters, false, st);
            printf("  %-12s pdl %7.2f us %6.0f GB/s | plain %7.2f us %6.0f GB/s\n", bname, tb,
                   mbytes / tb / 1e3, tn, mbytes / tn / 1e3);
            for (auto& v : vars) {
                if (v.gu != sh.gu) continue;
                Kern k = kw == 2 ? v.k2 : v.k1;
                const int smem = 8 * kw * v.s * (v.gu ? 8 : 4) * SCHUNK;
                if (smem > 200 * 1024) continue;
                if (rep == 0) {
                    CK(cudaMemset(out, 0, sh.rows * 4));
                    CK(cudaMemset(xqo, 0, 4 * sh.rows));
                    launch_set(k, smem, 256 * kw, blocks, m0, xq, sh.cols, ss_in, sh.mode, kw, qo,
                               1, false, st);
                    CK(cudaStreamSynchronize(st));
                    CK(cudaMemcpy(got.data(), out, sh.rows * 4, cudaMemcpyDeviceToHost));
                    CK(cudaMemcpy(gotq.data(), xqo, 4 * sh.rows, cudaMemcpyDeviceToHost));
                    int bad = 0;
                    for (int i = 0; i < sh.rows; i++) bad += memcmp(&ref[i], &got[i], 4) != 0;
                    int badq = memcmp(refq.data(), gotq.data(), sh.rows) != 0;
                    printf("  check %s: %d rows differ, quantized out %s\n", v.name, bad,
                           sh.qout ? (badq ? "DIFFERS" : "equal") : "-");
                }
                float a = launch_set(k, smem, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode,
                                     kw, qo, iters, true, st);
                float b = launch_set(k, smem, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode,
                                     kw, qo, iters, false, st);
                printf("  %-12s pdl %7.2f us %6.0f GB/s | plain %7.2f us %6.0f GB/s  (smem %d)\n",
                       v.name, a, mbytes / a / 1e3, b, mbytes / b / 1e3, smem);
            }
        }
        cudaFree(q);
        cudaFree(s);
        cudaFree(x);
        cudaFree(out);
        cudaFree(ssb);
        cudaFree(xq);
        cudaFree(xqo);
    }
    return 0;
}
#endif
