/* One pass over float32 gradient bytes: their minimum, maximum and sum of squares, and
 * where the CPU can, their crc32c in the same pass (crc_stats_256 and crc_stats_512 below).
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
#include <stdint.h>
#include <string.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_X86_KERNELS 1
/* 256-bit carry-less multiplies (VPCLMULQDQ) are known to GCC from 8, to clang from 8 */
#if defined(__clang__) ? __clang_major__ >= 8 : __GNUC__ >= 8
#define HAVE_FOLDING 1
#endif
#endif

#define BLOCK 1024

/* Bytes read ahead of the pass with a prefetch: a gradient just out of the caches reaches
 * the cores at the pace of one stream's hardware prefetcher otherwise. On a 2-core
 * Xeon VM the MLP's 8.4 MB took 1.09-1.12 ms out of memory and 0.35-0.49 ms from the L3
 * without it, 0.72-0.77 ms and 0.30-0.33 ms with it (4, 8 or 16 KiB ahead alike). */
#define PREFETCH_AHEAD 4096

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
                __builtin_prefetch((const char *)(x + i) + PREFETCH_AHEAD);                \
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
#ifdef HAVE_X86_KERNELS
/* 32-byte vectors where the CPU has AVX2, chosen when the module is imported */
DEFINE_KERNEL(stats_256, 32, __attribute__((target("avx2"))))

#ifdef HAVE_FOLDING
/* crc32c and the stats in one pass (x86-64 with SSE4.2, PCLMULQDQ, AVX2 and VPCLMULQDQ).
 *
 * A commit takes each gradient's crc32c and its stats; apart, they are two passes over
 * bytes that come from memory (or the shared cache) twice. Here each 128 bytes are loaded
 * once for both: into four 256-bit vectors, whose min, max and squares are taken and
 * which are folded into eight 128-bit remainders (two per vector) by carry-less
 * multiplication (Intel's "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ"): a 128-bit piece X whose bits stand D bits before the piece it is added to
 * contributes X * x^D, which modulo the polynomial P is its two 64-bit halves times
 * x^(D+64) mod P and x^D mod P. In the CRC's reflected bit order a carry-less product
 * comes out multiplied by x once more, hence the constants x^(D+63) and x^(D-1) mod P
 * (reflected, in the upper half of each 64-bit lane). The eight remainders are folded
 * into one, whose crc32 instructions give the register; the last bytes, fewer than 128,
 * go through the instruction 8 bytes at a time.
 *
 * The squares are added in float32 in 16 lanes over blocks of 1024 values, each block's
 * then in float64: the rounding of the vector kernels above. */
#define FOLD_BY_8_HIGH 0x6577b24500000000ULL /* x^1087 mod P: the lower half's, D = 1024 */
#define FOLD_BY_8_LOW 0x7417153f00000000ULL  /* x^1023 mod P: the upper half's */
#define FOLD_BY_1_HIGH 0x3743f7bd00000000ULL /* x^191 mod P: D = 128 */
#define FOLD_BY_1_LOW 0x3171d43000000000ULL  /* x^127 mod P */

__attribute__((target("sse4.2"))) static uint32_t
crc_raw(uint32_t raw, const unsigned char *p, size_t n)
{
    for (; n >= 8; p += 8, n -= 8) {
        uint64_t word;
        memcpy(&word, p, 8);
        raw = (uint32_t)_mm_crc32_u64(raw, word);
    }
    for (; n; p++, n--)
        raw = _mm_crc32_u8(raw, *p);
    return raw;
}

/* each 128-bit lane of ``x``: its two 64-bit halves multiplied by those of ``k``
 * (carry-less), added */
__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) static inline __m256i
fold(__m256i x, __m256i k)
{
    return _mm256_xor_si256(_mm256_clmulepi64_epi128(x, k, 0x00),
                            _mm256_clmulepi64_epi128(x, k, 0x11));
}

