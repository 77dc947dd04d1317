#include "python/bindings.h"

namespace pycoll::python {

void bind_nccl(pybind11::module_& m) {
  (void)m;
}

}  // namespace pycoll::python
