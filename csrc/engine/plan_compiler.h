// Plans and grouped programs as the Python layer builds them (the op table of pycoll/algorithms/plan.py,
// the program of pycoll/algorithms/grouped.py), checked and turned into what the executors run. Plain
// C++: the bindings (csrc/python/) hand the numpy arrays over as Int64Array views.
#pragma once

#include <cstdint>
#include <memory>

#include "engine/grouped_executor.h"
#include "engine/plan.h"

namespace pycoll {

// A C-contiguous int64 array, borrowed for the duration of a call: 1-D (size elements) or 2-D (rows x
// cols, row-major).
struct Int64Array {
  const int64_t* data = nullptr;
  int ndim = 1;
  int64_t rows = 0;  // shape[0]
  int64_t cols = 1;  // shape[1] (2-D only)
  int64_t size = 0;  // number of elements

  int64_t operator()(int64_t i) const { return data[i]; }
  int64_t operator()(int64_t r, int64_t c) const { return data[r * cols + c]; }
};

// Number of columns of the op table (pycoll/algorithms/plan.py OP_COLUMNS).
inline constexpr int kPlanColumns = 11;

// One rank's plan: `table` is [n_ops, kPlanColumns] (counts and offsets in elements of `itemsize`
// bytes), `starts` the index of each step's first op followed by n_ops. Every op is checked (kind,
// peers, buffers, bounds); throws Error(kInternal) on a bad plan. `coded`: the plan is for a codec (its
// offsets are float32 elements on block boundaries); only such a plan runs with one. `distinct`: INPUT and
// OUTPUT never alias (an out-of-place collective; NativePlan::distinct). `result_count` > 0: the plan runs in
// place on a copy of the caller's input, and the caller's output is its elements [result_off, +result_count).
std::shared_ptr<NativePlan> compile_plan(const Int64Array& table, const Int64Array& starts, int64_t itemsize,
                                         int64_t input_count, int64_t output_count, int rank, int world,
                                         bool coded = false, bool distinct = false, int64_t result_off = 0,
                                         int64_t result_count = 0);

// The arrays of a grouped program (pycoll/algorithms/grouped.py): actions is [n, 2] (action code, op).
struct ProgramArrays {
  Int64Array actions, msg_bytes, recv_stage, send_stage, work_stage;
  int64_t staging_bytes = 0;
};

// A grouped program for one compiled plan, validated against it (validate_program).
std::shared_ptr<GroupedProgram> compile_program(const NativePlan& plan, const ProgramArrays& arrays);

}  // namespace pycoll