__attribute__((target("sse4.2,pclmul"))) static inline __m128i
fold_128(__m128i x, __m128i k)
{
    return _mm_xor_si128(_mm_clmulepi64_si128(x, k, 0x00), _mm_clmulepi64_si128(x, k, 0x11));
}

__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) static inline __m256d
widen_sum(__m256 a)
{
    return _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(a)),
                         _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
}

__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) static uint32_t
crc_stats_256(const float *x, size_t n, uint32_t crc, float *out_min, float *out_max,
              double *out_sum_squares)
{
    const unsigned char *p = (const unsigned char *)x;
    size_t bytes = n * 4;
    size_t folded = bytes / 128 * 128;
    uint32_t raw = ~crc;
    /* _mm256_min_ps(v, lo) is lo where v is NaN: NaN is skipped, as by the other kernels */
    __m256 lo0 = _mm256_set1_ps(INFINITY), lo1 = lo0;
    __m256 hi0 = _mm256_set1_ps(-INFINITY), hi1 = hi0;
    __m256d total = _mm256_setzero_pd();
    if (folded) {
        const __m256i by_8 = _mm256_set_epi64x(
            (long long)FOLD_BY_8_LOW, (long long)FOLD_BY_8_HIGH, (long long)FOLD_BY_8_LOW,
            (long long)FOLD_BY_8_HIGH);
        const __m128i by_1 = _mm_set_epi64x((long long)FOLD_BY_1_LOW, (long long)FOLD_BY_1_HIGH);
        /* the remainder's eight 128-bit lanes, two in each of r0-r3; the register stands
         * for its value added to the first 4 bytes */
        __m256i held = _mm256_inserti128_si256(_mm256_setzero_si256(),
                                               _mm_cvtsi32_si128((int)raw), 0);
        __m256i r0 = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)p), held);
        __m256i r1 = _mm256_loadu_si256((const __m256i *)(p + 32));
        __m256i r2 = _mm256_loadu_si256((const __m256i *)(p + 64));
        __m256i r3 = _mm256_loadu_si256((const __m256i *)(p + 96));
        for (size_t block = 0; block < folded; block += 4 * BLOCK) {
            size_t end = block + 4 * BLOCK < folded ? block + 4 * BLOCK : folded;
            __m256 s0 = _mm256_setzero_ps(), s1 = s0;
            for (size_t at = block; at < end; at += 128) {
                __builtin_prefetch(p + at + PREFETCH_AHEAD);
                __builtin_prefetch(p + at + PREFETCH_AHEAD + 64);
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(p + at));
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(p + at + 32));
                __m256i w2 = _mm256_loadu_si256((const __m256i *)(p + at + 64));
                __m256i w3 = _mm256_loadu_si256((const __m256i *)(p + at + 96));
                __m256 v0 = _mm256_castsi256_ps(w0), v1 = _mm256_castsi256_ps(w1);
                __m256 v2 = _mm256_castsi256_ps(w2), v3 = _mm256_castsi256_ps(w3);
                s0 = _mm256_add_ps(s0, _mm256_mul_ps(v0, v0));
                s1 = _mm256_add_ps(s1, _mm256_mul_ps(v1, v1));
                s0 = _mm256_add_ps(s0, _mm256_mul_ps(v2, v2));
                s1 = _mm256_add_ps(s1, _mm256_mul_ps(v3, v3));
                lo0 = _mm256_min_ps(v0, lo0);
                lo1 = _mm256_min_ps(v1, lo1);
                hi0 = _mm256_max_ps(v0, hi0);
                hi1 = _mm256_max_ps(v1, hi1);
                lo0 = _mm256_min_ps(v2, lo0);
                lo1 = _mm256_min_ps(v3, lo1);
                hi0 = _mm256_max_ps(v2, hi0);
                hi1 = _mm256_max_ps(v3, hi1);
                if (at) { /* the first 128 bytes are the remainder's start */
                    r0 = _mm256_xor_si256(fold(r0, by_8), w0);
                    r1 = _mm256_xor_si256(fold(r1, by_8), w1);
                    r2 = _mm256_xor_si256(fold(r2, by_8), w2);
                    r3 = _mm256_xor_si256(fold(r3, by_8), w3);
                }
            }
            total = _mm256_add_pd(total, _mm256_add_pd(widen_sum(s0), widen_sum(s1)));
        }
        __m128i r = _mm256_castsi256_si128(r0);
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_extracti128_si256(r0, 1));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_castsi256_si128(r1));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_extracti128_si256(r1, 1));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_castsi256_si128(r2));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_extracti128_si256(r2, 1));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_castsi256_si128(r3));
        r = _mm_xor_si128(fold_128(r, by_1), _mm256_extracti128_si256(r3, 1));
        raw = (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
        raw = (uint32_t)_mm_crc32_u64(raw, (uint64_t)_mm_extract_epi64(r, 1));
    }
    float lows[8], highs[8];
    double sums[4];
    _mm256_storeu_ps(lows, _mm256_min_ps(lo0, lo1));
    _mm256_storeu_ps(highs, _mm256_max_ps(hi0, hi1));
    _mm256_storeu_pd(sums, total);
    float low = INFINITY, high = -INFINITY;
    for (int k = 0; k < 8; k++) {
        low = lows[k] < low ? lows[k] : low;
        high = highs[k] > high ? highs[k] : high;
    }
    double sum_squares = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    if (folded < bytes) { /* the last values, fewer than 32 */
        raw = crc_raw(raw, p + folded, bytes - folded);
        for (size_t i = folded / 4; i < n; i++) {
            float v = x[i];
            sum_squares += (double)v * v;
            low = v < low ? v : low;
            high = v > high ? v : high;
        }
    }
    *out_min = low;
    *out_max = high;
    *out_sum_squares = sum_squares;
    return ~raw;
}

