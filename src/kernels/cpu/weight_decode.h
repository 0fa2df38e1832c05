/* kernels/cpu/weight_decode — one row of a bound weight (io/weight.h) decoded to fp32, for the
 * reference paths, tools and tests (the ops decode on the fly instead). */
#ifndef DSV4_KERNELS_CPU_WEIGHT_DECODE_H
#define DSV4_KERNELS_CPU_WEIGHT_DECODE_H

#include <stdint.h>
#include "io/weight.h"

/* Decodes row r (k values) to fp32: exactly, except EXL3 (rotations in double, rounded once). */
void dsv4_weight_row(const dsv4_weight *w, int64_t r, float *out);

#endif
