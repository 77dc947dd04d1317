// The randomized Hadamard rotation on the CPU (kernels/rotation.h): every block of every part, in place.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycoll::cpu {

// Rotates x, the parts[0..n_parts) elements one after another, each cut in blocks of `block` elements
// from its start: forward (inverse = false) or back. The same bits as the GPU kernel (cuda::rotate).
void rotate(float* x, const uint64_t* parts, size_t n_parts, uint32_t block, bool inverse);

// D's sign bit (0 or 0x80000000) of each of the kMaxRotationBlock positions of a piece (kernels/rotation.h),
// for the vector loops.
const uint32_t* rotation_sign_masks();

}  // namespace pycoll::cpu