/* The same pass on 512-bit vectors (x86-64 with AVX-512F and VPCLMULQDQ as well): each
 * 256 bytes loaded into four vectors, folded into sixteen 128-bit remainders (four per
 * vector, 2048 bits apart from one 256 bytes to the next), which are then folded into
 * one as above; the last bytes, fewer than 256, go through the 256-bit pass. Half the
 * carry-less multiplies of the 256-bit pass for the same bytes: the MLP's 8.4 MB in
 * 0.21 instead of 0.31 ms from the L3 of a 2-core AMD EPYC VM, 0.27 instead of 0.32 ms
 * out of it. The squares are added in one vector of 16 lanes: the same lanes, and the
 * same rounding, as the 256-bit pass. */
#define FOLD_BY_16_HIGH 0xe9a5d8be00000000ULL /* x^2111 mod P: the lower half's, D = 2048 */
#define FOLD_BY_16_LOW 0x1426a81500000000ULL  /* x^2047 mod P: the upper half's */
#define TARGET_512 __attribute__((target("sse4.2,pclmul,avx2,avx512f,vpclmulqdq")))

TARGET_512 static inline __m512i
fold_512(__m512i x, __m512i k)
{
    return _mm512_xor_si512(_mm512_clmulepi64_epi128(x, k, 0x00),
                            _mm512_clmulepi64_epi128(x, k, 0x11));
}

