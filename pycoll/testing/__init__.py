"""Test helpers that ship with pycoll (never imported by the library itself).

- :mod:`pycoll.testing.emulated_kernels`: pycoll's CUDA kernels run on the CPU, by an emulation of the CUDA
  execution model, with the calling convention of the CPU codecs.
"""
