/* The parts of one attention, each the twin of the Python function or method named beside it
   (the C name is the Python one where the Python is a function, e.g. sparsemax; else the part's):

     scores      seq2seq_additive_score    AdditiveAttention.score       (seq2seq/attention.py)
                 seq2seq_additive_layer_norm_score  the same with its layer_norm option
                 seq2seq_product_score     DotProductAttention.score, GeneralAttention.score
     temperature seq2seq_temperature_backward  Attention.logits' score / T, a learned T's gradient
     coverage    seq2seq_additive_coverage AdditiveAttention.preactivations' w_c c term
                 seq2seq_coverage          Attention.covered_logits (gamma c)
     positions   seq2seq_key_bias          KeyBias.forward               (seq2seq/positions.py)
                 seq2seq_local_window      LocalWindow.forward's in_window (local-m's centres)
                 seq2seq_global_window     the padding mask of every other attention
                 seq2seq_local_p_gaussian  LocalWindow.forward's local-p factor (eq. 10)
                 seq2seq_local_p_centres   LocalWindow.centres' p_t = (S_b - 1) sigmoid(v_p .
                                           tanh(W_p h_t)) (eq. 9), after the caller's GEMM
     normalizers seq2seq_softmax           softmax                       (seq2seq/normalizers.py)
                 seq2seq_sparsemax         sparsemax
                 seq2seq_entmax15          entmax15
                 seq2seq_entmax_bisect     entmax_bisect (any alpha, fixed or learned)
                 seq2seq_entmax_alpha_backward  the learned alpha's gradient
                 seq2seq_entmax_backward   entmax_backward with jacobian_weights (every α)
     context     seq2seq_attention_context Attention.forward's weights @ values

   and the scores, the context, coverage, the key bias and local-p's factor each have a
   _backward (the normalizers share seq2seq_entmax_backward; a window is a mask). StepAttention
   (seq2seq/kernels/attention_parts.py) composes them, for the decoders' step loops
   (seq2seq/kernels/loop_attention.py) and for any rows at once: score -> logits, the key bias,
   a normalizer -> weights, the context; the backward pass runs them in reverse. So a new part
   is one function here and one line there, not a new loop per combination.

   Layouts. A call covers `rows` queries; `group` consecutive rows share a sentence (beam search's
   hypotheses, a Luong decoder's T target steps; 1 in a step loop), row r reading sentence
   r / group: its keys (S, D) or (S, A) and its values (S, V). Row r may read the keys s in
   [spans[2r], spans[2r + 1]): its sentence's real keys [0, length) (seq2seq_global_window), or
   those of them in a local window (seq2seq_local_window); every other key is padding to it.
   logits and d_logits are (rows, S) scratch, meaningful within the span only; weights are
   (rows, S) at a row stride given in floats, exactly 0 outside the span and everywhere in a row
   with an empty span (the masking contract of masked_softmax), which then also gets a zero
   context and gradient.
   The backward passes run in training, and add into the gradients of keys and values: each
   thread takes whole sentences (all `group` rows of each), so threads never add into one
   place. */
#include <stddef.h>
#include <stdint.h>

#include "vector_math.h"

/* Each part's rows are split over the threads where the part is long enough (PARALLEL_MIN).
   gru.c includes this file (which library.py also compiles on its own) with
   SEQ2SEQ_SERIAL_PARTS defined, for its greedy loop, which calls the parts one row at a time
   inside a parallel region of its own: there every part is static and its loop serial,
   because an `omp parallel` whose `if` is false still opens a team of one thread (the team's
   allocation and a barrier, per call). They are also kept out of line (GCC's noipa, no
   inter-procedural optimisation; clang has only noinline): GCC's copies of them inlined into
   or specialised for the greedy loop lost the `omp simd` reductions' vectorisation. */
#define SEQ2SEQ_PRAGMA(text) _Pragma(#text)
#if defined(SEQ2SEQ_SERIAL_PARTS) && defined(__clang__)
#define PART static __attribute__((unused, noinline))
#define PARALLEL_FOR(split)
#elif defined(SEQ2SEQ_SERIAL_PARTS)
#define PART static __attribute__((unused, noipa))
#define PARALLEL_FOR(split)
#else
#define PART
#define PARALLEL_FOR(split) SEQ2SEQ_PRAGMA(omp parallel for schedule(static) if (split))
#endif

/* ---- Scores ------------------------------------------------------------------------------ */

/* t = tanh(q_r + k_s) over A features into t, and w_v . t: computed first, then summed (one
   loop doing both runs at about half the speed: the reduction waits on every division). */
static inline float additive_key_score(int64_t A, const float *restrict q_r,
                                       const float *restrict k_s, const float *restrict w_v,
                                       float *restrict t) {
#pragma omp simd
  for (int64_t j = 0; j < A; ++j) t[j] = tanh_rational(q_r[j] + k_s[j]);
  float score = 0.0f;
#pragma omp simd reduction(+ : score)
  for (int64_t j = 0; j < A; ++j) score += w_v[j] * t[j];
  return score;
}

/* AdditiveAttention.score: e_s = scale * w_v . tanh(q + k_s), q = W_q s (+ b) and k_s = W_k h_s
   projected by the caller, scale = 1 / T. saved (rows, S, A) receives tanh(q + k_s) for the
   backward pass, or is NULL (the backward pass then recomputes it). */
