// The kernels of csrc/cuda/kernels.h on raw pointers (Python ints), with the arguments pycoll._C.cuda
// (device memory, a real GPU) and pycoll._emulated_kernels (host memory, the kernels run by the CPU
// emulation) both take: one set of definitions for the two modules, so that the tests run the same
// calls against either. `check_pointers` is called before each launch with every non-null pointer and
// its name (the GPU module checks that each is device memory of the current device).
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include "cuda/kernels.h"
#include "pycoll/errors.h"

namespace pycoll::python {

using PointerList = std::initializer_list<std::pair<uintptr_t, const char*>>;
using CheckPointers = void (*)(PointerList);

// A stream handed in from Python as an int (0: the legacy default stream).
inline cudaStream_t as_stream(uintptr_t s) {
  return reinterpret_cast<cudaStream_t>(s);
}

inline void def_kernels(pybind11::module_& c, CheckPointers check_pointers) {
  namespace py = pybind11;
  c.def(
      "reduce",
      [check_pointers](int dtype, int op, uintptr_t dst, uintptr_t dst2, uintptr_t a, uintptr_t b, size_t n,
                       int avg_divisor, uintptr_t stream) {
        if (dtype < 0 || dtype >= kNumDTypes)
          throw Error(ErrorKind::kInvalidUsage, "unknown dtype code " + std::to_string(dtype));
        if (op < 0 || op >= kNumRedOps) throw Error(ErrorKind::kInvalidUsage, "unknown op code " + std::to_string(op));
        if (n == 0) return;
        py::gil_scoped_release release;
        check_pointers({{dst, "dst"}, {dst2, "dst2"}, {a, "a"}, {b, "b"}});
        cuda::reduce(static_cast<DType>(dtype), static_cast<RedOp>(op), reinterpret_cast<void*>(dst),
                     reinterpret_cast<void*>(dst2), reinterpret_cast<const void*>(a), reinterpret_cast<const void*>(b),
                     n, avg_divisor, as_stream(stream));
      },
      py::arg("dtype"), py::arg("op"), py::arg("dst"), py::arg("dst2"), py::arg("a"), py::arg("b"), py::arg("n"),
      py::arg("avg_divisor") = 0, py::arg("stream") = 0,
      "dst[i] = a[i] (+) b[i] (also into dst2 unless 0), / avg_divisor when > 0; enqueued on `stream`");

  c.def(
      "encode",
      [check_pointers](int kind, uint32_t block, int rounding, uintptr_t src, uintptr_t out, size_t n,
                       uintptr_t residual, double residual_scale, uintptr_t decoded, uintptr_t out2, uint64_t index,
                       uint32_t key, uintptr_t stream) {
        const cuda::CodecSpec spec{static_cast<codec::Kind>(kind), block, static_cast<codec::Rounding>(rounding)};
        cuda::check_codec(spec);
        codec::EncodeArgs a;
        a.src = reinterpret_cast<const float*>(src);
        a.out = reinterpret_cast<uint8_t*>(out);
        a.n = n;
        a.residual = reinterpret_cast<float*>(residual);
        a.residual_scale = static_cast<float>(residual_scale);
        a.decoded = reinterpret_cast<float*>(decoded);
        a.out2 = reinterpret_cast<uint8_t*>(out2);
        a.index = index;
        a.key = key;
        py::gil_scoped_release release;
        if (n > 0)
          check_pointers({{src, "src"}, {out, "out"}, {residual, "residual"}, {decoded, "decoded"}, {out2, "out2"}});
        cuda::encode(spec, a, as_stream(stream));
      },
      py::arg("kind"), py::arg("block"), py::arg("rounding"), py::arg("src"), py::arg("out"), py::arg("n"),
      py::arg("residual") = 0, py::arg("residual_scale") = 1.0, py::arg("decoded") = 0, py::arg("out2") = 0,
      py::arg("index") = 0, py::arg("key") = 0, py::arg("stream") = 0,
      "encodes n float32 values at src into out (see pycoll._C.Codec.encode); enqueued on `stream`");

  c.def(
      "decode",
      [check_pointers](int kind, uint32_t block, int rounding, uintptr_t data, uintptr_t dst, size_t n, uintptr_t acc,
                       uintptr_t residual, int divisor, uintptr_t stream) {
        if (residual && !acc) throw Error(ErrorKind::kInvalidUsage, "residual needs acc");
        const cuda::CodecSpec spec{static_cast<codec::Kind>(kind), block, static_cast<codec::Rounding>(rounding)};
        cuda::check_codec(spec);
        codec::DecodeArgs a;
        a.in = reinterpret_cast<const uint8_t*>(data);
        a.dst = reinterpret_cast<float*>(dst);
        a.n = n;
        a.acc = reinterpret_cast<const float*>(acc);
        a.residual = reinterpret_cast<float*>(residual);
        a.divisor = divisor;
        py::gil_scoped_release release;
        if (n > 0) check_pointers({{data, "data"}, {dst, "dst"}, {acc, "acc"}, {residual, "residual"}});
        cuda::decode(spec, a, as_stream(stream));
      },
      py::arg("kind"), py::arg("block"), py::arg("rounding"), py::arg("data"), py::arg("dst"), py::arg("n"),
      py::arg("acc") = 0, py::arg("residual") = 0, py::arg("divisor") = 0, py::arg("stream") = 0,
      "dst = [acc (+ residual) +] decoded, then / divisor (see pycoll._C.Codec.decode); enqueued on `stream`");

  c.def(
      "rotate",
      [check_pointers](uintptr_t x, uint64_t n, uint64_t part, uint32_t block, bool inverse, uintptr_t stream) {
        py::gil_scoped_release release;
        if (n > 0) check_pointers({{x, "x"}});
        cuda::rotate(reinterpret_cast<float*>(x), n, part, block, inverse, as_stream(stream));
      },
      py::arg("x"), py::arg("n"), py::arg("part"), py::arg("block"), py::arg("inverse") = false, py::arg("stream") = 0,
      "rotates n float32 values at x in place (see pycoll._C.rotate): parts of `part` elements, blocks of `block`; "
      "enqueued on `stream`");
}

}  // namespace pycoll::python
