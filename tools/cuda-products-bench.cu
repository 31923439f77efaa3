// kiln's one-token decode products (kernels/products.cu) timed alone, shape by shape, on an
// NVIDIA GPU: the matrices of the Qwen3-0.6B, Qwen3-4B and Llama-3.2-3B shapes (Q4_0, random
// blocks), each launched as products.rs launches it (grid, warps a row, the gate/up pair's
// kernel, the quantized output for the next product), over enough copies of the matrix that
// the L2 never holds it, back to back with programmatic dependent launch (as a replayed decode
// step chains them) and without, replayed from a CUDA graph: microseconds a launch, and the
// bandwidth that makes.
// BENCHMARKS.md's thirty-first session has what it measured launched one by one (with, at
// 3dcd0f5, a variant staging the weights through cp.async), its forty-third what it measures
// replayed.
//
// On the GPU machine, from the repository root:
//   nvcc -O3 -arch=sm_90 -std=c++17 -I crates/kiln-cuda/src/kernels \
//       tools/cuda-products-bench.cu -o /tmp/products-bench && /tmp/products-bench
#include <cstring>
#include <vector>

#include "cuda-launch.h"
// (kernels/, by -I)
#include "common.cu"
#include "products.cu"

typedef void (*Kern)(Mats, const u8*, int, int, const float*, float, int, int, QOut);

// One product: rows x cols (a gate/up pair: two such matrices), its mode, whether its output
// is quantized for the next product (qout) and whether its input's 1 / rms comes from the
// producer's sums of squares (ss), as in a decode step.
struct Shape {
    const char *model, *name;
    int rows, cols, gu, mode, qout, ss;
};

static int num_sms;

// Microseconds a launch of k takes, iters launches in a row over mats in turn (after as many
// to warm up), chained with programmatic dependent launch (pdl) or plainly.
static float launch_set(Kern k, int threads, int blocks, std::vector<Mats>& mats, const u8* xq,
                        int cols, const float* ss_in, int mode, int kw, QOut qo, int iters,
                        bool pdl, cudaStream_t st) {
    PdlLaunch l(blocks, threads, st, pdl);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    // The launches captured in a graph and replayed (as a decode step is): launched one by
    // one, the host's launch rate (~2.7 us on an H100) would hide the kernels' own time.
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < iters; i++) {
        Mats m = mats[i % mats.size()];
        CK(cudaLaunchKernelEx(&l.cfg, k, m, xq, cols, 1, ss_in, 1e-6f, mode, kw, qo));
    }
    CK(cudaStreamEndCapture(st, &g));
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int w = 0; w < 2; w++) {
        if (w == 1) CK(cudaEventRecord(e0, st));
        CK(cudaGraphLaunch(ge, st));
    }
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    return ms * 1000.0f / iters;
}

int main() {
    // A line at a time: each shape takes seconds to set up (its copies filled at random).
    setvbuf(stdout, nullptr, _IOLBF, 0);
    CK(cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    // Each model's four products a layer: Q/K/V, the output projection, the gate/up pair and
    // down (hidden size, Q/K/V rows, attention width, feed-forward width).
    struct Model {
        const char* name;
        int hidden, qkv, attn, ffn;
    };
    const Model models[] = {{"Qwen3-0.6B", 1024, 4096, 2048, 3072},
                            {"Qwen3-4B", 2560, 6144, 4096, 9728},
                            {"Llama-3.2-3B", 3072, 5120, 3072, 8192}};
    std::vector<Shape> shapes;
    for (const Model& m : models) {
        shapes.push_back({m.name, "Q/K/V", m.qkv, m.hidden, 0, MODE_STORE, 0, 0});
        shapes.push_back({m.name, "output", m.hidden, m.attn, 0, MODE_ADD, 1, 1});
        shapes.push_back({m.name, "gate/up", m.ffn, m.hidden, 1, MODE_GATE_UP, 1, 0});
        shapes.push_back({m.name, "down", m.hidden, m.ffn, 0, MODE_ADD, 1, 1});
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
            // One matrix's rows, or a pair's (whose launch counts the gate's rows only).
            m.n_mats = nm;
            m.row0[1] = m.row0[2] = m.row0[3] = sh.rows;
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
        printf("== %s %s: %d x %d%s, %.2f MB, %d copies, kw %d, %d blocks\n", sh.model, sh.name,
               sh.rows, sh.cols, sh.gu ? " (pair)" : "", mbytes / 1e6, copies, kw, blocks);
        for (int rep = 0; rep < 2; rep++) {
            float tb = launch_set(base, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode, kw, qo,
                                  iters, true, st);
            float tn = launch_set(base, 256 * kw, blocks, mats, xq, sh.cols, ss_in, sh.mode, kw, qo,
                                  iters, false, st);
            printf("  %-12s pdl %7.2f us %6.0f GB/s | plain %7.2f us %6.0f GB/s\n", bname, tb,
                   mbytes / tb / 1e3, tn, mbytes / tn / 1e3);
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