PART
void seq2seq_additive_score(int64_t rows, int64_t group, int64_t S, int64_t A, float scale,
                            const float *restrict q, const float *restrict keys,
                            const float *restrict w_v, const int64_t *restrict spans,
                            float *restrict saved, float *restrict logits) {
PARALLEL_FOR(rows * S * A >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / group, first = spans[2 * r], end = spans[2 * r + 1];
    float t_scratch[A];
    for (int64_t s = first; s < end; ++s) {
      float *restrict t = saved != NULL ? saved + (r * S + s) * A : t_scratch;
      logits[r * S + s] = scale * additive_key_score(A, q + r * A, keys + (b * S + s) * A, w_v, t);
    }
  }
}

/* With e_s = scale w_v . t, t = tanh(x): de_s/dx = scale w_v (1 - t^2), de_s/dw_v = scale t.
   Reads t from saved (rows, S, A), or where saved is NULL recomputes it from q (rows, A) and
   keys as the forward pass did (the same function of the same floats: the same t), one tanh
   per element instead of writing and reading rows * S * A floats.
   Writes d_q (rows, A); adds into d_keys (sentences, S, A), row r's into sentence r / group's,
   and d_w_v (rows, A), each row's part of w_v's gradient (the caller sums the rows once, after
   all steps). */
static inline void additive_key_backward(int64_t A, float d_score, const float *restrict t,
                                         const float *restrict w_v, float *restrict dq_r,
                                         float *restrict dk_s, float *restrict dwv_r) {
#pragma omp simd
  for (int64_t j = 0; j < A; ++j) {
    const float dx = d_score * w_v[j] * (1.0f - t[j] * t[j]);
    dq_r[j] += dx;
    dk_s[j] += dx;
    dwv_r[j] += d_score * t[j];
  }
}

PART
void seq2seq_additive_score_backward(int64_t rows, int64_t group, int64_t S, int64_t A,
                                     float scale, const float *restrict saved,
                                     const float *restrict q, const float *restrict keys,
                                     const float *restrict w_v, const int64_t *restrict spans,
                                     const float *restrict d_logits, float *restrict d_q,
                                     float *restrict d_keys, float *restrict d_w_v) {
  /* Over sentences: a sentence's rows add into its keys' gradient, from one thread. */
PARALLEL_FOR(rows * S * A >= 4 * PARALLEL_MIN)
  for (int64_t b = 0; b < rows / group; ++b) {
    float t_scratch[A];
    for (int64_t r = b * group; r < (b + 1) * group; ++r) {
      const int64_t first = spans[2 * r], end = spans[2 * r + 1];
      float *restrict dq_r = d_q + r * A;
      float *restrict dwv_r = d_w_v + r * A;
      for (int64_t j = 0; j < A; ++j) dq_r[j] = 0.0f;
      for (int64_t s = first; s < end; ++s) {
        const float d_score = scale * d_logits[r * S + s];
        const float *restrict k_s = keys + (b * S + s) * A;
        const float *restrict t = t_scratch;
        if (saved != NULL) {
          t = saved + (r * S + s) * A;
        } else {
#pragma omp simd
          for (int64_t j = 0; j < A; ++j) t_scratch[j] = tanh_rational(q[r * A + j] + k_s[j]);
        }
        additive_key_backward(A, d_score, t, w_v, dq_r, d_keys + (b * S + s) * A, dwv_r);
      }
    }
  }
}

/* One key's layer-normed features (AdditiveAttention.preactivations' layer norm): x = q_r + k_s,
   normed = (x - mean(x)) / sqrt(var(x) + eps) over the A features (nn.LayerNorm's biased
   variance), u = tanh(gamma normed + beta); returns 1 / sqrt(var + eps). */
static inline float layer_normed_key(int64_t A, float eps, const float *restrict q_r,
                                     const float *restrict k_s, const float *restrict gamma,
                                     const float *restrict beta, float *restrict normed,
                                     float *restrict u) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t j = 0; j < A; ++j) {
    normed[j] = q_r[j] + k_s[j];
    total += normed[j];
  }
  const float mean = total / (float)A;
  float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
  for (int64_t j = 0; j < A; ++j) {
    normed[j] -= mean;
    squares += normed[j] * normed[j];
  }
  const float rstd = 1.0f / __builtin_sqrtf(squares / (float)A + eps);
#pragma omp simd
  for (int64_t j = 0; j < A; ++j) {
    normed[j] *= rstd;
    u[j] = tanh_rational(gamma[j] * normed[j] + beta[j]);
  }
  return rstd;
}

/* AdditiveAttention.score with layer_norm: e_s = scale * w_v . tanh(y), y the layer-normed
   features of q + k_s (layer_normed_key). params (3 x A) holds w_v, gamma and beta. saved_u
   and saved_normed (rows, S, A) receive tanh(y) and the normalized x, saved_rstd (rows, S)
   1 / sqrt(var + eps), for the backward pass, or are NULL (it then recomputes them). */
PART
void seq2seq_additive_layer_norm_score(int64_t rows, int64_t group, int64_t S, int64_t A,
                                       float scale, float eps, const float *restrict q,
                                       const float *restrict keys, const float *restrict params,
                                       const int64_t *restrict spans, float *restrict saved_u,
                                       float *restrict saved_normed, float *restrict saved_rstd,
                                       float *restrict logits) {
  const float *restrict w_v = params, *restrict gamma = params + A, *restrict beta = params + 2 * A;
PARALLEL_FOR(rows * S * A >= 2 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / group, first = spans[2 * r], end = spans[2 * r + 1];
    float n_scratch[A], u_scratch[A];
    for (int64_t s = first; s < end; ++s) {
      const int64_t key = r * S + s;
      float *restrict normed = saved_normed != NULL ? saved_normed + key * A : n_scratch;
      float *restrict u = saved_u != NULL ? saved_u + key * A : u_scratch;
      const float rstd =
          layer_normed_key(A, eps, q + r * A, keys + (b * S + s) * A, gamma, beta, normed, u);
      float score = 0.0f;
#pragma omp simd reduction(+ : score)
      for (int64_t j = 0; j < A; ++j) score += w_v[j] * u[j];
      if (saved_rstd != NULL) saved_rstd[key] = rstd;
      logits[key] = scale * score;
    }
  }
}

