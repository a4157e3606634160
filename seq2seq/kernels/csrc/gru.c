/* The GRU cell's elementwise math, forward and backward, one pass over each step's rows.

   seq2seq/kernels/library.py compiles this file with the system's C compiler and loads it with ctypes.
   It replaces the dozen ATen kernels and autograd nodes that ATen's CPU GRU spends on each step:
   a layer's whole loop over its steps runs here, each step a small GEMM (the kernel below) and
   one pass of this math over the step's rows.

   Gate order and formulas are PyTorch's (nn.GRU):
     r = sigmoid(gi_r + gh_r)    z = sigmoid(gi_z + gh_z)    n = tanh(gi_n + r * gh_n)
     h' = (1 - z) * n + z * h     where gi = W_ih x + b_ih and gh = W_hh h + b_hh, each (3H,).

   The Luong decoder's attention follows: product-scored attention over its packed rows and
   decoding steps (seq2seq/kernels/product_attention.py), and its whole greedy loop built from
   these passes and torch's sgemm_ (seq2seq/kernels/greedy.py). Dropout's keep mask
   (seq2seq/kernels/dropout.py) ends the file. The parts of one attention that both decoders
   compose, each the twin of its Python function, are in attention.c.

   Layouts: a step has `rows` rows. gi, out, d_out and d_gi are read and written at a row stride
   given in floats (the caller's tensors: packed, time-major or batch-first), every other buffer
   is contiguous. `saved` keeps, per row, r, z, n, gh_n and h (5H floats) for the backward pass.
*/
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "vector_math.h"

/* h (rows, H) is read as the previous state and overwritten with the new one, which is also
   written to out. saved may be NULL (no gradient wanted). No two arrays may overlap (restrict:
   the compiler then vectorises without run-time overlap checks). */
void seq2seq_gru_forward(int64_t rows, int64_t H, const float *restrict gi, int64_t gi_stride,
                         const float *restrict gh, float *restrict h, float *restrict out,
                         int64_t out_stride, float *restrict saved) {
#pragma omp parallel for schedule(static) if (rows * H >= PARALLEL_MIN)
  for (int64_t b = 0; b < rows; ++b) {
    const float *restrict gi_b = gi + b * gi_stride;
    const float *restrict gh_b = gh + b * 3 * H;
    float *restrict h_b = h + b * H;
    float *restrict out_b = out + b * out_stride;
    if (saved != NULL) {
      float *restrict s = saved + b * 5 * H;
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const float r = sigmoid_vec(gi_b[j] + gh_b[j]);
        const float z = sigmoid_vec(gi_b[H + j] + gh_b[H + j]);
        const float n = tanh_vec(gi_b[2 * H + j] + r * gh_b[2 * H + j]);
        const float previous = h_b[j];
        s[j] = r;
        s[H + j] = z;
        s[2 * H + j] = n;
        s[3 * H + j] = gh_b[2 * H + j];
        s[4 * H + j] = previous;
        h_b[j] = out_b[j] = n + z * (previous - n);
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < H; ++j) {
        const float r = sigmoid_vec(gi_b[j] + gh_b[j]);
        const float z = sigmoid_vec(gi_b[H + j] + gh_b[H + j]);
        const float n = tanh_vec(gi_b[2 * H + j] + r * gh_b[2 * H + j]);
        h_b[j] = out_b[j] = n + z * (h_b[j] - n);
      }
    }
  }
}

/* dh (rows, H) holds dL/dh' from the later steps on entry; d_out adds this step's own output
   gradient. On exit dh holds the part of dL/dh that does not go through W_hh (dL/dh' * z); the
   caller adds d_gh @ W_hh. d_gi and d_gh are the gradients of the two pre-activations. No two
   arrays may overlap. */
void seq2seq_gru_backward(int64_t rows, int64_t H, float *restrict dh,
                          const float *restrict d_out, int64_t d_out_stride,
                          const float *restrict saved, float *restrict d_gi, int64_t d_gi_stride,
                          float *restrict d_gh) {
#pragma omp parallel for schedule(static) if (rows * H >= PARALLEL_MIN)
  for (int64_t b = 0; b < rows; ++b) {
    const float *restrict s = saved + b * 5 * H;
    const float *restrict d_out_b = d_out + b * d_out_stride;
    float *restrict dh_b = dh + b * H;
    float *restrict d_gi_b = d_gi + b * d_gi_stride;
    float *restrict d_gh_b = d_gh + b * 3 * H;
#pragma omp simd
    for (int64_t j = 0; j < H; ++j) {
      const float r = s[j], z = s[H + j], n = s[2 * H + j], gh_n = s[3 * H + j];
      const float previous = s[4 * H + j];
      const float g = dh_b[j] + d_out_b[j];
      const float d_n = g * (1.0f - z) * (1.0f - n * n);  /* through tanh */
      const float d_z = g * (previous - n) * z * (1.0f - z);  /* through sigmoid */
      const float d_r = d_n * gh_n * r * (1.0f - r);
      d_gi_b[j] = d_r;
      d_gi_b[H + j] = d_z;
      d_gi_b[2 * H + j] = d_n;
      d_gh_b[j] = d_r;
      d_gh_b[H + j] = d_z;
      d_gh_b[2 * H + j] = d_n * r;
      dh_b[j] = g * z;
    }
  }
}

/* The recurrences' GEMMs: a step multiplies its few rows (1-64 here) by the same recurrent
   weight, which stays in cache from step to step. A BLAS sgemm re-packs that weight on every call
   and splits small products badly (torch's against these: docs/performance.md, "A step's GEMMs
   through the panels"). So the weight is packed once per layer call into panels of PANEL
   columns ((K, PANEL) each, contiguous, the last zero-padded), and each step multiplies its rows
   by every panel: PANEL_ROWS rows at a time, whose PANEL_ROWS x PANEL sums the compiler keeps in
   vector registers (16 of them) while it streams the panel's K rows once. The panels are split
   over the threads where `parallel`, each thread writing its own columns. */