TARGET_512 static uint32_t
crc_stats_512(const float *x, size_t n, uint32_t crc, float *out_min, float *out_max,
              double *out_sum_squares)
{
    const unsigned char *p = (const unsigned char *)x;
    size_t bytes = n * 4;
    size_t folded = bytes / 256 * 256;
    uint32_t raw = ~crc;
    __m512 lo0 = _mm512_set1_ps(INFINITY), lo1 = lo0;
    __m512 hi0 = _mm512_set1_ps(-INFINITY), hi1 = hi0;
    __m512d total = _mm512_setzero_pd();
    if (folded) {
        const __m512i by_16 = _mm512_set_epi64(
            (long long)FOLD_BY_16_LOW, (long long)FOLD_BY_16_HIGH, (long long)FOLD_BY_16_LOW,
            (long long)FOLD_BY_16_HIGH, (long long)FOLD_BY_16_LOW, (long long)FOLD_BY_16_HIGH,
            (long long)FOLD_BY_16_LOW, (long long)FOLD_BY_16_HIGH);
        const __m128i by_1 = _mm_set_epi64x((long long)FOLD_BY_1_LOW, (long long)FOLD_BY_1_HIGH);
        __m512i held = _mm512_inserti32x4(_mm512_setzero_si512(), _mm_cvtsi32_si128((int)raw), 0);
        __m512i r0 = _mm512_xor_si512(_mm512_loadu_si512((const void *)p), held);
        __m512i r1 = _mm512_loadu_si512((const void *)(p + 64));
        __m512i r2 = _mm512_loadu_si512((const void *)(p + 128));
        __m512i r3 = _mm512_loadu_si512((const void *)(p + 192));
        for (size_t block = 0; block < folded; block += 4 * BLOCK) {
            size_t end = block + 4 * BLOCK < folded ? block + 4 * BLOCK : folded;
            __m512 s = _mm512_setzero_ps();
            for (size_t at = block; at < end; at += 256) {
                for (int line = 0; line < 256; line += 64)
                    __builtin_prefetch(p + at + PREFETCH_AHEAD + line);
                __m512i w0 = _mm512_loadu_si512((const void *)(p + at));
                __m512i w1 = _mm512_loadu_si512((const void *)(p + at + 64));
                __m512i w2 = _mm512_loadu_si512((const void *)(p + at + 128));
                __m512i w3 = _mm512_loadu_si512((const void *)(p + at + 192));
                __m512 v0 = _mm512_castsi512_ps(w0), v1 = _mm512_castsi512_ps(w1);
                __m512 v2 = _mm512_castsi512_ps(w2), v3 = _mm512_castsi512_ps(w3);
                s = _mm512_add_ps(s, _mm512_mul_ps(v0, v0));
                s = _mm512_add_ps(s, _mm512_mul_ps(v1, v1));
                s = _mm512_add_ps(s, _mm512_mul_ps(v2, v2));
                s = _mm512_add_ps(s, _mm512_mul_ps(v3, v3));
                lo0 = _mm512_min_ps(v0, lo0);
                lo1 = _mm512_min_ps(v1, lo1);
                hi0 = _mm512_max_ps(v0, hi0);
                hi1 = _mm512_max_ps(v1, hi1);
                lo0 = _mm512_min_ps(v2, lo0);
                lo1 = _mm512_min_ps(v3, lo1);
                hi0 = _mm512_max_ps(v2, hi0);
                hi1 = _mm512_max_ps(v3, hi1);
                if (at) { /* the first 256 bytes are the remainder's start */
                    r0 = _mm512_xor_si512(fold_512(r0, by_16), w0);
                    r1 = _mm512_xor_si512(fold_512(r1, by_16), w1);
                    r2 = _mm512_xor_si512(fold_512(r2, by_16), w2);
                    r3 = _mm512_xor_si512(fold_512(r3, by_16), w3);
                }
            }
            __m256 low_lanes = _mm512_castps512_ps256(s);
            __m256 high_lanes = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1));
            total = _mm512_add_pd(total, _mm512_add_pd(_mm512_cvtps_pd(low_lanes),
                                                       _mm512_cvtps_pd(high_lanes)));
        }
        __m128i lanes[16]; /* the remainder's, first to last */
        _mm512_storeu_si512((void *)lanes, r0);
        _mm512_storeu_si512((void *)(lanes + 4), r1);
        _mm512_storeu_si512((void *)(lanes + 8), r2);
        _mm512_storeu_si512((void *)(lanes + 12), r3);
        __m128i r = lanes[0];
        for (int k = 1; k < 16; k++)
            r = _mm_xor_si128(fold_128(r, by_1), lanes[k]);
        raw = (uint32_t)_mm_crc32_u64(0, (uint64_t)_mm_cvtsi128_si64(r));
        raw = (uint32_t)_mm_crc32_u64(raw, (uint64_t)_mm_extract_epi64(r, 1));
    }
    float low = _mm512_reduce_min_ps(_mm512_min_ps(lo0, lo1));
    float high = _mm512_reduce_max_ps(_mm512_max_ps(hi0, hi1));
    double sum_squares = _mm512_reduce_add_pd(total);
    if (folded < bytes) { /* the last values, fewer than 64, by the 256-bit pass */
        float tail_low, tail_high;
        double tail_sum_squares;
        raw = ~crc_stats_256(x + folded / 4, n - folded / 4, ~raw, &tail_low, &tail_high,
                             &tail_sum_squares);
        low = tail_low < low ? tail_low : low;
        high = tail_high > high ? tail_high : high;
        sum_squares += tail_sum_squares;
    }
    *out_min = low;
    *out_max = high;
    *out_sum_squares = sum_squares;
    return ~raw;
}

