// What a dependency between two steps of a decode costs on an NVIDIA GPU: a kernel boundary
// (an empty kernel chained to the next by programmatic dependent launch, as a replayed decode
// step chains its kernels, launched one by one and replayed from a CUDA graph) against a
// barrier over all blocks of one persistent kernel (a monotonic counter in global memory,
// one atomic a block, then a wait on it), with one block and two blocks a multiprocessor.
//
// On the GPU machine, from the repository root:
//   nvcc -O3 -arch=sm_90 -std=c++17 tools/cuda-sync-bench.cu -o /tmp/sync-bench && /tmp/sync-bench
#include "cuda-launch.h"

__global__ void empty_chain() {
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
}

__device__ unsigned g_count;

__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// n barriers over all blocks: block thread 0 adds one to the counter (release) and waits
// until it reaches the barrier's target (acquire); the block's other threads wait at the
// block barriers around it.
__global__ void barriers(int n) {
    for (int i = 1; i <= n; i++) {
        __syncthreads();
        if (threadIdx.x == 0) {
            const unsigned target = i * gridDim.x;
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(&g_count) : "memory");
            while (ld_acquire(&g_count) < target) {
            }
        }
        __syncthreads();
    }
}

static float time_ms(cudaStream_t st, void (*f)(cudaStream_t), int reps) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    f(st);
    CK(cudaStreamSynchronize(st));
    float best = 1e30f;
    for (int r = 0; r < reps; r++) {
        CK(cudaEventRecord(e0, st));
        f(st);
        CK(cudaEventRecord(e1, st));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return best;
}

static const int N = 1000;
static int g_blocks = 132, g_threads = 256;
static bool g_pdl = true;
static cudaGraphExec_t g_exec;

static void chain(cudaStream_t st) {
    PdlLaunch l(g_blocks, g_threads, st, g_pdl);
    for (int i = 0; i < N; i++) CK(cudaLaunchKernelEx(&l.cfg, empty_chain));
}
static void replay(cudaStream_t st) { CK(cudaGraphLaunch(g_exec, st)); }
static void persistent(cudaStream_t st) {
    unsigned zero = 0;
    CK(cudaMemcpyToSymbolAsync(g_count, &zero, 4, 0, cudaMemcpyHostToDevice, st));
    barriers<<<g_blocks, g_threads, 0, st>>>(N);
}

int main() {
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (int blocks : {sms, 2 * sms}) {
        for (int threads : {256, 512}) {
            g_blocks = blocks;
            g_threads = threads;
            printf("== %d blocks of %d threads, %d steps\n", blocks, threads, N);
            for (int pdl = 1; pdl >= 0; pdl--) {
                g_pdl = pdl;
                const float launched = time_ms(st, chain, 5);
                cudaGraph_t g;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                chain(st);
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&g_exec, g, 0));
                const float replayed = time_ms(st, replay, 5);
                CK(cudaGraphExecDestroy(g_exec));
                CK(cudaGraphDestroy(g));
                printf("  kernel boundary%s: launched %.2f us, replayed %.2f us a step\n",
                       pdl ? " (PDL)" : "", launched * 1000 / N, replayed * 1000 / N);
            }
            const float bar = time_ms(st, persistent, 5);
            printf("  grid barrier in one kernel: %.2f us a step\n", bar * 1000 / N);
        }
    }
    return 0;
}