/* Its backward: dy = scale de w_v (1 - u^2) with u = tanh(y), d_w_v += scale de u,
   d_gamma += dy x^, d_beta += dy (each row's part, d_params rows x 3A as params), and through
   the layer norm dx = rstd (g - mean(g) - x^ mean(g x^)), g = dy gamma; d_q (rows, A) written,
   d_keys (sentences, S, A) added into row r's sentence, r / group. Reads u, x^ and rstd from
   what the forward pass saved, or where saved_u is NULL recomputes them from q (rows, A) and
   keys (layer_normed_key, the same floats: the same values). */
PART
void seq2seq_additive_layer_norm_score_backward(
    int64_t rows, int64_t group, int64_t S, int64_t A, float scale, float eps,
    const float *restrict saved_u, const float *restrict saved_normed,
    const float *restrict saved_rstd, const float *restrict q, const float *restrict keys,
    const float *restrict params, const int64_t *restrict spans, const float *restrict d_logits,
    float *restrict d_q, float *restrict d_keys, float *restrict d_params) {
  const float *restrict w_v = params, *restrict gamma = params + A, *restrict beta = params + 2 * A;
PARALLEL_FOR(rows * S * A >= 2 * PARALLEL_MIN)
  for (int64_t b = 0; b < rows / group; ++b) {
    float g[A], n_scratch[A], u_scratch[A];
    for (int64_t r = b * group; r < (b + 1) * group; ++r) {
      const int64_t first = spans[2 * r], end = spans[2 * r + 1];
      float *restrict dq_r = d_q + r * A;
      float *restrict d_w_v = d_params + r * 3 * A, *restrict d_gamma = d_w_v + A;
      float *restrict d_beta = d_w_v + 2 * A;
      for (int64_t j = 0; j < A; ++j) dq_r[j] = 0.0f;
      for (int64_t s = first; s < end; ++s) {
        const int64_t key = r * S + s;
        const float d_score = scale * d_logits[key];
        const float *restrict u = u_scratch, *restrict normed = n_scratch;
        float rstd;
        if (saved_u != NULL) {
          u = saved_u + key * A;
          normed = saved_normed + key * A;
          rstd = saved_rstd[key];
        } else {
          rstd = layer_normed_key(A, eps, q + r * A, keys + (b * S + s) * A, gamma, beta,
                                  n_scratch, u_scratch);
        }
        float mean_g = 0.0f, mean_gx = 0.0f;
#pragma omp simd reduction(+ : mean_g, mean_gx)
        for (int64_t j = 0; j < A; ++j) {
          const float dy = d_score * w_v[j] * (1.0f - u[j] * u[j]);
          d_w_v[j] += d_score * u[j];
          d_gamma[j] += dy * normed[j];
          d_beta[j] += dy;
          g[j] = dy * gamma[j];
          mean_g += g[j];
          mean_gx += g[j] * normed[j];
        }
        mean_g /= (float)A;
        mean_gx /= (float)A;
        float *restrict dk_s = d_keys + (b * S + s) * A;
#pragma omp simd
        for (int64_t j = 0; j < A; ++j) {
          const float dx = rstd * (g[j] - mean_g - normed[j] * mean_gx);
          dq_r[j] += dx;
          dk_s[j] += dx;
        }
      }
    }
  }
}

/* DotProductAttention.score (scale 1, or 1 / sqrt(D) scaled) and GeneralAttention.score (whose
   keys the caller projected, W h_s), each divided by the temperature:
   e_s = scale * q . k_s. */
PART
void seq2seq_product_score(int64_t rows, int64_t group, int64_t S, int64_t D, float scale,
                           const float *restrict q, const float *restrict keys,
                           const int64_t *restrict spans, float *restrict logits) {
PARALLEL_FOR(rows * S * D >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / group, first = spans[2 * r], end = spans[2 * r + 1];
    const float *restrict q_r = q + r * D;
    for (int64_t s = first; s < end; ++s) {
      const float *restrict k_s = keys + (b * S + s) * D;
      float score = 0.0f;
#pragma omp simd reduction(+ : score)
      for (int64_t j = 0; j < D; ++j) score += q_r[j] * k_s[j];
      logits[r * S + s] = scale * score;
    }
  }
}

/* dq = scale sum_s de_s k_s (written), dk_s += scale de_s q (added into row r's sentence,
   r / group). */
PART
void seq2seq_product_score_backward(int64_t rows, int64_t group, int64_t S, int64_t D,
                                    float scale, const float *restrict q,
                                    const float *restrict keys, const int64_t *restrict spans,
                                    const float *restrict d_logits, float *restrict d_q,
                                    float *restrict d_keys) {
PARALLEL_FOR(rows * S * D >= 4 * PARALLEL_MIN)
  for (int64_t b = 0; b < rows / group; ++b) {
    for (int64_t r = b * group; r < (b + 1) * group; ++r) {
      const int64_t first = spans[2 * r], end = spans[2 * r + 1];
      const float *restrict q_r = q + r * D;
      float *restrict dq_r = d_q + r * D;
      for (int64_t j = 0; j < D; ++j) dq_r[j] = 0.0f;
      for (int64_t s = first; s < end; ++s) {
        const float a = scale * d_logits[r * S + s];
        const float *restrict k_s = keys + (b * S + s) * D;
        float *restrict dk_s = d_keys + (b * S + s) * D;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) {
          dq_r[j] += a * k_s[j];
          dk_s[j] += a * q_r[j];
        }
      }
    }
  }
}

