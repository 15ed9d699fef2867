/* One pass over float32 gradient bytes: their minimum, maximum and sum of squares.
 *
 * The stats a commit writes (docs/FORMAT.md, "Gradient stats") take NumPy three passes
 * over each gradient (max, min, a sum of squares); this takes one, so the bytes come from
 * memory once. Optional: gradvault builds it where a C compiler is at hand and falls back
 * to NumPy where it is not (core/store/_stats.py).
 *
 * Semantics, relied on by _stats.py: a NaN is skipped by the minimum and maximum and makes
 * the sum of squares NaN; an infinity makes it infinite; so a finite sum of squares means
 * every value was finite. The squares are added in float32 in 16 lanes over blocks of
 * 1024 values, each block's lanes then added in float64 (a relative error around 1e-9 on
 * normal data, as NumPy's path through BLAS).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

#define BLOCK 1024

#define DEFINE_KERNEL(NAME, BYTES, ATTRIBUTE)                                              \
    typedef float NAME##_vf __attribute__((vector_size(BYTES)));                           \
    typedef int NAME##_vi __attribute__((vector_size(BYTES)));                             \
    ATTRIBUTE static void NAME(const float *x, size_t n, float *out_min, float *out_max,   \
                               double *out_sum_squares)                                    \
    {                                                                                      \
        enum { W = BYTES / 4 };                                                            \
        NAME##_vf lo0, lo1, hi0, hi1;                                                      \
        for (int k = 0; k < W; k++) {                                                      \
            lo0[k] = lo1[k] = INFINITY;                                                    \
            hi0[k] = hi1[k] = -INFINITY;                                                   \
        }                                                                                  \
        double total = 0.0;                                                                \
        size_t i = 0;                                                                      \
        while (i + 2 * W <= n) {                                                           \
            size_t end = i + BLOCK;                                                        \
            if (end > n)                                                                   \
                end = n - (n - i) % (2 * W);                                               \
            NAME##_vf a0 = {0}, a1 = {0};                                                  \
            for (; i < end; i += 2 * W) {                                                  \
                NAME##_vf v0, v1;                                                          \
                memcpy(&v0, x + i, sizeof v0);                                             \
                memcpy(&v1, x + i + W, sizeof v1);                                         \
                a0 += v0 * v0;                                                             \
                a1 += v1 * v1;                                                             \
                /* v < lo ? v : lo, lane by lane: a NaN never replaces lo */               \
                NAME##_vi m0 = v0 < lo0, m1 = v1 < lo1;                                    \
                lo0 = (NAME##_vf)(((NAME##_vi)v0 & m0) | ((NAME##_vi)lo0 & ~m0));          \
                lo1 = (NAME##_vf)(((NAME##_vi)v1 & m1) | ((NAME##_vi)lo1 & ~m1));          \
                m0 = v0 > hi0;                                                             \
                m1 = v1 > hi1;                                                             \
                hi0 = (NAME##_vf)(((NAME##_vi)v0 & m0) | ((NAME##_vi)hi0 & ~m0));          \
                hi1 = (NAME##_vf)(((NAME##_vi)v1 & m1) | ((NAME##_vi)hi1 & ~m1));          \
            }                                                                              \
            double block = 0.0;                                                            \
            for (int k = 0; k < W; k++)                                                    \
                block += (double)a0[k] + (double)a1[k];                                    \
            total += block;                                                                \
        }                                                                                  \
        float low = INFINITY, high = -INFINITY;                                            \
        for (int k = 0; k < W; k++) {                                                      \
            low = lo0[k] < low ? lo0[k] : low;                                             \
            low = lo1[k] < low ? lo1[k] : low;                                             \
            high = hi0[k] > high ? hi0[k] : high;                                          \
            high = hi1[k] > high ? hi1[k] : high;                                          \
        }                                                                                  \
        for (; i < n; i++) {                                                               \
            float v = x[i];                                                                \
            total += (double)v * v;                                                        \
            low = v < low ? v : low;                                                       \
            high = v > high ? v : high;                                                    \
        }                                                                                  \
        *out_min = low;                                                                    \
        *out_max = high;                                                                   \
        *out_sum_squares = total;                                                          \
    }

typedef void (*kernel_t)(const float *, size_t, float *, float *, double *);

/* 16-byte vectors: SSE2 on every x86-64 CPU, NEON on ARMv8 */
DEFINE_KERNEL(stats_128, 16, )
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* 32-byte vectors where the CPU has AVX2, chosen when the module is imported */
DEFINE_KERNEL(stats_256, 32, __attribute__((target("avx2"))))
#endif

static kernel_t kernel = stats_128;
static const char *kernel_name = "128-bit vectors";

static PyObject *
run_kernel(kernel_t run, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return NULL;
    const char *format = view.format == NULL ? "B" : view.format;
    int native = strcmp(format, "f") == 0 || strcmp(format, "=f") == 0 ||
                 strcmp(format, PY_LITTLE_ENDIAN ? "<f" : ">f") == 0;
    if (view.itemsize != 4 || !native) {
        PyErr_Format(PyExc_TypeError,
                     "min_max_sum_squares takes float32 values, not format %s of %zd bytes",
                     format, view.itemsize);
        PyBuffer_Release(&view);
        return NULL;
    }
    size_t count = (size_t)(view.len / 4);
    if (count == 0) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "min_max_sum_squares of no values");
        return NULL;
    }
    float low, high;
    double sum_squares;
    Py_BEGIN_ALLOW_THREADS
    run((const float *)view.buf, count, &low, &high, &sum_squares);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(ddd)", (double)low, (double)high, sum_squares);
}

static PyObject *
min_max_sum_squares(PyObject *module, PyObject *arg)
{
    (void)module;
    return run_kernel(kernel, arg);
}

static PyObject *
min_max_sum_squares_portable(PyObject *module, PyObject *arg)
{
    (void)module;
    return run_kernel(stats_128, arg);
}

static PyMethodDef methods[] = {
    {"min_max_sum_squares", min_max_sum_squares, METH_O,
     "min_max_sum_squares(values, /) -> (min, max, sum of squares)\n\n"
     "Of a C-contiguous buffer of float32 values, in one pass, without the GIL, by the\n"
     "kernel KERNEL names. NaN is skipped by min and max and makes the sum of squares NaN."},
    {"min_max_sum_squares_portable", min_max_sum_squares_portable, METH_O,
     "min_max_sum_squares_portable(values, /) -> (min, max, sum of squares)\n\n"
     "The same by the 128-bit kernel, which every CPU runs (tests check it where the CPU\n"
     "gets the 256-bit one)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_fused_stats",
    "Min, max and sum of squares of float32 values in one pass (see _stats.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fused_stats(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        kernel = stats_256;
        kernel_name = "256-bit vectors (AVX2)";
    }
#endif
    PyObject *module = PyModule_Create(&module_definition);
    if (module != NULL && PyModule_AddStringConstant(module, "KERNEL", kernel_name) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
