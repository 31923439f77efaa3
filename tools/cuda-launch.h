// What the CUDA benchmarks under tools/ share: a check on every runtime call, and a launch
// chained to the one before it by programmatic dependent launch (as a replayed decode step
// chains its kernels).
#pragma once
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#define CK(x)                                                                                 \
    do {                                                                                      \
        cudaError_t e = (x);                                                                  \
        if (e != cudaSuccess) {                                                               \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

// blocks x threads on st, under programmatic dependent launch when pdl: pass &cfg to
// cudaLaunchKernelEx.
struct PdlLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    PdlLaunch(int blocks, int threads, cudaStream_t st, bool pdl) {
        cfg.gridDim = dim3(blocks);
        cfg.blockDim = dim3(threads);
        cfg.stream = st;
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = pdl ? 1 : 0;
    }
    PdlLaunch(const PdlLaunch&) = delete;
    PdlLaunch& operator=(const PdlLaunch&) = delete;
};