/* Attention.logits, e_s = score_s / T, where T is learned: its gradient is dL/dT = -(1 / T)
   sum_s de_s e_s. Adds row r's sum_s de_s e_s into d_temperature[r] (the caller sums the rows
   and divides by -T once, after all steps). logits are e as the score wrote them, before
   coverage and the key bias were added. */
PART
void seq2seq_temperature_backward(int64_t rows, int64_t S, const int64_t *restrict spans,
                                  const float *restrict logits, const float *restrict d_logits,
                                  float *restrict d_temperature) {
  for (int64_t r = 0; r < rows; ++r) {
    float along = 0.0f;
    for (int64_t s = spans[2 * r]; s < spans[2 * r + 1]; ++s) {
      along += d_logits[r * S + s] * logits[r * S + s];
    }
    d_temperature[r] += along;
  }
}

/* Zeros at the keys a row may not read: [0, first) and [end, S). */
static inline void outside(int64_t first, int64_t end, int64_t S, float *restrict row) {
  for (int64_t s = 0; s < first; ++s) row[s] = 0.0f;
  for (int64_t s = end; s < S; ++s) row[s] = 0.0f;
}

/* ---- Coverage (Tu et al., 2016; See et al., 2017) ----------------------------------------- */

/* AdditiveAttention.preactivations' coverage term (See et al., eq. 11): the keys row r scores
   are k_s + c_s w_c, c (rows, S) the attention its sentence paid so far, written per row into
   covered (rows, S, A), which seq2seq_additive_score then reads with group 1. */
PART
void seq2seq_additive_coverage(int64_t rows, int64_t group, int64_t S, int64_t A,
                               const int64_t *restrict spans, const float *restrict keys,
                               const float *restrict coverage, const float *restrict w_c,
                               float *restrict covered) {
PARALLEL_FOR(rows * S * A >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / group, first = spans[2 * r], end = spans[2 * r + 1];
    for (int64_t s = first; s < end; ++s) {
      const float c = coverage[r * S + s];
      const float *restrict k_s = keys + (b * S + s) * A;
      float *restrict out = covered + (r * S + s) * A;
#pragma omp simd
      for (int64_t j = 0; j < A; ++j) out[j] = k_s[j] + c * w_c[j];
    }
  }
}

/* From the covered keys' gradient d_covered (rows, S, A): d_keys += it (into row r's sentence,
   r / group), d_coverage_s = d_covered_s . w_c (written, rows x S), d_w_c += sum_s c_s
   d_covered_s (row r's part, rows x A). */
PART
void seq2seq_additive_coverage_backward(int64_t rows, int64_t group, int64_t S, int64_t A,
                                        const int64_t *restrict spans,
                                        const float *restrict coverage,
                                        const float *restrict w_c,
                                        const float *restrict d_covered, float *restrict d_keys,
                                        float *restrict d_coverage, float *restrict d_w_c) {
PARALLEL_FOR(rows * S * A >= 4 * PARALLEL_MIN)
  for (int64_t b = 0; b < rows / group; ++b) {
    for (int64_t r = b * group; r < (b + 1) * group; ++r) {
      const int64_t first = spans[2 * r], end = spans[2 * r + 1];
      float *restrict dwc_r = d_w_c + r * A;
      for (int64_t s = 0; s < S; ++s) d_coverage[r * S + s] = 0.0f;
      for (int64_t s = first; s < end; ++s) {
        const float c = coverage[r * S + s];
        const float *restrict g = d_covered + (r * S + s) * A;
        float *restrict dk_s = d_keys + (b * S + s) * A;
        float along = 0.0f;
#pragma omp simd reduction(+ : along)
        for (int64_t j = 0; j < A; ++j) {
          dk_s[j] += g[j];
          dwc_r[j] += c * g[j];
          along += g[j] * w_c[j];
        }
        d_coverage[r * S + s] = along;
      }
    }
  }
}

/* Attention.covered_logits for every other score: e_s += gamma c_s. */
PART
void seq2seq_coverage(int64_t rows, int64_t S, const int64_t *restrict spans, float gamma,
                      const float *restrict coverage, float *restrict logits) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t s = spans[2 * r]; s < spans[2 * r + 1]; ++s) {
      logits[r * S + s] += gamma * coverage[r * S + s];
    }
  }
}

/* d_coverage_s = gamma de_s (written, rows x S); d_gamma[r] += sum_s c_s de_s. */
PART
void seq2seq_coverage_backward(int64_t rows, int64_t S, const int64_t *restrict spans,
                               float gamma, const float *restrict coverage,
                               const float *restrict d_logits, float *restrict d_coverage,
                               float *restrict d_gamma) {
  for (int64_t r = 0; r < rows; ++r) {
    float along = 0.0f;
    for (int64_t s = 0; s < S; ++s) d_coverage[r * S + s] = 0.0f;
    for (int64_t s = spans[2 * r]; s < spans[2 * r + 1]; ++s) {
      d_coverage[r * S + s] = gamma * d_logits[r * S + s];
      along += coverage[r * S + s] * d_logits[r * S + s];
    }
    d_gamma[r] += along;
  }
}

/* ---- Positions (seq2seq/positions.py) ------------------------------------------------------ */

