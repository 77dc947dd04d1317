// Compiled with -mavx2 -mf16c on x86-64 (see CMakeLists.txt); only used when the CPU has AVX2.
#define PYCOLL_ISA_NS avx2
#include "cpu/rotation_loops.h"