#if defined(__AVX512F__)
#define PANEL 64 /* 4 zmm registers a row */
#else
#define PANEL 32 /* 4 ymm registers a row (AVX2; NEON and SSE take it in more registers) */
#endif
#define PANEL_ROWS 4
#define PANEL_PARALLEL_MIN 65536 /* multiply-adds under which waking a thread costs more */

static int64_t panel_count(int64_t N) { return (N + PANEL - 1) / PANEL; }

/* Floats of the panels of a (K, N) matrix: what the caller allocates per weight. */
int64_t seq2seq_panel_floats(int64_t K, int64_t N) { return panel_count(N) * K * PANEL; }

/* B (K, N) into panels: B[k][n] is src[k * ld + n], or with `transposed` src[n * ld + k] (a
   torch weight (N, K) read as its transpose). */
static void pack_panels(int64_t K, int64_t N, const float *restrict src, int64_t ld,
                        int transposed, float *restrict panels) {
  for (int64_t p = 0; p < panel_count(N); ++p)
    for (int64_t k = 0; k < K; ++k) {
      float *restrict row = panels + (p * K + k) * PANEL;
      for (int64_t j = 0; j < PANEL; ++j) {
        const int64_t n = p * PANEL + j;
        row[j] = n >= N ? 0.0f : (transposed ? src[n * ld + k] : src[k * ld + n]);
      }
    }
}

/* `count` (<= PANEL_ROWS) rows of C's `width` (<= PANEL) columns of one panel: C = start + A P,
   where start is bias (if not NULL), else C itself (if `accumulate`), else 0. A full block of
   PANEL_ROWS rows has constant loop bounds, which the compiler unrolls into registers. */
static inline void panel_block(int64_t count, int64_t width, int64_t K, const float *restrict A,
                               int64_t lda, const float *restrict P, const float *restrict bias,
                               int accumulate, float *restrict C, int64_t ldc) {
  float sums[PANEL_ROWS][PANEL];
  for (int64_t r = 0; r < PANEL_ROWS; ++r)
    for (int64_t j = 0; j < PANEL; ++j)
      sums[r][j] = r >= count || j >= width ? 0.0f
                   : bias != NULL           ? bias[j]
                   : accumulate             ? C[r * ldc + j]
                                            : 0.0f;
  if (count == PANEL_ROWS) {
    for (int64_t k = 0; k < K; ++k) {
      const float *restrict b = P + k * PANEL;
      for (int64_t r = 0; r < PANEL_ROWS; ++r) {
        const float a = A[r * lda + k];
#pragma omp simd
        for (int64_t j = 0; j < PANEL; ++j) sums[r][j] += a * b[j];
      }
    }
  } else {
    for (int64_t r = 0; r < count; ++r)
      for (int64_t k = 0; k < K; ++k) {
        const float a = A[r * lda + k];
        const float *restrict b = P + k * PANEL;
#pragma omp simd
        for (int64_t j = 0; j < PANEL; ++j) sums[r][j] += a * b[j];
      }
  }
  for (int64_t r = 0; r < count; ++r)
    for (int64_t j = 0; j < width; ++j) C[r * ldc + j] = sums[r][j];
}

/* C (rows, N) = start + A (rows, K) B, B in panels (pack_panels), start as in panel_block. */
static void panel_gemm(int64_t rows, int64_t K, int64_t N, const float *A, int64_t lda,
                       const float *panels, const float *bias, int accumulate, float *C,
                       int64_t ldc, int parallel) {
#pragma omp parallel for schedule(static) if (parallel && rows * K * N >= PANEL_PARALLEL_MIN)
  for (int64_t p = 0; p < panel_count(N); ++p) {
    const int64_t first = p * PANEL, width = N - first < PANEL ? N - first : PANEL;
    for (int64_t r = 0; r < rows; r += PANEL_ROWS)
      panel_block(rows - r < PANEL_ROWS ? rows - r : PANEL_ROWS, width, K, A + r * lda, lda,
                  panels + p * K * PANEL, bias == NULL ? NULL : bias + first, accumulate,
                  C + r * ldc + first, ldc);
  }
}

/* The two above for a caller that steps in Python (kernels/step_gemm.py): a weight packed
   once per call of its loop, then each step's rows through it. C (rows, N) = start + A B, start
   as in panel_block; the threads split the panels. */
void seq2seq_pack_panels(int64_t K, int64_t N, const float *src, int64_t ld, int transposed,
                         float *panels) {
  pack_panels(K, N, src, ld, transposed, panels);
}

void seq2seq_panel_gemm(int64_t rows, int64_t K, int64_t N, const float *A, int64_t lda,
                        const float *panels, const float *bias, int accumulate, float *C,
                        int64_t ldc) {
  panel_gemm(rows, K, N, A, lda, panels, bias, accumulate, C, ldc, 1);
}

/* A direction's whole recurrence: every step's recurrent GEMM (panel_gemm, W_hh packed once),
   then the step's pass above. The same arithmetic as gru.py's Python loop over the steps
   (torch's GEMMs, rounding aside), which pays about 9 us of Python, ctypes and dispatch per step
   around work of 15-170 us.

   Step k of the `steps` (in the order they run) has counts[k] rows, its gates at
   gates + gate_offsets[k] and its outputs at out + out_offsets[k] (row strides in floats);
   the rows are the first counts[k] rows of h (rows, H), which enter as the initial state and
   leave as the final one, and counts never grows (a packed batch's rows are sorted by length).
   W (3H, H) and bias (3H, or NULL) are W_hh and b_hh, `panels` holds
   seq2seq_panel_floats(H, 3H) floats for W_hh^T's panels; recurrent is scratch of (rows, 3H);
   saved (the steps' rows, 5H) as in seq2seq_gru_forward, or NULL. */