/* Global attention's span: row r reads its sentence's real keys [0, length), clamped to S. */
PART
void seq2seq_global_window(int64_t rows, int64_t group, int64_t S,
                           const int64_t *restrict lengths, int64_t *restrict spans) {
  for (int64_t r = 0; r < rows; ++r) {
    spans[2 * r] = 0;
    spans[2 * r + 1] = valid_keys(lengths[r / group], S);
  }
}

/* LocalWindow.forward's in_window: the keys s with |s - round(p_t)| <= D among the sentence's
   real ones, p_t the row's centre (centres (rows,), in [0, length - 1]). round is to the
   nearest even on a tie, as torch.round. */
PART
void seq2seq_local_window(int64_t rows, int64_t group, int64_t S, int64_t D,
                          const int64_t *restrict lengths, const float *restrict centres,
                          int64_t *restrict spans) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t length = valid_keys(lengths[r / group], S);
    const int64_t nearest = (int64_t)__builtin_rintf(centres[r]);
    const int64_t first = nearest - D, end = nearest + D + 1;
    spans[2 * r] = first < 0 ? 0 : (first > length ? length : first);
    spans[2 * r + 1] = end > length ? length : (end < 0 ? 0 : end);
  }
}

/* LocalWindow.forward's local-p factor (Luong et al., eq. 10), applied as Normalization.forward
   applies it: the normalizer's weights within the window times exp(-(s - p_t)^2 / 2 sigma^2),
   sigma = D / 2, p_t the row's real centre (centres (rows,)). The weights (at their stride) are
   multiplied in place; normalized (rows x S) receives them before, for the backward pass, or
   is NULL. */
PART
void seq2seq_local_p_gaussian(int64_t rows, int64_t S, int64_t D, const int64_t *restrict spans,
                              const float *restrict centres, float *restrict weights,
                              int64_t w_stride, float *restrict normalized) {
  const float inverse_variance = 4.0f / (float)(D * D); /* 1 / sigma^2 */
  for (int64_t r = 0; r < rows; ++r) {
    float *restrict p = weights + r * w_stride;
    for (int64_t s = spans[2 * r]; s < spans[2 * r + 1]; ++s) {
      const float distance = (float)s - centres[r];
      if (normalized != NULL) normalized[r * S + s] = p[s];
      p[s] *= exp_vec(-0.5f * distance * distance * inverse_variance);
    }
  }
}

/* LocalWindow.centres for local-p (Luong et al., eq. 9): p_r = (S_b - 1) sigmoid(v_p . u_r)
   with u_r = tanh(W_p h_r), row r's sentence b being sentence_of[r] (r where NULL). features
   (rows, H) holds W_p h_r on entry (the caller's GEMM) and u_r on exit; gates (rows,) receives
   sigmoid(v_p . u_r) for the backward pass, or is NULL. */
PART
void seq2seq_local_p_centres(int64_t rows, int64_t H, const float *restrict v_p,
                             const int64_t *restrict lengths, const int64_t *restrict sentence_of,
                             float *restrict features, float *restrict gates,
                             float *restrict centres) {
  for (int64_t r = 0; r < rows; ++r) {
    float *restrict u = features + r * H;
    float predicted = 0.0f;
#pragma omp simd reduction(+ : predicted)
    for (int64_t j = 0; j < H; ++j) {
      u[j] = tanh_vec(u[j]);
      predicted += v_p[j] * u[j];
    }
    const int64_t last = lengths[sentence_of == NULL ? r : sentence_of[r]] - 1;
    const float gate = sigmoid_vec(predicted);
    if (gates != NULL) gates[r] = gate;
    centres[r] = (float)(last > 0 ? last : 0) * gate;
  }
}

/* seq2seq_local_p_centres' backward, from d_centres (rows x heads: every head of a row reads
   its centre, and their gradients add): dz_r = dp_r (S_b - 1) g_r (1 - g_r) into d_predicted
   (rows,), v_p's gradient's factor, and d_projected (rows, H) = dz_r v_p (1 - u_r^2), the
   gradient of W_p h_r. */
PART
void seq2seq_local_p_centres_backward(int64_t rows, int64_t heads, int64_t H,
                                      const float *restrict v_p, const int64_t *restrict lengths,
                                      const float *restrict features, const float *restrict gates,
                                      const float *restrict d_centres,
                                      float *restrict d_predicted, float *restrict d_projected) {
  for (int64_t r = 0; r < rows; ++r) {
    float d_centre = 0.0f;
    for (int64_t i = 0; i < heads; ++i) d_centre += d_centres[r * heads + i];
    const int64_t last = lengths[r] - 1;
    const float g = gates[r];
    const float dz = d_centre * (float)(last > 0 ? last : 0) * g * (1.0f - g);
    d_predicted[r] = dz;
    const float *restrict u = features + r * H;
    float *restrict d = d_projected + r * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) d[j] = dz * v_p[j] * (1.0f - u[j] * u[j]);
  }
}

/* From the gradient of the multiplied weights (d_weights, rows x S, overwritten with the
   normalizer's weights' gradient, d_p_s * g_s): d_centres[r] += sum_s d_s p_s g_s (s - p_t) /
   sigma^2, the Gaussian's pull on the centre (the window's edges have no gradient). */
PART
void seq2seq_local_p_gaussian_backward(int64_t rows, int64_t S, int64_t D,
                                       const int64_t *restrict spans,
                                       const float *restrict centres,
                                       const float *restrict normalized,
                                       float *restrict d_weights, float *restrict d_centres) {
  const float inverse_variance = 4.0f / (float)(D * D);
  for (int64_t r = 0; r < rows; ++r) {
    float along = 0.0f;
    for (int64_t s = spans[2 * r]; s < spans[2 * r + 1]; ++s) {
      const float distance = (float)s - centres[r];
      const float g = exp_vec(-0.5f * distance * distance * inverse_variance);
      along += d_weights[r * S + s] * normalized[r * S + s] * g * distance * inverse_variance;
      d_weights[r * S + s] *= g;
    }
    d_centres[r] += along;
  }
}