typedef uint32_t (*checksum_kernel_t)(const float *, size_t, uint32_t, float *, float *,
                                      double *);
/* crc_stats_512 where the CPU has AVX-512F, chosen when the module is imported */
static checksum_kernel_t checksum_kernel = crc_stats_256;
static const char *checksum_kernel_name = "256-bit carry-less multiplies";
#endif /* HAVE_FOLDING */
#endif

static kernel_t kernel = stats_128;
static const char *kernel_name = "128-bit vectors";

/* ``arg``'s buffer, which must hold native float32 values, at least one; -1 with an
 * exception set otherwise (the buffer then released) */
static int
float32_values(PyObject *arg, Py_buffer *view, size_t *count)
{
    if (PyObject_GetBuffer(arg, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0)
        return -1;
    const char *format = view->format == NULL ? "B" : view->format;
    int native = strcmp(format, "f") == 0 || strcmp(format, "=f") == 0 ||
                 strcmp(format, PY_LITTLE_ENDIAN ? "<f" : ">f") == 0;
    if (view->itemsize != 4 || !native) {
        PyErr_Format(PyExc_TypeError, "float32 values wanted, not format %s of %zd bytes",
                     format, view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    *count = (size_t)(view->len / 4);
    if (*count == 0) {
        PyBuffer_Release(view);
        PyErr_SetString(PyExc_ValueError, "no values: stats need at least one");
        return -1;
    }
    return 0;
}

static PyObject *
run_kernel(kernel_t run, PyObject *arg)
{
    Py_buffer view;
    size_t count;
    if (float32_values(arg, &view, &count) < 0)
        return NULL;
    float low, high;
    double sum_squares;
    Py_BEGIN_ALLOW_THREADS
    run((const float *)view.buf, count, &low, &high, &sum_squares);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(ddd)", (double)low, (double)high, sum_squares);
}

#ifdef HAVE_FOLDING
static PyObject *
run_checksum_kernel(checksum_kernel_t run, const char *name, PyObject *const *args,
                    Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes (values, crc), not %zd arguments", name, nargs);
        return NULL;
    }
    unsigned long crc = PyLong_AsUnsignedLong(args[1]);
    if (crc == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    if (crc > 0xFFFFFFFFUL) {
        PyErr_Format(PyExc_OverflowError, "%s: crc over 32 bits", name);
        return NULL;
    }
    Py_buffer view;
    size_t count;
    if (float32_values(args[0], &view, &count) < 0)
        return NULL;
    float low, high;
    double sum_squares;
    uint32_t value;
    Py_BEGIN_ALLOW_THREADS
    value = run((const float *)view.buf, count, (uint32_t)crc, &low, &high, &sum_squares);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    return Py_BuildValue("(kddd)", (unsigned long)value, (double)low, (double)high,
                         sum_squares);
}

static PyObject *
crc32c_min_max_sum_squares(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_checksum_kernel(checksum_kernel, "crc32c_min_max_sum_squares", args, nargs);
}

static PyObject *
crc32c_min_max_sum_squares_256(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    return run_checksum_kernel(crc_stats_256, "crc32c_min_max_sum_squares_256", args, nargs);
}
/* crc32c(A + B) from crc32c(A), crc32c(B) and len(B): crc32c(A) times x^(8 len(B)) modulo
 * P, plus crc32c(B) (the pre- and post-inversions cancel). Products are taken in the
 * CRC's reflected bit order, bit 31 standing for x^0; ``powers[k]`` is x^(2^k) mod P, up
 * to x^(2^66): x^(8 len(B)) for any length a 64-bit size holds. */
#define CRC32C_POLY 0x82f63b78u
#define POWERS 67
static uint32_t powers[POWERS];

static uint32_t
multiply_mod_p(uint32_t a, uint32_t b)
{
    uint32_t product = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m)
            product ^= b;
        b = b & 1 ? (b >> 1) ^ CRC32C_POLY : b >> 1;
    }
    return product;
}

static void
init_powers(void)
{
    uint32_t p = 1u << 30; /* x^1 */
    for (int k = 0; k < POWERS; k++) {
        powers[k] = p;
        p = multiply_mod_p(p, p);
    }
}

static uint32_t
crc32c_combine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b)
{
    uint32_t shift = 1u << 31; /* x^0 */
    for (int k = 3; length_b; length_b >>= 1, k++) /* x^(8 n) = x^(n 2^3) */
        if (length_b & 1)
            shift = multiply_mod_p(powers[k], shift);
    return multiply_mod_p(shift, crc_a) ^ crc_b;
}