static void seq2seq_gru_loop_forward(int64_t steps, const int64_t *restrict counts,
                                     const int64_t *restrict gate_offsets,
                                     const int64_t *restrict out_offsets, int64_t H,
                                     const float *gates, int64_t gate_stride, const float *W,
                                     const float *bias, float *h, float *out, int64_t out_stride,
                                     float *recurrent, float *saved, float *panels, int parallel) {
  pack_panels(H, 3 * H, W, H, 1, panels); /* B = W^T (H, 3H) */
  int64_t done = 0; /* rows of the steps so far: where this step's saved rows start */
  for (int64_t k = 0; k < steps; ++k) {
    const int64_t rows = counts[k];
    /* (rows, 3H) = b + h W^T */
    panel_gemm(rows, H, 3 * H, h, H, panels, bias, 0, recurrent, 3 * H, parallel);
    float *step_saved = saved == NULL ? NULL : saved + done * 5 * H;
    seq2seq_gru_forward(rows, H, gates + gate_offsets[k], gate_stride, recurrent, h,
                        out + out_offsets[k], out_stride, step_saved);
    done += rows;
  }
}

/* The backward pass of seq2seq_gru_loop_forward, its steps in reverse: dh (rows, H) holds dL/dh
   of the final states on entry and of the initial ones on exit; d_out and d_gi are laid out as
   out and gates (the same offsets and strides); d_recurrent (the steps' rows, 3H, in the order
   they ran) receives each step's d_gh, from which the caller gets W_hh's and b_hh's gradients
   in one GEMM and one sum. `panels` holds seq2seq_panel_floats(3H, H) floats for W_hh's. */
static void seq2seq_gru_loop_backward(int64_t steps, const int64_t *restrict counts,
                                      const int64_t *restrict gate_offsets,
                                      const int64_t *restrict out_offsets, int64_t H, float *dh,
                                      const float *d_out, int64_t d_out_stride, const float *saved,
                                      float *d_gi, int64_t d_gi_stride, float *d_recurrent,
                                      const float *W, float *panels, int parallel) {
  const int64_t width = 3 * H;
  pack_panels(width, H, W, H, 0, panels); /* B = W (3H, H) */
  int64_t done = 0;
  for (int64_t k = 0; k < steps; ++k) done += counts[k];
  for (int64_t k = steps - 1; k >= 0; --k) {
    const int64_t rows = counts[k];
    done -= rows;
    float *step_d_recurrent = d_recurrent + done * width;
    seq2seq_gru_backward(rows, H, dh, d_out + out_offsets[k], d_out_stride, saved + done * 5 * H,
                         d_gi + gate_offsets[k], d_gi_stride, step_d_recurrent);
    /* dh (rows, H) += d_gh (rows, 3H) @ W (3H, H) */
    panel_gemm(rows, width, H, step_d_recurrent, width, panels, NULL, 1, dh, H, parallel);
  }
}

/* A layer's directions through the loops above: direction d's schedule is tables + d * 3 * steps
   (counts, gate offsets, output offsets), its W_hh and b_hh W[d] and bias[d] (or NULL), its
   state h + d * B * H, scratch recurrent + d * B * 3H, saved rows saved + d * N * 5H (or NULL)
   and weight panels panels + d * seq2seq_panel_floats(H, 3H). With `concurrent`, each direction
   runs on its own OpenMP thread, with no barrier between steps: the directions share nothing
   they write. Without, they run one after the other, each step's GEMM split over all of torch's
   threads; the caller chooses (gru.py: concurrent where torch has as many threads as
   there are directions). */
void seq2seq_gru_layer_forward(int64_t directions, int64_t steps, const int64_t *tables,
                               int64_t B, int64_t H, int64_t N, const float *gates,
                               int64_t gate_stride, const float *const *W,
                               const float *const *bias, float *h, float *out,
                               int64_t out_stride, float *recurrent, float *saved, float *panels,
                               int concurrent) {
  /* Direction d of the layer: its schedule, weights, state, scratch and saved rows. */
#define SEQ2SEQ_LAYER_FORWARD(d)                                                                \
  seq2seq_gru_loop_forward(steps, tables + (d) * 3 * steps, tables + ((d) * 3 + 1) * steps,     \
                           tables + ((d) * 3 + 2) * steps, H, gates, gate_stride, W[d],         \
                           bias[d], h + (d) * B * H, out, out_stride,                           \
                           recurrent + (d) * B * 3 * H,                                         \
                           saved == NULL ? NULL : saved + (d) * N * 5 * H,                      \
                           panels + (d) * seq2seq_panel_floats(H, 3 * H), !concurrent)
  if (!concurrent) {
    for (int64_t d = 0; d < directions; ++d) SEQ2SEQ_LAYER_FORWARD(d);
    return;
  }
#pragma omp parallel for num_threads(directions) schedule(static, 1)
  for (int64_t d = 0; d < directions; ++d) SEQ2SEQ_LAYER_FORWARD(d);
#undef SEQ2SEQ_LAYER_FORWARD
}

/* The backward pass of seq2seq_gru_layer_forward: direction d's dh at dh + d * B * H, its saved
   rows at saved + d * N * 5H, its d_gh rows at d_recurrent + d * N * 3H and its weight panels
   at panels + d * seq2seq_panel_floats(3H, H). */
void seq2seq_gru_layer_backward(int64_t directions, int64_t steps, const int64_t *tables,
                                int64_t B, int64_t H, int64_t N, float *dh, const float *d_out,
                                int64_t d_out_stride, const float *saved, float *d_gi,
                                int64_t d_gi_stride, float *d_recurrent, const float *const *W,
                                float *panels, int concurrent) {
#define SEQ2SEQ_LAYER_BACKWARD(d)                                                               \
  seq2seq_gru_loop_backward(steps, tables + (d) * 3 * steps, tables + ((d) * 3 + 1) * steps,    \
                            tables + ((d) * 3 + 2) * steps, H, dh + (d) * B * H, d_out,         \
                            d_out_stride, saved + (d) * N * 5 * H, d_gi, d_gi_stride,           \
                            d_recurrent + (d) * N * 3 * H, W[d],                                \
                            panels + (d) * seq2seq_panel_floats(3 * H, H), !concurrent)
  if (!concurrent) {
    for (int64_t d = 0; d < directions; ++d) SEQ2SEQ_LAYER_BACKWARD(d);
    return;
  }
#pragma omp parallel for num_threads(directions) schedule(static, 1)
  for (int64_t d = 0; d < directions; ++d) SEQ2SEQ_LAYER_BACKWARD(d);
#undef SEQ2SEQ_LAYER_BACKWARD
}