/* KeyBias.forward: e_s += b_s for the source positions s < P the table holds (later positions,
   never seen in training, get 0). */
PART
void seq2seq_key_bias(int64_t rows, int64_t S, int64_t P, const float *restrict bias,
                      const int64_t *restrict spans, float *restrict logits) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1] < P ? spans[2 * r + 1] : P;
    for (int64_t s = first; s < end; ++s) logits[r * S + s] += bias[s];
  }
}

/* db_s += sum_r de_{r,s}. One thread: every row adds into the same table. */
PART
void seq2seq_key_bias_backward(int64_t rows, int64_t S, int64_t P, const int64_t *restrict spans,
                               const float *restrict d_logits, float *restrict d_bias) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1] < P ? spans[2 * r + 1] : P;
    for (int64_t s = first; s < end; ++s) d_bias[s] += d_logits[r * S + s];
  }
}

/* ---- Normalizers ------------------------------------------------------------------------- */

/* softmax: p_s = exp(z_s - max) / sum over the valid keys. */
PART
void seq2seq_softmax(int64_t rows, int64_t S, const int64_t *restrict spans,
                     const float *restrict logits, float *restrict weights, int64_t w_stride) {
PARALLEL_FOR(rows * S * 16 >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1];
    const float *restrict z = logits + r * S;
    float *restrict p = weights + r * w_stride;
    float largest = end > first ? z[first] : 0.0f, total = 0.0f;
    for (int64_t s = first + 1; s < end; ++s) largest = z[s] > largest ? z[s] : largest;
    for (int64_t s = first; s < end; ++s) {
      p[s] = exp_vec(z[s] - largest);
      total += p[s];
    }
    for (int64_t s = first; s < end; ++s) p[s] /= total;
    outside(first, end, S, p);
  }
}

/* A row's valid logits, shifted so that the largest is 0 (the thresholds are shift-invariant;
   this keeps squares small), into x, and sorted descending into sorted (sorted_valid_logits).
   Insertion sort: rows are a sentence's keys, tens of them, where it beats a library sort's
   calls through a comparison function. */
static void sorted_valid_logits(int64_t len, const float *restrict z, float *restrict x,
                                float *restrict sorted) {
  float largest = z[0];
  for (int64_t s = 1; s < len; ++s) largest = z[s] > largest ? z[s] : largest;
  for (int64_t s = 0; s < len; ++s) {
    const float value = z[s] - largest;
    int64_t i = s;
    for (; i > 0 && sorted[i - 1] < value; --i) sorted[i] = sorted[i - 1];
    sorted[i] = value;
    x[s] = value;
  }
}

/* sparsemax's threshold (Martins and Astudillo, 2016, Algorithm 1): with z sorted descending,
   the support is the k largest for the largest k with 1 + k z_(k) > sum_{j<=k} z_(j), and
   tau = (sum_{j<=k} z_(j) - 1) / k; then p_s = [z_s - tau]_+. */
static float sparsemax_threshold(int64_t len, const float *restrict sorted) {
  float cumulative = 0.0f, tau = 0.0f;
  for (int64_t k = 1; k <= len; ++k) {
    cumulative += sorted[k - 1];
    if (1.0f + k * sorted[k - 1] > cumulative) tau = (cumulative - 1.0f) / k;
  }
  return tau;
}

/* entmax15's threshold (Peters, Niculae and Martins, 2019, Algorithm 2) on x = z / 2 sorted
   descending: tau_k = mean_k - sqrt((1 - k (meansq_k - mean_k^2)) / k) would make the k largest
   sum to 1, and the support is the largest k with tau_k <= x_(k); then p_s = [z_s / 2 - tau]_+^2. */
static float entmax15_threshold(int64_t len, const float *restrict sorted) {
  float sum = 0.0f, sum_squares = 0.0f, tau = 0.0f;
  for (int64_t k = 1; k <= len; ++k) {
    const float value = 0.5f * sorted[k - 1];
    sum += value;
    sum_squares += value * value;
    const float mean = sum / k, mean_square = sum_squares / k;
    const float gap = (1.0f - k * (mean_square - mean * mean)) / k;
    const float tau_k = mean - (gap > 0.0f ? __builtin_sqrtf(gap) : 0.0f);
    if (k == 1 || tau_k <= value) tau = tau_k;
  }
  return tau;
}

/* The sparse normalizers' rows: sort each row's valid logits, find the threshold, map each
   logit above it (alpha 2: z - tau; alpha 1.5: (z / 2 - tau)^2), zeros elsewhere. */
static void thresholded(int64_t rows, int64_t S, const int64_t *restrict spans,
                        const float *restrict logits, float *restrict weights, int64_t w_stride,
                        int entmax15) {
PARALLEL_FOR(rows * S * 16 >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1];
    float *restrict p = weights + r * w_stride;
    const int64_t len = end - first;
    if (len > 0) {
      float x[len], sorted[len];
      sorted_valid_logits(len, logits + r * S + first, x, sorted);
      if (entmax15) {
        const float tau = entmax15_threshold(len, sorted);
        for (int64_t s = 0; s < len; ++s) {
          const float above = 0.5f * x[s] - tau;
          p[first + s] = above > 0.0f ? above * above : 0.0f;
        }
      } else {
        const float tau = sparsemax_threshold(len, sorted);
        for (int64_t s = 0; s < len; ++s) p[first + s] = x[s] > tau ? x[s] - tau : 0.0f;
      }
    }
    outside(first, end, S, p);
  }
}

