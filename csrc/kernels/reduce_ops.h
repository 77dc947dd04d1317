// Element-level reduction operators, shared by the CPU loops (csrc/cpu) and the CUDA kernels (csrc/cuda).
// Integers wrap on overflow exactly as numpy does (arithmetic is done in the unsigned type).
// Floating min/max propagate NaN like numpy.minimum / numpy.maximum.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/half.h"
#include "kernels/types.h"

namespace pycoll {

// How an element type is stored, and the type its reduction is computed in.
template <class T>
struct Elem {
  using storage = T;
  using compute = T;
  PYCOLL_HD static compute load(storage v) { return v; }
  PYCOLL_HD static storage store(compute v) { return v; }
};
template <>
struct Elem<half_bits> {
  using storage = uint16_t;
  using compute = float;
  PYCOLL_HD static compute load(storage v) { return half_to_float(v); }
  PYCOLL_HD static storage store(compute v) { return float_to_half(v); }
};
template <>
struct Elem<bf16_bits> {
  using storage = uint16_t;
  using compute = float;
  PYCOLL_HD static compute load(storage v) { return bf16_to_float(v); }
  PYCOLL_HD static storage store(compute v) { return float_to_bf16(v); }
};

template <class C>
PYCOLL_HD C wrap_add(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    using U = std::make_unsigned_t<C>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <class C>
PYCOLL_HD C wrap_mul(C a, C b) {
  if constexpr (std::is_integral_v<C>) {
    // promote to at least unsigned int so that small types do not multiply as signed int
    using U = std::conditional_t<(sizeof(C) < sizeof(unsigned)), unsigned, std::make_unsigned_t<C>>;
    return static_cast<C>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
  } else {
    return a * b;
  }
}

struct OpSum {
  template <class C>
  PYCOLL_HD static C apply(C a, C b) {
    return wrap_add(a, b);
  }
};
struct OpProd {
  template <class C>
  PYCOLL_HD static C apply(C a, C b) {
    return wrap_mul(a, b);
  }
};
struct OpMin {
  template <class C>
  PYCOLL_HD static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>)
      return (a < b || a != a) ? a : b;
    else
      return a < b ? a : b;
  }
};
struct OpMax {
  template <class C>
  PYCOLL_HD static C apply(C a, C b) {
    if constexpr (std::is_floating_point_v<C>)
      return (a > b || a != a) ? a : b;
    else
      return a > b ? a : b;
  }
};

// One element of a reduce, as the CPU loops and the CUDA kernels both compute it: a (+) b in the compute
// type, and for the finalize step of an average, that divided by the divisor (in the compute type too).
template <class E, class Op>
PYCOLL_HD typename Elem<E>::storage reduce_elem(typename Elem<E>::storage a, typename Elem<E>::storage b) {
  return Elem<E>::store(Op::apply(Elem<E>::load(a), Elem<E>::load(b)));
}
template <class E, class Op>
PYCOLL_HD typename Elem<E>::storage reduce_elem_div(typename Elem<E>::storage a, typename Elem<E>::storage b,
                                                    typename Elem<E>::compute div) {
  return Elem<E>::store(Op::apply(Elem<E>::load(a), Elem<E>::load(b)) / div);
}

}  // namespace pycoll