/* tanh in place over n contiguous floats: the Luong decoder's attentional layer when decoding
   (torch's float tanh costs about 4x its sigmoid on the CPUs this was measured on). Blocks of
   1024 split over the threads from 16,384 elements on. */
void seq2seq_tanh(int64_t n, float *restrict x) {
#pragma omp parallel for schedule(static) if (n >= 4 * PARALLEL_MIN)
  for (int64_t start = 0; start < n; start += 1024) {
    const int64_t end = start + 1024 < n ? start + 1024 : n;
#pragma omp simd
    for (int64_t i = start; i < end; ++i) x[i] = tanh_vec(x[i]);
  }
}

/* w (S,) holds the scores of the len valid keys on entry and their softmax weights on exit (0
   from len on); c (V,) = sum_s w_s values[s], values (len, V) contiguous. */
static void softmax_average(int64_t len, int64_t S, int64_t V, float largest,
                            float *restrict w, const float *restrict values, float *restrict c) {
  float total = 0.0f;
  for (int64_t s = 0; s < len; ++s) {
    w[s] = exp_vec(w[s] - largest);
    total += w[s];
  }
  for (int64_t s = 0; s < len; ++s) w[s] /= total;
  for (int64_t s = len; s < S; ++s) w[s] = 0.0f;
  for (int64_t j = 0; j < V; ++j) c[j] = 0.0f;
  for (int64_t s = 0; s < len; ++s) {
    const float weight = w[s];
    const float *restrict v_s = values + s * V;
#pragma omp simd
    for (int64_t j = 0; j < V; ++j) c[j] += weight * v_s[j];
  }
}

/* One query's product-scored attention: q (D) against keys (S, D), of which the first len are
   valid, weights w (S) and the context c (V) over values (S, V). */
static void product_row(int64_t S, int64_t D, int64_t V, float scale, const float *restrict q,
                        const float *restrict keys, int64_t len, const float *restrict values,
                        float *restrict w, float *restrict c) {
  len = valid_keys(len, S);
  float largest = 0.0f;
  for (int64_t s = 0; s < len; ++s) {
    const float *restrict k_s = keys + s * D;
    float score = 0.0f;
#pragma omp simd reduction(+ : score)
    for (int64_t j = 0; j < D; ++j) score += q[j] * k_s[j];
    w[s] = scale * score;
    largest = (s == 0 || w[s] > largest) ? w[s] : largest;
  }
  softmax_average(len, S, V, largest, w, values, c);
}

/* Product-scored attention (seq2seq/kernels/product_attention.py): score_s = scale * q . k_s (dot, scaled
   dot and general, whose keys are W k), masked softmax over the valid keys of the row's sentence,
   and context = sum_s weight_s values_s. Row r's sentence is sentence_of[r] (training's packed
   rows, PackedProductAttention: only the real target positions attend, no (B, T, S) grid of
   padded queries), or r / group where sentence_of is NULL (a decoding step: group hypotheses
   per sentence). Layouts as in attention.c: q (rows, D), keys (sentences, S, D),
   values (sentences, S, V), weights (rows, S), zero at the padding, and context (rows, V) at
   row strides given in floats. */
void seq2seq_product_forward(int64_t rows, int64_t group, const int64_t *restrict sentence_of,
                             int64_t S, int64_t D, int64_t V, float scale,
                             const float *restrict q, const float *restrict keys,
                             const int64_t *restrict lens, const float *restrict values,
                             float *restrict weights, int64_t weights_stride,
                             float *restrict context, int64_t context_stride) {
#pragma omp parallel for schedule(static) if (rows * S * (D + V) >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = sentence_of == NULL ? r / group : sentence_of[r];
    product_row(S, D, V, scale, q + r * D, keys + b * S * D, lens[b], values + b * S * V,
                weights + r * weights_stride, context + r * context_stride);
  }
}

/* The backward pass of seq2seq_product_forward over packed rows (sentence_of given, contiguous
   rows), for PackedProductAttention. With dc row r's context gradient and w its weights: dw_s = dc . v_s, the
   score's gradient ds_s = w_s (dw_s - sum_s' w_s' dw_s'), dq = scale sum_s ds_s k_s, and for
   each sentence dk_s = scale sum_r ds_{r,s} q_r and dv_s = sum_r w_{r,s} dc_r over its rows.
   The first pass runs over the rows (d_scores (rows, S) is scratch), the second over the
   sentences, each reading its rows as order[starts[b] .. starts[b + 1]) (the rows grouped by
   sentence), so that no two threads add into one sentence's gradients. d_keys (B, S, D) and
   d_values (B, S, V) are written whole, zero at the padding. */
void seq2seq_product_rows_backward(int64_t rows, int64_t B, int64_t S, int64_t D, int64_t V,
                                   float scale, const float *restrict q,
                                   const int64_t *restrict sentence_of,
                                   const int64_t *restrict order, const int64_t *restrict starts,
                                   const float *restrict keys, const int64_t *restrict lens,
                                   const float *restrict values, const float *restrict weights,
                                   const float *restrict d_context, float *restrict d_scores,
                                   float *restrict d_q, float *restrict d_keys,
                                   float *restrict d_values) {
#pragma omp parallel for schedule(static) if (rows * S * (D + V) >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t b = sentence_of[r], len = valid_keys(lens[b], S);
    const float *restrict w = weights + r * S, *restrict dc = d_context + r * V;
    const float *restrict k_b = keys + b * S * D, *restrict v_b = values + b * S * V;
    float *restrict ds = d_scores + r * S, *restrict dq = d_q + r * D;
    float mean = 0.0f; /* sum_s w_s dw_s */
    for (int64_t s = 0; s < len; ++s) {
      const float *restrict v_s = v_b + s * V;
      float dw = 0.0f;
#pragma omp simd reduction(+ : dw)
      for (int64_t j = 0; j < V; ++j) dw += dc[j] * v_s[j];
      ds[s] = dw;
      mean += w[s] * dw;
    }
    for (int64_t j = 0; j < D; ++j) dq[j] = 0.0f;
    for (int64_t s = 0; s < len; ++s) {
      ds[s] = w[s] * (ds[s] - mean);
      const float a = scale * ds[s];
      const float *restrict k_s = k_b + s * D;
#pragma omp simd
      for (int64_t j = 0; j < D; ++j) dq[j] += a * k_s[j];
    }
  }