/* sparsemax: p = [z - tau]_+, the Euclidean projection of the logits onto the simplex. */
PART
void seq2seq_sparsemax(int64_t rows, int64_t S, const int64_t *restrict spans,
                       const float *restrict logits, float *restrict weights, int64_t w_stride) {
  thresholded(rows, S, spans, logits, weights, w_stride, 0);
}

/* entmax15: p = [z / 2 - tau]_+^2, alpha-entmax at alpha 1.5. */
PART
void seq2seq_entmax15(int64_t rows, int64_t S, const int64_t *restrict spans,
                      const float *restrict logits, float *restrict weights, int64_t w_stride) {
  thresholded(rows, S, spans, logits, weights, w_stride, 1);
}

/* entmax_bisect (_bisect_weights) for any alpha > 1: with x = (alpha - 1)(z - max z), the tau
   where f(tau) = sum_s [x_s - tau]_+^(1 / (alpha - 1)) = 1, and p_s = [x_s - tau]_+^(1 /
   (alpha - 1)) divided by their sum, so that rows sum to 1 exactly. f falls as tau rises, from
   >= 1 at tau = -1 to <= 1 at tau = -n^(1 - alpha) (n keys in the span). For alpha > 2 tau is
   found as the reference finds it: `iterations` halvings of that interval, keeping the last tau
   whose sum is >= 1. For alpha <= 2 the exponent is >= 1 and f is convex, so that Newton's
   method from tau = -1, tau += (f - 1) / (-f'), f' = -(1 / (alpha - 1)) sum_s [x_s - tau]_+^(1 /
   (alpha - 1) - 1), rises to the same tau from below without passing it (each tangent meets 1
   before f does), in a handful of steps where the halvings take about 24 to reach float's
   resolution; it stops where a step no longer raises tau. The powers are pow_vec's, so that
   each step's sums are one vectorised loop rather than a libm call per key. */
PART
void seq2seq_entmax_bisect(int64_t rows, int64_t S, const int64_t *restrict spans, float alpha,
                           int64_t iterations, const float *restrict logits,
                           float *restrict weights, int64_t w_stride) {
PARALLEL_FOR(rows * S * iterations >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1], len = end - first;
    const float *restrict z = logits + r * S;
    float *restrict p = weights + r * w_stride;
    if (len > 0) {
      const float exponent = 1.0f / (alpha - 1.0f);
      /* x padded to whole vectors of 8 with keys that are never above a tau (-1 <= tau), so
         that the loops over the keys have no scalar remainder. */
      const int64_t padded = (len + 7) / 8 * 8;
      float x[padded], largest = z[first];
      for (int64_t s = len; s < padded; ++s) x[s] = -2.0f;
      for (int64_t s = first + 1; s < end; ++s) largest = z[s] > largest ? z[s] : largest;
      for (int64_t s = 0; s < len; ++s) x[s] = (z[first + s] - largest) * (alpha - 1.0f);
      float low = -1.0f; /* a tau where the sum is >= 1 */
      if (alpha <= 2.0f) {
        for (int64_t i = 0; i < iterations; ++i) { /* Newton's, from below */
          float total = 0.0f, slope = 0.0f; /* f(low) and -f'(low) (alpha - 1) */
#pragma omp simd reduction(+ : total, slope)
          for (int64_t s = 0; s < padded; ++s) {
            const float above = x[s] - low;
            const float power = above > 0.0f ? pow_vec(above, exponent) : 0.0f;
            total += power;
            slope += above > 0.0f ? power / above : 0.0f;
          }
          const float next = low + (total - 1.0f) / (exponent * slope);
          if (!(next > low)) break; /* at the root, to float's resolution */
          low = next;
        }
      } else {
        float width = 1.0f - __builtin_powf((float)len, 1.0f - alpha); /* to a sum <= 1 */
        for (int64_t i = 0; i < iterations; ++i) { /* the reference's halvings */
          width /= 2.0f;
          const float middle = low + width;
          /* Past float's resolution around low, every later halving sums at low itself (>= 1)
             and keeps it: stopping here gives the same tau as running them all. */
          if (middle == low) break;
          float total = 0.0f;
#pragma omp simd reduction(+ : total)
          for (int64_t s = 0; s < padded; ++s) {
            const float above = x[s] - middle;
            total += above > 0.0f ? pow_vec(above, exponent) : 0.0f;
          }
          if (total >= 1.0f) low = middle;
        }
      }
      float total = 0.0f;
#pragma omp simd reduction(+ : total)
      for (int64_t s = 0; s < len; ++s) {
        const float above = x[s] - low;
        p[first + s] = above > 0.0f ? pow_vec(above, exponent) : 0.0f;
        total += p[first + s];
      }
      total = total > 1.17549435e-38f ? total : 1.17549435e-38f; /* float's smallest normal */
      for (int64_t s = first; s < end; ++s) p[s] /= total;
    }
    outside(first, end, S, p);
  }
}

/* _EntmaxLearnedAlpha.backward's gradient with respect to alpha (Correia, Niculae and Martins,
   2019, Proposition 1), one number per row (added into d_alpha (rows,), summed by the caller):
   sum_i dp_i [(p_i - t_i) / (alpha - 1)^2 - (h_i - t_i sum_j h_j) / (alpha - 1)], with
   t = s / sum(s), s_i = p_i^(2 - alpha) on the support and h_i = p_i log p_i. */
