// Which instruction set the CPU loops use: each loop file is compiled twice (baseline and AVX2/F16C,
// see CMakeLists.txt) and the dispatchers pick one at run time with this check.
#pragma once

namespace pycoll::cpu {

inline bool have_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  return yes;
#else
  return false;
#endif
}

}  // namespace pycoll::cpu
