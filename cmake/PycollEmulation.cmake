# The CUDA kernels of csrc/cuda compiled by the host compiler for the CPU emulation of the CUDA execution
# model (csrc/cuda/emulation/). It needs the CUDA toolkit's headers (for the real cuda_runtime_api.h and
# vector_types.h), not nvcc and not a GPU. One home for how that build is made, used by CMakeLists.txt (the
# module pycoll._emulated_kernels) and tests/kernels/CMakeLists.txt (the sanitizer and shadow-map sweeps).
#
#   pycoll_find_cuda_headers(<var>)
#       <var> = the directory holding cuda_runtime_api.h (CUDA_HOME, CUDA_PATH, /usr/local/cuda...), or a
#       false value when there is none.
#   pycoll_add_emulation(<target> [OPTIONS <flag>...] [KERNEL_OPTIONS <flag>...])
#       A static library: the emulation's runtime and scheduler, and the kernels (codec.cu, reduce.cu, rotate.cu, each
#       through a kernels_*.cc that includes it after cuda_emulation.h). OPTIONS go to every source,
#       KERNEL_OPTIONS to the kernels' only (the shadow-map build instruments their memory accesses).
#       Consumers get the include directories (csrc, csrc/include, the CUDA headers).
get_filename_component(PYCOLL_SOURCE_ROOT "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)

function(pycoll_find_cuda_headers out)
  find_path(PYCOLL_CUDA_INCLUDE_DIR cuda_runtime_api.h
    HINTS ENV CUDA_HOME ENV CUDA_PATH ENV CUDAToolkit_ROOT
    PATH_SUFFIXES include targets/x86_64-linux/include targets/sbsa-linux/include
    PATHS /usr/local/cuda /opt/cuda)
  set(${out} "${PYCOLL_CUDA_INCLUDE_DIR}" PARENT_SCOPE)
endfunction()

# As the host loops are built (CMakeLists.txt PYCOLL_CXX_OPTIONS: no FMA contraction, so the element code's
# spelled-out order holds), and -fno-strict-aliasing: CUDA code reads float arrays through float4 / uint4
# vectors, which the host compiler's type-based alias analysis would be free to reorder.
set(PYCOLL_EMULATION_OPTIONS -Wall -Wextra -Wno-unknown-pragmas -ffp-contract=off -fno-math-errno
  -fno-trapping-math -fno-strict-aliasing)

function(pycoll_add_emulation target)
  cmake_parse_arguments(ARG "" "" "OPTIONS;KERNEL_OPTIONS" ${ARGN})
  set(dir "${PYCOLL_SOURCE_ROOT}/csrc/cuda/emulation")
  set(includes "${PYCOLL_SOURCE_ROOT}/csrc/include" "${PYCOLL_SOURCE_ROOT}/csrc" "${PYCOLL_CUDA_INCLUDE_DIR}")
  add_library(${target}_kernels OBJECT "${dir}/kernels_codec.cc" "${dir}/kernels_reduce.cc" "${dir}/kernels_rotate.cc")
  add_library(${target} STATIC "${dir}/fiber.cc" "${dir}/runtime.cc" "${dir}/scheduler.cc"
    $<TARGET_OBJECTS:${target}_kernels>)
  foreach(t ${target} ${target}_kernels)
    target_include_directories(${t} PUBLIC ${includes})
    target_compile_options(${t} PRIVATE ${PYCOLL_EMULATION_OPTIONS} ${ARG_OPTIONS})
    set_target_properties(${t} PROPERTIES POSITION_INDEPENDENT_CODE ON CXX_VISIBILITY_PRESET hidden
      CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON)
  endforeach()
  # g++ cannot tell that the kernels read their second quad only where they loaded it (t1 < items).
  target_compile_options(${target}_kernels PRIVATE -Wno-maybe-uninitialized ${ARG_KERNEL_OPTIONS})
endfunction()
