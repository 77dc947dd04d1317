// The randomized Hadamard rotation on the CPU (kernels/rotation.h): every block of every part, in place.
#pragma once

#include <cstddef>
#include <cstdint>

namespace pycoll::cpu {

// Rotates x, the parts[0..n_parts) elements one after another, each cut in blocks of `block` elements
// from its start: forward (inverse = false) or back. The same bits as the GPU kernel (cuda::rotate).
void rotate(float* x, const uint64_t* parts, size_t n_parts, uint32_t block, bool inverse);

}  // namespace pycoll::cpu