#pragma omp parallel for schedule(static) if (rows * S * (D + V) >= 4 * PARALLEL_MIN)
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = valid_keys(lens[b], S);
    float *restrict dk_b = d_keys + b * S * D, *restrict dv_b = d_values + b * S * V;
    for (int64_t j = 0; j < S * D; ++j) dk_b[j] = 0.0f;
    for (int64_t j = 0; j < S * V; ++j) dv_b[j] = 0.0f;
    for (int64_t i = starts[b]; i < starts[b + 1]; ++i) {
      const int64_t r = order[i];
      const float *restrict q_r = q + r * D, *restrict dc = d_context + r * V;
      for (int64_t s = 0; s < len; ++s) {
        const float a = scale * d_scores[r * S + s], w = weights[r * S + s];
        float *restrict dk_s = dk_b + s * D, *restrict dv_s = dv_b + s * V;
#pragma omp simd
        for (int64_t j = 0; j < D; ++j) dk_s[j] += a * q_r[j];
#pragma omp simd
        for (int64_t j = 0; j < V; ++j) dv_s[j] += w * dc[j];
      }
    }
  }
}

/* torch's BLAS sgemm (its address passed in `sgemm`; library.py's blas_sgemm), for the
   greedy loop below. It has the Fortran interface: column-major, every argument a pointer. Its
   integers are passed as pointers to int64_t: on a little-endian machine the first 4 bytes of
   one hold the same small value, so this is right for BLAS with 32-bit (LP64) and 64-bit (ILP64)
   integers. */
typedef void (*sgemm_fn)(const char *transa, const char *transb, const int64_t *m,
                         const int64_t *n, const int64_t *k, const float *alpha, const float *a,
                         const int64_t *lda, const float *b, const int64_t *ldb,
                         const float *beta, float *c, const int64_t *ldc);

/* y (rows, out) = x (rows, in) W^T + bias, as torch.addmm(bias, x, W.t()) computes it: the bias
   copied into every row, then beta 1 adds the product (no bias: beta 0). W (out, in) is read
   at row stride ldw. Column-major, y^T (out, rows) = op(W) x^T with W read as the (in, out)
   matrix W^T and transposed. Exported for library.py's check of the sgemm it is given. */
void seq2seq_affine_rows(void *sgemm, int64_t rows, int64_t out, int64_t in, const float *W,
                         int64_t ldw, const float *bias, const float *x, float *y) {
  const float one = 1.0f, zero = 0.0f;
  if (bias != NULL)
    for (int64_t r = 0; r < rows; ++r) memcpy(y + r * out, bias, out * sizeof(float));
  ((sgemm_fn)sgemm)("T", "N", &out, &rows, &in, &one, W, &ldw, x, &in,
                    bias != NULL ? &one : &zero, y, &out);
}

/* The parts of attention.c a greedy step composes (attention.c says what each is), compiled
   here a second time: static, and each with its row loop serial, for parts_row calls them one
   row at a time inside parts_step's parallel region. */
#define SEQ2SEQ_SERIAL_PARTS
#include "attention.c"
#undef SEQ2SEQ_SERIAL_PARTS
#undef PART
#undef PARALLEL_FOR

/* Which parts a greedy step's attention is composed of, field for field the ctypes Structure
   GreedyParts of seq2seq/kernels/greedy.py (from attention_parts.StepAttention): the score
   (additive: w_v . tanh(W_q h + b_q + k), W_q (A, H) and b_q (A, or NULL) projecting the query
   once per step; else the product q . k) times `scale`, with `layer_norm_eps` >= 0 the
   additive score's layer norm (w_v then holds [w_v; gamma; beta], 3 A floats); the key bias
   (P floats, or NULL); the window (half-width D, or -1: every real key) around local-m's
   p_t = min(t, S_b - 1) or, with W_p (H, H) and v_p (H) given, local-p's predicted
   p_t = (S_b - 1) sigmoid(v_p . tanh(W_p h_t)) and its Gaussian; the normalizer (0 softmax,
   1 sparsemax, 2 entmax15, 3 entmax_bisect at `alpha`); coverage (0 none, 1 gamma c_s on the
   logits, 2 c_s w_c inside the additive score's tanh). With several heads (`heads` > 1), W_q
   (heads d, H) and b_q are the block's, which give a row's heads' queries, and an additive
   score's W_a (A, d) and b_a (A, or NULL) then map each head's d of them to its A
   (FastDecoder.loop_inputs: two GEMMs of D (H + A) multiply-adds a row, where their fold into
   one (heads A, H) weight would take heads A H; W_a is NULL otherwise); head i of sentence b
   reads keys and values (head_size d) of sentence b heads + i and, with coverage, the heads'
   averaged coverage times its own gammas[i]; the heads' contexts, side by side, become the
   attentional state's part through W_c1 (H, heads d) and b_c1 (H, or NULL): W_c1 W_o and
   W_c1 b_o, the block's W_o folded in; every head shares the row's window. */
typedef struct {
  int64_t additive;
  float scale;
  int64_t normalizer;
  float alpha;
  int64_t iterations;
  int64_t window_size;
  const float *key_bias;
  int64_t key_bias_len;
  const float *W_q;
  const float *b_q;
  const float *w_v;
  int64_t A;
  int64_t coverage;
  float gamma;
  const float *w_c;
  int64_t heads;
  int64_t head_size;
  const float *W_c1;
  const float *b_c1;
  float layer_norm_eps;
  const float *W_p;
  const float *v_p;
  const float *gammas;
  const float *W_a;
  const float *b_a;
} greedy_parts;