PART
void seq2seq_entmax_alpha_backward(int64_t rows, int64_t S, float alpha,
                                   const int64_t *restrict spans, const float *restrict weights,
                                   int64_t w_stride, const float *restrict d_weights,
                                   float *restrict d_alpha) {
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1];
    const float *restrict p = weights + r * w_stride, *restrict dp = d_weights + r * S;
    float total = 0.0f, entropy = 0.0f;
    for (int64_t s = first; s < end; ++s) {
      if (p[s] > 0.0f) {
        total += __builtin_powf(p[s], 2.0f - alpha);
        entropy += p[s] * __builtin_logf(p[s]);
      }
    }
    const float a = alpha - 1.0f;
    float gradient = 0.0f;
    for (int64_t s = first; s < end; ++s) {
      if (!(p[s] > 0.0f) || !(total > 0.0f)) continue; /* t_i = h_i = p_i = 0 */
      const float t = __builtin_powf(p[s], 2.0f - alpha) / total;
      const float h = p[s] * __builtin_logf(p[s]);
      gradient += dp[s] * ((p[s] - t) / (a * a) - (h - t * entropy) / a);
    }
    d_alpha[r] += gradient;
  }
}

/* entmax_backward with jacobian_weights: the one backward of every alpha >= 1 (Peters et al.,
   2019, Prop. 2), dz = s * dp - s (s . dp) / sum(s), with s_i = p_i^(2 - alpha) where p_i > 0,
   else 0: p for softmax (alpha 1), the support's indicator for sparsemax (2), sqrt(p) for
   entmax15. d_weights and d_logits are (rows, S); a row without support gets zeros. */
PART
void seq2seq_entmax_backward(int64_t rows, int64_t S, float alpha, const int64_t *restrict spans,
                             const float *restrict weights, int64_t w_stride,
                             const float *restrict d_weights, float *restrict d_logits) {
PARALLEL_FOR(rows * S * 16 >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t first = spans[2 * r], end = spans[2 * r + 1];
    const float *restrict p = weights + r * w_stride, *restrict dp = d_weights + r * S;
    float *restrict dz = d_logits + r * S;
    float total = 0.0f, along = 0.0f;
    for (int64_t s = first; s < end; ++s) {
      float j_s = 0.0f;
      if (p[s] > 0.0f) {
        j_s = alpha == 1.0f   ? p[s]
              : alpha == 2.0f ? 1.0f
              : alpha == 1.5f ? __builtin_sqrtf(p[s])
                              : __builtin_powf(p[s], 2.0f - alpha);
      }
      dz[s] = j_s; /* s_i, until the second pass */
      total += j_s;
      along += j_s * dp[s];
    }
    const float mean = total > 0.0f ? along / total : 0.0f;
    for (int64_t s = first; s < end; ++s) dz[s] = dz[s] * (dp[s] - mean);
    outside(first, end, S, dz);
  }
}

/* ---- The context -------------------------------------------------------------------------- */

/* Attention.forward's context = weights @ values: c = sum_s p_s v_s over the valid keys. */
PART
void seq2seq_attention_context(int64_t rows, int64_t group, int64_t S, int64_t V,
                               const float *restrict weights, int64_t w_stride,
                               const int64_t *restrict spans, const float *restrict values,
                               float *restrict context, int64_t c_stride) {
PARALLEL_FOR(rows * S * V >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = r / group, first = spans[2 * r], end = spans[2 * r + 1];
    const float *restrict p = weights + r * w_stride;
    float *restrict c = context + r * c_stride;
    for (int64_t j = 0; j < V; ++j) c[j] = 0.0f;
    for (int64_t s = first; s < end; ++s) {
      const float weight = p[s];
      if (weight == 0.0f) continue; /* sparse weights: a key out of the support adds nothing */
      const float *restrict v_s = values + (b * S + s) * V;
#pragma omp simd
      for (int64_t j = 0; j < V; ++j) c[j] += weight * v_s[j];
    }
  }
}

/* dp_s = dc . v_s (written into d_weights (rows, S)) plus the weights' own gradient where they
   are an output that a loss reads (d_weights_out at its row stride, or NULL), dv_s += p_s dc
   (added into row r's sentence, r / group). */
PART
void seq2seq_attention_context_backward(int64_t rows, int64_t group, int64_t S, int64_t V,
                                        const float *restrict weights, int64_t w_stride,
                                        const int64_t *restrict spans,
                                        const float *restrict values,
                                        const float *restrict d_context, int64_t dc_stride,
                                        const float *restrict d_weights_out, int64_t dwo_stride,
                                        float *restrict d_weights, float *restrict d_values) {
PARALLEL_FOR(rows * S * V >= 4 * PARALLEL_MIN)
  for (int64_t b = 0; b < rows / group; ++b) {
    for (int64_t r = b * group; r < (b + 1) * group; ++r) {
      const int64_t first = spans[2 * r], end = spans[2 * r + 1];
      const float *restrict p = weights + r * w_stride, *restrict dc = d_context + r * dc_stride;
      float *restrict dp = d_weights + r * S;
      for (int64_t s = first; s < end; ++s) {
        const float *restrict v_s = values + (b * S + s) * V;
        float *restrict dv_s = d_values + (b * S + s) * V;
        const float weight = p[s];
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < V; ++j) {
          dot += dc[j] * v_s[j];
          dv_s[j] += weight * dc[j];
        }
        dp[s] = d_weights_out == NULL ? dot : dot + d_weights_out[r * dwo_stride + s];
      }
      outside(first, end, S, dp);
    }
  }
}
