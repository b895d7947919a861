// CPU reference kernels: the umbrella header of every op (one op per header
// beside it, named as its CUDA counterpart in kernels/cuda/; docs/KERNELS.md
// maps them).
//
// Each op is a template on the scalar type so the finite-difference tests can
// run it in double; the model instantiates it with float. Conventions (as in
// llm.c): tensors are contiguous row-major; shapes are given as ints;
// every *_backward ACCUMULATES (+=) into the gradients it writes (input and
// parameter gradients alike), so callers zero gradient buffers first and a
// tensor used twice just receives two contributions (the overwrite flags of
// matmul_backward, swiglu_backward, rope_backward, kv_shift_backward and
// attention_backward let the first writer of a scratch gradient skip that
// zeroing pass). A null gradient pointer
// means "not needed". All ops are deterministic for a fixed thread count:
// OpenMP splits work so that no two threads add into the same element, and
// every reduction runs in a fixed order. Offsets are computed in size_t (att
// is B*Hq*T*T and can pass 2^31). No heap allocation per call: scratch is
// small fixed stack arrays, the buffers the caller passes, or (attention)
// per-thread buffers that grow once to the largest size asked.
//
// Layouts: activations [B, T, H, D] = [B*T rows, H*D columns]; linear weights
// [out, in] as in Hugging Face (y = x W^T); attention probabilities [B, Hq, T, T].
#pragma once

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/kv_shift.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/residual.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rope.h"
#include "kernels/cpu/shift_gate.h"
#include "kernels/cpu/swiglu.h"
#include "kernels/cpu/zero_fill.h"