/* A weight W (out, in), read at row stride ld, that the greedy loop multiplies its rows by:
   through torch's sgemm, or where `panels` is not NULL through panel_gemm, W^T packed once per
   call (an AVX-512 build: seq2seq/kernels/step_gemm.py says why). */
typedef struct {
  const float *W;
  int64_t ld, out, in;
  float *panels;
} step_weight;

/* The greedy loop's weights: the cell's W_if and W_hh, the parts' W_q, W_a, W_p and W_c1, the
   attentional layer's W_c2 and the output layer's W_s (each unused one's W NULL). */
typedef struct {
  void *sgemm;
  step_weight W_if, W_hh, W_q, W_a, W_p, W_c1, W_c2, W_s;
} greedy_weights;

static void step_weight_pack(step_weight *w, const float *W, int64_t ld, int64_t out, int64_t in,
                             int packed) {
  w->W = W;
  w->ld = ld;
  w->out = out;
  w->in = in;
  w->panels = NULL;
  if (!packed || W == NULL) return;
  w->panels = malloc((size_t)seq2seq_panel_floats(in, out) * sizeof(float));
  if (w->panels != NULL) pack_panels(in, out, W, ld, 1, w->panels); /* else: through sgemm */
}

/* y (rows, out) = x (rows, in) W^T + bias (bias NULL: 0), or with `accumulate` y += x W^T. */
static void step_rows(const greedy_weights *products, const step_weight *w, int64_t rows,
                      const float *bias, int accumulate, const float *x, float *y) {
  if (w->panels != NULL) {
    panel_gemm(rows, w->in, w->out, x, w->in, w->panels, bias, accumulate, y, w->out, 1);
  } else if (accumulate) { /* y^T (out, rows) += W x^T, column-major */
    const float one = 1.0f;
    ((sgemm_fn)products->sgemm)("T", "N", &w->out, &rows, &w->in, &one, w->W, &w->ld, x, &w->in,
                               &one, y, &w->out);
  } else {
    seq2seq_affine_rows(products->sgemm, rows, w->out, w->in, w->W, w->ld, bias, x, y);
  }
}

/* Row r's attention at step t through the parts: keys (S, K) and values (S, H) its sentence's,
   length its lens entry; q its query (K floats: h, or W_q h + b_q); centre its local-p centre
   (NULL without); coverage (S) what it attended so far (NULL without), scaled by gamma on the
   logits, to which the step's weights are added when `accumulate`; spans (2), logits (S) and
   covered (S x K, additive coverage's keys) scratch; the weights to `weights`, the context to
   `context`. */
static void parts_row(const greedy_parts *parts, int64_t S, int64_t K, int64_t H, int64_t t,
                      const float *q, const float *keys, const float *values,
                      const int64_t *length, const float *centre, float *coverage, float gamma,
                      int accumulate, int64_t *spans, float *logits, float *covered,
                      float *weights, float *context) {
  if (parts->window_size < 0) {
    seq2seq_global_window(1, 1, S, length, spans);
  } else if (centre != NULL) { /* local-p: the predicted centre */
    seq2seq_local_window(1, 1, S, parts->window_size, length, centre, spans);
  } else {
    const int64_t last = *length - 1; /* p_t = min(t, max(S_b - 1, 0)) */
    const float monotonic = (float)(t < last ? t : (last > 0 ? last : 0));
    seq2seq_local_window(1, 1, S, parts->window_size, length, &monotonic, spans);
  }
  if (parts->coverage == 2) { /* the keys k_s + c_s w_c */
    seq2seq_additive_coverage(1, 1, S, K, spans, keys, coverage, parts->w_c, covered);
    keys = covered;
  }
  if (parts->additive && parts->layer_norm_eps >= 0.0f)
    seq2seq_additive_layer_norm_score(1, 1, S, K, parts->scale, parts->layer_norm_eps, q, keys,
                                      parts->w_v, spans, NULL, NULL, NULL, logits);
  else if (parts->additive)
    seq2seq_additive_score(1, 1, S, K, parts->scale, q, keys, parts->w_v, spans, NULL, logits);
  else
    seq2seq_product_score(1, 1, S, K, parts->scale, q, keys, spans, logits);
  if (parts->coverage == 1) seq2seq_coverage(1, S, spans, gamma, coverage, logits);
  if (parts->key_bias != NULL)
    seq2seq_key_bias(1, S, parts->key_bias_len, parts->key_bias, spans, logits);
  switch (parts->normalizer) {
    case 0: seq2seq_softmax(1, S, spans, logits, weights, S); break;
    case 1: seq2seq_sparsemax(1, S, spans, logits, weights, S); break;
    case 2: seq2seq_entmax15(1, S, spans, logits, weights, S); break;
    default:
      seq2seq_entmax_bisect(1, S, spans, parts->alpha, parts->iterations, logits, weights, S);
  }
  if (centre != NULL)
    seq2seq_local_p_gaussian(1, S, parts->window_size, spans, centre, weights, S, NULL);
  seq2seq_attention_context(1, 1, S, H, weights, S, spans, values, context, H);
  if (accumulate)
    for (int64_t s = 0; s < S; ++s) coverage[s] += weights[s];
}

/* Local-p's centres of the `active` rows (their states `query`, (active, H)): features
   (active, H) = W_p query^T, scratch, then attention.c's seq2seq_local_p_centres (row r's
   sentence rows[r]). */
static void predicted_centres(const greedy_weights *products, const greedy_parts *parts,
                              int64_t active, int64_t H, const float *query, const int64_t *lens,
                              const int64_t *rows, float *features, float *centres) {
  step_rows(products, &products->W_p, active, NULL, 0, query, features);
  seq2seq_local_p_centres(active, H, parts->v_p, lens, rows, features, NULL, centres);
}

/* A greedy step's attention through the parts for the `active` rows (row r is sentence rows[r]):
   queries (active, H) -> each row's weights (the heads' average) into weights (row b's at
   b * max_steps + t) and its part of the attentional state into attentional (active, H).
   Scratch in `work` (active * (heads * (K + 2S + d) + H + 1) floats, S K each more with
   additive coverage and heads d with additive heads) and spans (2 * active * heads). */
