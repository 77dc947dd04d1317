// What the kernel test drivers share: a failure type, CHECK, and the list of self-tests.
#pragma once

#include <stdexcept>
#include <string>

namespace pycoll::kernel_tests {

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define CHECK(cond, what)                                                                                            \
  do {                                                                                                               \
    if (!(cond))                                                                                                     \
      throw ::pycoll::kernel_tests::Failure(std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " + (what) + \
                                            " (" #cond ")");                                                         \
  } while (0)

// The emulation's own tests (selftest.cc): returns how many ran; throws Failure on the first that fails.
int run_selftests();
// The shadow map's and the canaries' own tests (shadow_probes.cc, in the shadow build only): the same.
int run_shadow_selftests();

}  // namespace pycoll::kernel_tests
