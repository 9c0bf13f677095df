/* The Muon optimizer's math on the backend op interface (kernels/ops.h), so the same code runs
 * on the CPU reference and on CUDA. For one matrix weight W with gradient g:
 *   M = mu M + gs g               (momentum; gs the clipping scale)
 *   U = nesterov ? gs g + mu M : M
 *   O = NewtonSchulz(U)           (roughly the orthogonal factor: U = P S Q^T gives O ~ P Q^T)
 *   W = W (1 - lr wd) - lr scale O,  scale = 0.2 sqrt(max(rows, cols))
 * The element-wise parts (direction, apply) work on any shard of the matrix; the
 * orthogonalization needs the whole matrix (docs/training.md, "Muon: the math"). */
#ifndef MC_TRAIN_MUON_H
#define MC_TRAIN_MUON_H

#include <stdint.h>

#include "kernels/ops.h"

/* Floats of backend scratch mc_muon_orthogonalize needs for a rows x cols matrix. */
int64_t mc_muon_work_floats(int rows, int cols);

/* In place: X (rows x cols, row-major, backend memory) <- NS_steps(X / (||X||_F + 1e-7)), the
 * quintic Newton-Schulz iteration with the standard coefficients a=3.4445, b=-4.7750, c=2.0315:
 *   A = X X^T;  B = b A + c A A;  X = a X + B X   (repeated `steps` times)
 * computed on the Gram matrix of the smaller side (when rows > cols, the same on X^T without a
 * transposed copy: A = X^T X, X = a X + X B). work: mc_muon_work_floats floats of backend
 * memory. Deterministic: the same inputs give the same bits on a backend. One host sync (the
 * norm). Failures are the backend's (recorded, returned by its sync). */
void mc_muon_orthogonalize(mc_backend *be, float *X, int rows, int cols, int steps, float *work);

/* The shape-aware scale of the update: 0.2 * sqrt(max(rows, cols)) (Moonshot's "Muon is
 * scalable", which makes the update's RMS match AdamW's, so Muon shares AdamW's learning rate
 * and weight decay). */
double mc_muon_scale(int rows, int cols);

/* Element-wise parts on a shard of n elements (backend memory):
 *   M = mu M + gs g;  U = nesterov ? gs g + mu M : M     (gs: gradient scale, clipping)
 * U may be g itself (the gradient buffer becomes the direction), or M without nesterov. */
void mc_muon_direction(mc_backend *be, float *M, const float *g, float *U, int64_t n, float mu, int nesterov,
                       float gs);

/* W = W (1 - lr wd) - lr scale O; when w_bf16 != NULL also w_bf16 = bf16(W) (be->to_bf16). */
void mc_muon_apply(mc_backend *be, float *W, const float *O, int64_t n, float lr, float wd, float scale,
                   mc_bf16 *w_bf16);

#endif