typedef struct {
    Py_buffer view;
    int stats;
    uint32_t own, running;
    float low, high;
    double sum_squares;
} part_t;

/* the crc32c of ``length`` bytes at ``p`` (their stats too, where ``stats``: float32
 * values, ``length`` a multiple of 4), in one pass */
__attribute__((target("sse4.2,pclmul,avx2,vpclmulqdq"))) static void
take_part(part_t *part)
{
    const unsigned char *p = part->view.buf;
    size_t length = (size_t)part->view.len, whole = length / 4 * 4;
    part->own = whole ? checksum_kernel((const float *)p, whole / 4, 0, &part->low,
                                        &part->high, &part->sum_squares)
                      : 0;
    if (whole < length)
        part->own = ~crc_raw(~part->own, p + whole, length - whole);
}

static PyObject *
crc32c_parts(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "crc32c_parts takes (parts, stats), not %zd arguments",
                     nargs);
        return NULL;
    }
    /* tuples of their own: a flag's __bool__ may change the caller's lists, not these */
    PyObject *parts = PySequence_Tuple(args[0]);
    if (parts == NULL)
        return NULL;
    PyObject *stats = PySequence_Tuple(args[1]);
    if (stats == NULL) {
        Py_DECREF(parts);
        return NULL;
    }
    PyObject *result = NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(parts), held = 0;
    part_t *taken = PyMem_Calloc(count ? (size_t)count : 1, sizeof(part_t));
    if (taken == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (PyTuple_GET_SIZE(stats) != count) {
        PyErr_Format(PyExc_ValueError, "crc32c_parts: %zd parts but %zd stats flags", count,
                     PyTuple_GET_SIZE(stats));
        goto done;
    }
    for (; held < count; held++) {
        part_t *part = &taken[held];
        int wanted = PyObject_IsTrue(PyTuple_GET_ITEM(stats, held));
        if (wanted < 0)
            goto done;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(parts, held), &part->view, PyBUF_C_CONTIGUOUS) <
            0)
            goto done;
        part->stats = wanted;
        if (wanted && (part->view.len == 0 || part->view.len % 4)) {
            PyErr_Format(PyExc_ValueError,
                         "crc32c_parts: part %zd of %zd bytes holds no whole float32 values",
                         held, part->view.len);
            PyBuffer_Release(&part->view);
            goto done;
        }
    }
    Py_BEGIN_ALLOW_THREADS
    uint32_t running = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        take_part(&taken[i]);
        running = crc32c_combine(running, taken[i].own, (uint64_t)taken[i].view.len);
        taken[i].running = running;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(count);
    for (Py_ssize_t i = 0; result != NULL && i < count; i++) {
        part_t *part = &taken[i];
        PyObject *item =
            part->stats
                ? Py_BuildValue("(kkddd)", (unsigned long)part->running,
                                (unsigned long)part->own, (double)part->low,
                                (double)part->high, part->sum_squares)
                : Py_BuildValue("(kk)", (unsigned long)part->running, (unsigned long)part->own);
        if (item == NULL)
            Py_CLEAR(result);
        else
            PyList_SET_ITEM(result, i, item);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&taken[i].view);
    PyMem_Free(taken);
    Py_DECREF(parts);
    Py_DECREF(stats);
    return result;
}
#endif

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

