/* What the kernels' files share: the vectorising exp, log, pow, sigmoid and tanh, and the
   thread threshold. gru.c and attention.c include it; library.py compiles both into one
   library. */
#ifndef SEQ2SEQ_VECTOR_MATH_H
#define SEQ2SEQ_VECTOR_MATH_H

#include <stdint.h>
#include <string.h>

/* Rows are split over torch's OpenMP threads when library.py builds with -fopenmp (only where
   torch itself runs on libgomp, so both share one thread pool); below this many elements a
   step is too short to repay waking the other threads. Without -fopenmp the pragma is ignored
   and every step runs on the calling thread. */
#define PARALLEL_MIN 4096

/* exp and tanh written to vectorise: every step is a few multiply-adds the compiler turns into
   AVX2/FMA or NEON code, with no library call and no -ffast-math (which would also switch the
   whole process's floating-point mode to flush-to-zero when the library loads). */

/* e^x, Cephes' expf: x = k ln2 + r with |r| <= ln2 / 2, e^r as 1 + r + r^2 p(r) with p of
   degree 5, times 2^k.
   Relative error about 2e-7 on the clamped range, which keeps the result finite and normal. */
static inline float exp_vec(float x) {
  x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
  /* Round x / ln2 to the nearest integer: adding and subtracting 1.5 * 2^23 does it in
     floating point (the compiler may not reassociate without -ffast-math). */
  const float k = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f; /* ln2 in two parts */
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const int32_t bits = ((int32_t)k + 127) << 23; /* 2^k as a float's bit pattern */
  float scale;
  memcpy(&scale, &bits, sizeof scale);
  return p * scale;
}

/* ln x for a normal x > 0, Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)), ln(m) as
   f - f^2 / 2 + f^3 p(f) with f = m - 1 and p of degree 8, plus e ln2 (in two parts). The
   mantissa and exponent come from the bits, so that it vectorises like exp_vec. Absolute error
   about 1e-7 for m near 1, relative 2e-7 elsewhere. */
static inline float log_vec(float x) {
  int32_t bits;
  memcpy(&bits, &x, sizeof bits);
  float e = (float)(((bits >> 23) & 0xff) - 126); /* x = m 2^e with m in [1/2, 1) */
  bits = (bits & 0x007fffff) | 0x3f000000;
  float m;
  memcpy(&m, &bits, sizeof m);
  const int below = m < 0.707106781186547524f; /* then m 2 in [1, sqrt 2), one power less */
  e = below ? e - 1.0f : e;
  const float f = (below ? m + m : m) - 1.0f, f2 = f * f;
  float p = 7.0376836292e-2f;
  p = p * f - 1.1514610310e-1f;
  p = p * f + 1.1676998740e-1f;
  p = p * f - 1.2420140846e-1f;
  p = p * f + 1.4249322787e-1f;
  p = p * f - 1.6668057665e-1f;
  p = p * f + 2.0000714765e-1f;
  p = p * f - 2.4999993993e-1f;
  p = p * f + 3.3333331174e-1f;
  const float tail = p * f * f2 + e * -2.12194440e-4f - 0.5f * f2;
  return (f + tail) + e * 0.693359375f;
}

/* x^y for x > 0 (entmax's [x - tau]_+^(1 / (alpha - 1)) and p^(2 - alpha)) as e^(y ln x),
   0 where that is below float's normal range (e^-87), as powf's result rounds towards there.
   Relative error about (1 + |y ln x|) 2e-7: a few times powf's, far below the tolerances the
   kernels are held to, and it vectorises where powf is one libm call per element. */
static inline float pow_vec(float x, float y) {
  x = x < 1.17549435e-38f ? 1.17549435e-38f : x; /* float's smallest normal */
  const float power = y * log_vec(x);
  return power < -87.0f ? 0.0f : exp_vec(power);
}

static inline float sigmoid_vec(float x) { return 1.0f / (1.0f + exp_vec(-x)); }

/* tanh x = 2 sigmoid(2x) - 1: one exp and one division, like the sigmoid. Its absolute error is
   about 1e-7 everywhere (near 0 that is a larger relative error than a libm tanhf's, and still
   below float32's resolution of the values it is added to: h' = n + z (h - n)). */
static inline float tanh_vec(float x) { return 2.0f / (1.0f + exp_vec(-2.0f * x)) - 1.0f; }

/* tanh x as Eigen's generic_fast_tanh_float computes it: a [13/6] rational function of x
   (odd over even polynomial, the constants Eigen's), x clamped to +-7.905 where tanh rounds to
   +-1 in float32. One division and a dozen multiply-adds, no exp: cheaper than tanh_vec, with an
   absolute and relative error below 3e-7 everywhere (tests/test_kernels_attention_parts.py).
   The additive score calls it for every (query, key, feature): its hottest loop. */
static inline float tanh_rational(float x) {
  x = x < -7.90531110763549805f ? -7.90531110763549805f
                                : (x > 7.90531110763549805f ? 7.90531110763549805f : x);
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f;
  p = p * x2 - 8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;
  return x * p / q;
}

/* The number of valid keys of a row whose sentence has `len` of S. */
static inline int64_t valid_keys(int64_t len, int64_t S) { return len < 0 ? 0 : (len > S ? S : len); }

#endif