static void parts_step(const greedy_weights *products, const greedy_parts *parts, int64_t active,
                       int64_t S,
                       int64_t H, int64_t K, int64_t t, int64_t max_steps, const float *query,
                       const float *keys, const float *values, const int64_t *lens,
                       const int64_t *rows, float *coverage, float *weights, float *attentional,
                       float *work, int64_t *spans) {
  const int64_t heads = parts->heads, d = heads > 1 ? parts->head_size : H;
  float *projected = work, *scores = projected + active * heads * K;
  float *head_weights = scores + active * heads * S, *contexts = head_weights + active * heads * S;
  float *features = contexts + active * heads * d, *centres = features + active * H;
  float *covered = centres + active;
  float *head_queries = covered + (parts->coverage == 2 ? active * S * K : 0);
  const float *q = query; /* h, or its projection: (active, heads K) */
  if (parts->W_a != NULL) { /* W_a (W_q,i h + b_i) + b_a: (active, heads d), then its heads' */
    step_rows(products, &products->W_q, active, parts->b_q, 0, query, head_queries);
    step_rows(products, &products->W_a, active * heads, parts->b_a, 0, head_queries, projected);
    q = projected;
  } else if (parts->W_q != NULL) {
    step_rows(products, &products->W_q, active, parts->b_q, 0, query, projected);
    q = projected;
  }
  if (parts->W_p != NULL)
    predicted_centres(products, parts, active, H, query, lens, rows, features, centres);
  /* One head: the context is the attentional state's part itself (values are W_c1 m). */
  float *context = heads > 1 ? contexts : attentional;
#pragma omp parallel for schedule(static) if (active * heads * S * 2 * K >= 4 * PARALLEL_MIN)
  for (int64_t r = 0; r < active; ++r) {
    const int64_t b = rows[r];
    float *out = weights + (b * max_steps + t) * S;
    float *row_coverage = parts->coverage ? coverage + r * S : NULL;
    for (int64_t i = 0; i < heads; ++i) {
      const int64_t row = r * heads + i, sentence = b * heads + i;
      const float gamma = heads > 1 && parts->gammas != NULL ? parts->gammas[i] : parts->gamma;
      parts_row(parts, S, K, d, t, q + row * K, keys + sentence * S * K,
                values + sentence * S * d, lens + b, parts->W_p != NULL ? centres + r : NULL,
                row_coverage, gamma, row_coverage != NULL && heads == 1, spans + 2 * row,
                scores + row * S, covered + r * S * K, heads > 1 ? head_weights + row * S : out,
                context + row * d);
    }
    if (heads > 1) { /* the heads' average, as the reference returns it (and covers) */
      for (int64_t s = 0; s < S; ++s) {
        float total = 0.0f;
        for (int64_t i = 0; i < heads; ++i) total += head_weights[(r * heads + i) * S + s];
        out[s] = total / (float)heads;
        if (row_coverage != NULL) row_coverage[s] += out[s];
      }
    }
  }
  if (heads > 1) /* W_c1 (W_o c + b_o) = (W_c1 W_o) c + W_c1 b_o: (active, H) */
    step_rows(products, &products->W_c1, active, parts->b_c1, 0, contexts, attentional);
}

/* Greedy decoding with the Luong decoder (seq2seq/kernels/greedy.py): a GRU cell, attention scored
   scale * q . k' (seq2seq_product_forward) averaging W_c1 m, the attentional state
   tanh(W_c1 c + W_c2 h) and the logits W_s a + b_s, every step of a batch in one call. It is
   LuongDecoder.decode_step and greedy_search's loop, the same GEMMs (torch's sgemm_, or with
   `panels` panel_gemm, each weight packed once per call: step_weight) and C passes
   in the same order, without the dozen Python-dispatched ops per step between them.

   table (V, 3H) holds W_ie e + b_ih of every target token, W_hh (3H, H) and b_hh (3H, or NULL)
   the cell's, keys and values (B, S, H) the projected keys and W_c1 m of each sentence, lens (B)
   their lengths. W_c2 (H, H) is read at row stride ld_c2 (a column block of W_c), W_s (V, H)
   and b_s (V, or NULL) are the output layer's. h (B, H) enters as the initial states and is
   scratch, as are work (B * (8H + V) floats), rows and prev (B each). A sentence leaves the
   batch at its EOS or at limits[b] tokens (the rows that stay keep their order, as greedy_search
   keeps them); tokens (B, max_steps) and weights (B, max_steps, S) receive the active rows of
   each step (the rest stays as the caller filled it). Returns the number of steps run.

   With `parts` (not NULL) the attention is composed of them instead (parts_step): keys are
   (B heads, S, K), K = parts->A for an additive score, values (B heads, S, d), and work holds
   B * (8H + V) floats and parts_step's scratch for B rows more, spans its; with coverage,
   `coverage` (B, S) enters as each sentence's so far (and is scratch). With input feeding, W_if (3H, H) at row stride ld_if
   adds W_if f_{t-1} to the cell's input, f the last attentional vector, `feed` (B, H), which
   enters as f_0 (and is scratch); else W_if is NULL. */
