/* libcublas.so.12 for a lent GPU machine that has cuBLAS 13 only (tools/faiss_gpu_carry.py).
 *
 * PyPI's faiss-gpu-cu12 wheel links against cuBLAS 12; the lent machine's image carries CUDA 13's
 * cuBLAS and nothing can be installed there, and cuBLAS 12's wheel (580 MB) cannot travel. FAISS
 * calls eight cuBLAS functions, each of whose signatures is the same in cuBLAS 12 and 13 (only
 * integers, enums and pointers). This library defines them under the version node
 * libcublas.so.12 (cublas12_shim.map) and forwards each call to the same function of
 * libcublas.so.13, found on the loader's path. A workplace workaround, never part of condsearch:
 * where CUDA 12 is installed, faiss-gpu-cu12 finds the real library.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int status_t; /* cublasStatus_t */
typedef void *handle_t; /* cublasHandle_t */

static void *target(const char *name) {
    static void *lib;
    if (!lib) {
        lib = dlopen("libcublas.so.13", RTLD_NOW | RTLD_GLOBAL);
        if (!lib) {
            fprintf(stderr, "cublas12_shim: %s\n", dlerror());
            abort();
        }
    }
    void *f = dlsym(lib, name);
    if (!f) {
        fprintf(stderr, "cublas12_shim: no %s in libcublas.so.13\n", name);
        abort();
    }
    return f;
}

#define FORWARD(name, params, args)                                  \
    status_t name params {                                           \
        static status_t(*f) params;                                  \
        if (!f) f = (status_t(*) params)target(#name);               \
        return f args;                                               \
    }

FORWARD(cublasCreate_v2, (handle_t *h), (h))
FORWARD(cublasDestroy_v2, (handle_t h), (h))
FORWARD(cublasSetStream_v2, (handle_t h, void *stream), (h, stream))
FORWARD(cublasGetMathMode, (handle_t h, int *mode), (h, mode))
FORWARD(cublasSetMathMode, (handle_t h, int mode), (h, mode))
FORWARD(cublasSgemmEx,
        (handle_t h, int ta, int tb, int m, int n, int k, const float *alpha, const void *a, int at, int lda,
         const void *b, int bt, int ldb, const float *beta, void *c, int ct, int ldc),
        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc))
FORWARD(cublasGemmEx,
        (handle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int at, int lda,
         const void *b, int bt, int ldb, const void *beta, void *c, int ct, int ldc, int compute, int algo),
        (h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo))
FORWARD(cublasGemmStridedBatchedEx,
        (handle_t h, int ta, int tb, int m, int n, int k, const void *alpha, const void *a, int at, int lda,
         long long sa, const void *b, int bt, int ldb, long long sb, const void *beta, void *c, int ct, int ldc,
         long long sc, int count, int compute, int algo),
        (h, ta, tb, m, n, k, alpha, a, at, lda, sa, b, bt, ldb, sb, beta, c, ct, ldc, sc, count, compute, algo))