#ifdef HAVE_FOLDING
/* added to the module only where the CPU has SSE4.2, PCLMULQDQ, AVX2 and VPCLMULQDQ */
static PyMethodDef checksum_methods[] = {
    {"crc32c_min_max_sum_squares", (PyCFunction)(void (*)(void))crc32c_min_max_sum_squares,
     METH_FASTCALL,
     "crc32c_min_max_sum_squares(values, crc, /) -> (crc32c, min, max, sum of squares)\n\n"
     "The crc32c of a C-contiguous buffer of float32 values' bytes continued from crc (0\n"
     "for none before), and min_max_sum_squares of the values, in one pass, without the\n"
     "GIL, by the kernel CHECKSUM_KERNEL names. Present only where the CPU has SSE4.2,\n"
     "PCLMULQDQ, AVX2 and VPCLMULQDQ."},
    {"crc32c_min_max_sum_squares_256",
     (PyCFunction)(void (*)(void))crc32c_min_max_sum_squares_256, METH_FASTCALL,
     "crc32c_min_max_sum_squares_256(values, crc, /) -> (crc32c, min, max, sum of squares)\n\n"
     "The same by the 256-bit kernel, which every CPU that has the function runs (tests\n"
     "check it where the CPU gets the 512-bit one)."},
    {"crc32c_parts", (PyCFunction)(void (*)(void))crc32c_parts, METH_FASTCALL,
     "crc32c_parts(parts, stats, /) -> [(running crc32c, own crc32c[, min, max, sum of\n"
     "squares]), ...]\n\n"
     "One pass over C-contiguous buffers laid end to end, without the GIL: for each, the\n"
     "crc32c of every part up to and including it and its own crc32c, and where its flag\n"
     "in stats is true (float32 values: at least one, a multiple of 4 bytes, else\n"
     "ValueError) min_max_sum_squares of its values, taken in the same pass. Present\n"
     "where crc32c_min_max_sum_squares is."},
    {NULL, NULL, 0, NULL},
};
#endif

static struct PyModuleDef module_definition = {
    PyModuleDef_HEAD_INIT, "_fused_stats",
    "Min, max and sum of squares of float32 values in one pass, with their crc32c where the\n"
    "CPU can (see _stats.py).", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__fused_stats(void)
{
    int checksums = 0;
#ifdef HAVE_X86_KERNELS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2")) {
        kernel = stats_256;
        kernel_name = "256-bit vectors (AVX2)";
#ifdef HAVE_FOLDING
        checksums = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("pclmul") &&
                    __builtin_cpu_supports("vpclmulqdq");
        if (checksums && __builtin_cpu_supports("avx512f")) {
            checksum_kernel = crc_stats_512;
            checksum_kernel_name = "512-bit carry-less multiplies (AVX-512)";
        }
#endif
    }
#endif
    PyObject *module = PyModule_Create(&module_definition);
    if (module == NULL)
        return NULL;
    if (PyModule_AddStringConstant(module, "KERNEL", kernel_name) < 0)
        goto fail;
#ifdef HAVE_FOLDING
    if (checksums) {
        init_powers();
        if (PyModule_AddFunctions(module, checksum_methods) < 0 ||
            PyModule_AddStringConstant(module, "CHECKSUM_KERNEL", checksum_kernel_name) < 0)
            goto fail;
    }
#endif
    (void)checksums;
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}
