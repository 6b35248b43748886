/* A stand-in libcuda.so.1 for CI (no GPU): just the calls reflex_core.cuda.early makes.
 * Environment knobs pick the outcome, so the tests can drive every error path:
 *   STUB_CUINIT=<CUresult>     what cuInit returns (0 = success)
 *   STUB_COUNT=<n>             devices reported (default 1)
 *   STUB_SM=<major*10+minor>   compute capability (default 90)
 *   STUB_CTX=<CUresult>        what cuDevicePrimaryCtxRetain returns
 * The "context" is the address of a static int; cuCtxSetCurrent records it. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>

static int fake_ctx;
static void *current;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v ? atoi(v) : dflt;
}

static char seen_env[128]; /* CUDA_DEVICE_MAX_CONNECTIONS / CUDA_MODULE_LOADING at cuInit */

int cuInit(unsigned int flags) {
    (void)flags;
    const char *a = getenv("CUDA_DEVICE_MAX_CONNECTIONS"), *b = getenv("CUDA_MODULE_LOADING");
    snprintf(seen_env, sizeof seen_env, "%s,%s", a ? a : "-", b ? b : "-");
    return env_int("STUB_CUINIT", 0);
}
const char *stub_seen_env(void) { return seen_env; }
int cuDeviceGetCount(int *n) { *n = env_int("STUB_COUNT", 1); return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return 0; }
int cuDeviceGetName(char *name, int len, int dev) {
    (void)dev; strncpy(name, "Stub GPU", (size_t)len); return 0;
}
int cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    int sm = env_int("STUB_SM", 90);
    if (attr == 75) { *v = sm / 10; return 0; }
    if (attr == 76) { *v = sm % 10; return 0; }
    return 1; /* CUDA_ERROR_INVALID_VALUE */
}
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)1 << 34; return 0; }
int cuDriverGetVersion(int *v) { *v = 13000; return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev;
    int r = env_int("STUB_CTX", 0);
    if (r == 0) *ctx = &fake_ctx;
    return r;
}
int cuCtxSetCurrent(void *ctx) { current = ctx; return 0; }
int cuCtxGetCurrent(void **ctx) { *ctx = current; return 0; }

static const char *names[][3] = {
    {"100", "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {"35", "CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA driver version is insufficient"},
    {"2", "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {"999", "CUDA_ERROR_UNKNOWN", "unknown error"},
};
static int lookup(int code, int which, const char **out) {
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (atoi(names[i][0]) == code) { *out = names[i][which]; return 0; }
    *out = NULL;
    return 1;
}
int cuGetErrorName(int code, const char **s) { return lookup(code, 1, s); }
int cuGetErrorString(int code, const char **s) { return lookup(code, 2, s); }
