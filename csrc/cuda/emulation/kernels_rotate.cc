// csrc/cuda/rotate.cu, unchanged, compiled by the host compiler for the CPU emulation (cuda_emulation.h).
#include "cuda/emulation/cuda_emulation.h"
// (after the emulation header, which must come first)
#include "cuda/rotate.cu"