int64_t seq2seq_luong_greedy(void *sgemm, int64_t B, int64_t S, int64_t H, int64_t V,
                             int64_t max_steps, int64_t bos, int64_t eos,
                             const float *restrict table, const float *W_hh, const float *b_hh,
                             const float *restrict keys, const float *restrict values,
                             const int64_t *restrict lens, float scale, const float *W_c2,
                             int64_t ld_c2, const float *W_s, const float *b_s,
                             const int64_t *restrict limits, float *restrict h,
                             float *restrict work, int64_t *restrict rows, int64_t *restrict prev,
                             int64_t *restrict tokens, float *restrict weights,
                             const greedy_parts *parts, int64_t *restrict spans,
                             float *restrict coverage, const float *W_if, int64_t ld_if,
                             float *restrict feed, int panels) {
  const int64_t G = 3 * H;
  /* A key's size: additive scoring's A, a head's d, or the state's. */
  int64_t K = H;
  if (parts != NULL && parts->additive) K = parts->A;
  else if (parts != NULL && parts->heads > 1) K = parts->head_size;
  const int covers = parts != NULL && parts->coverage != 0;
  /* Every weight the steps multiply by, packed once here with `panels`. */
  greedy_weights products = {.sgemm = sgemm};
  step_weight_pack(&products.W_if, W_if, ld_if, G, H, panels);
  step_weight_pack(&products.W_hh, W_hh, H, G, H, panels);
  step_weight_pack(&products.W_c2, W_c2, ld_c2, H, H, panels);
  step_weight_pack(&products.W_s, W_s, H, V, H, panels);
  if (parts != NULL) {
    const int64_t heads = parts->heads, d = heads > 1 ? parts->head_size : H;
    const int64_t queries = parts->W_a != NULL ? heads * d : heads * K; /* W_q's rows */
    step_weight_pack(&products.W_q, parts->W_q, H, queries, H, panels);
    step_weight_pack(&products.W_a, parts->W_a, d, K, d, panels);
    step_weight_pack(&products.W_p, parts->W_p, H, H, H, panels);
    step_weight_pack(&products.W_c1, heads > 1 ? parts->W_c1 : NULL, heads * d, H, heads * d,
                     panels);
  }
  float *gates = work, *recurrent = gates + B * G, *query = recurrent + B * G;
  float *attentional = query + B * H, *logits = attentional + B * H;
  float *scratch = logits + B * V; /* parts_step's */
  int64_t active = B, steps = max_steps;
  for (int64_t b = 0; b < B; ++b) {
    rows[b] = b;
    prev[b] = bos;
  }
  for (int64_t t = 0; t < max_steps; ++t) {
    /* The cell: gates (A, 3H) from the table, recurrent = b_hh + h W_hh^T, then the gate pass
       updating h and writing the query. */
    for (int64_t r = 0; r < active; ++r)
      memcpy(gates + r * G, table + prev[r] * G, G * sizeof(float));
    if (W_if != NULL) step_rows(&products, &products.W_if, active, NULL, 1, feed, gates);
    step_rows(&products, &products.W_hh, active, b_hh, 0, h, recurrent);
    seq2seq_gru_forward(active, H, gates, G, recurrent, h, query, H, NULL);
    /* Attention: row r is sentence rows[r]; its weights go straight to the output. */
    if (parts == NULL) {
#pragma omp parallel for schedule(static) if (active * S * 2 * H >= 4 * PARALLEL_MIN)
      for (int64_t r = 0; r < active; ++r) {
        const int64_t b = rows[r];
        product_row(S, H, H, scale, query + r * H, keys + b * S * H, lens[b],
                    values + b * S * H, weights + (b * max_steps + t) * S, attentional + r * H);
      }
    } else {
      parts_step(&products, parts, active, S, H, K, t, max_steps, query, keys, values, lens, rows,
                 coverage, weights, attentional, scratch, spans);
    }
    /* attentional (A, H) = tanh(W_c1 c + h W_c2^T), then logits (A, V) = b_s + a W_s^T. */
    step_rows(&products, &products.W_c2, active, NULL, 1, query, attentional);
    seq2seq_tanh(active * H, attentional);
    if (W_if != NULL) memcpy(feed, attentional, active * H * sizeof(float)); /* f_t = h~_t */
    step_rows(&products, &products.W_s, active, b_s, 0, attentional, logits);
    /* The most probable token as torch.argmax picks it (the first of equal ones; the first
       NaN, which it ranks above every number), and the rows that go on, moved up in order. */
    int64_t kept = 0;
    for (int64_t r = 0; r < active; ++r) {
      const float *restrict l_r = logits + r * V;
      int64_t best = 0;
      for (int64_t v = 1; v < V; ++v) {
        const int nan_first = l_r[v] != l_r[v] && l_r[best] == l_r[best];
        best = (l_r[v] > l_r[best] || nan_first) ? v : best;
      }
      const int64_t b = rows[r];
      tokens[b * max_steps + t] = best;
      if (best == eos || t + 1 >= limits[b]) continue;
      if (kept != r) {
        memcpy(h + kept * H, h + r * H, H * sizeof(float));
        if (W_if != NULL) memcpy(feed + kept * H, feed + r * H, H * sizeof(float));
        if (covers) memcpy(coverage + kept * S, coverage + r * S, S * sizeof(float));
      }
      rows[kept] = b;
      prev[kept] = best;
      ++kept;
    }
    active = kept;
    if (active == 0) {
      steps = t + 1;
      break;
    }
  }
  step_weight *packed[] = {&products.W_if, &products.W_hh, &products.W_q,  &products.W_a,
                           &products.W_p,  &products.W_c1, &products.W_c2, &products.W_s};
  for (size_t i = 0; i < sizeof packed / sizeof *packed; ++i) free(packed[i]->panels);
  return steps;
}

/* Dropout's keep mask (seq2seq/dropout.py): mask[i] = scale where the top 16 bits of output i of
   SplitMix64 seeded with `seed` are at least `dropped`, else 0. Output i is
   mix(seed + (i + 1) * GAMMA) (seq2seq/splitmix.py), a pure function of (seed, i), so the
   elements are independent: the loop vectorises (64-bit lanes) and splits over the threads, and
   the mask does not depend on their number. */
static inline uint64_t splitmix64_at(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void seq2seq_dropout_mask(int64_t n, uint64_t seed, int64_t dropped, float scale,
                          float *restrict mask) {
#pragma omp parallel for schedule(static) if (n >= 16 * PARALLEL_MIN)
  for (int64_t start = 0; start < n; start += 4096) {
    const int64_t end = start + 4096 < n ? start + 4096 : n;
#pragma omp simd
    for (int64_t i = start; i < end; ++i) {
      const int64_t level = (int64_t)(splitmix64_at(seed, (uint64_t)i) >> 48); /* 0..65535 */
      mask[i] = level >= dropped ? scale : 0.0f;
    }
  }
}
