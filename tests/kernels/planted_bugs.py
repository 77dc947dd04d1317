"""Plants known bugs in a copy of the CUDA kernels, one at a time, and checks that the kernel sweep catches
each (both builds: AddressSanitizer + UBSan, and the shadow map), and that it passes a change that is
valid CUDA. A check of the sweep itself, for after a change to it or to the kernels; not part of CI (it
builds the sweep once per bug: about 10 minutes on 2 cores).

    python tests/kernels/planted_bugs.py [M1 M4 ...]     # all by default

A bug whose text no longer matches the kernels is reported as stale (the kernels changed: update it).
Exit status 1 when a bug went through, a valid change was reported, or a bug is stale.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (name, file, text, replacement, is a bug)
PLANTED = [
    ("M1 reduce: the vector loop one vector past the end",
     "csrc/cuda/reduce.cu",
     "      if (i < p.nvec) {\n        x[u] = va[i];",
     "      if (i <= p.nvec) {\n        x[u] = va[i];",
     True),
    ("M2 fp16 / bf16 encode: a grid-stride step of one grid instead of two",
     "csrc/cuda/codec.cu",
     "t0 < items; t0 += 2 * threads) {\n    const size_t t1 = t0 + threads;\n    size_t i0 = 0, i1 = 0;\n"
     "    uint32_t k0 = 0, k1 = 0;\n    cast_item(p, a.n, t0, i0, k0);\n"
     "    const bool vec0 = p.vec && k0 == 4 && t0 >= p.head;\n    float x0[4]",
     "t0 < items; t0 += threads) {\n    const size_t t1 = t0 + threads;\n    size_t i0 = 0, i1 = 0;\n"
     "    uint32_t k0 = 0, k1 = 0;\n    cast_item(p, a.n, t0, i0, k0);\n"
     "    const bool vec0 = p.vec && k0 == 4 && t0 >= p.head;\n    float x0[4]",
     True),
    ("M3 int8 / int4 encode: the absmax butterfly skips its first step",
     "csrc/cuda/codec.cu",
     "for (uint32_t off = p.group >> 1; off > 0;",
     "for (uint32_t off = p.group >> 2; off > 0;",
     True),
    ("M4 int8 / int4 encode: groups past the last block write too",
     "csrc/cuda/codec.cu",
     "    if (!active) continue;\n",
     "\n",
     True),
    ("M5 reduce: the vector path without checking dst's alignment",
     "csrc/cuda/reduce.cu",
     "if (head < n && at16(dst) && at16(dst2) && at16(b))",
     "if (head < n && at16(dst2) && at16(b))",
     True),
    ("M6 int8 / int4 encode: a per-group shuffle mask shifted by the group index",
     "csrc/cuda/codec.cu",
     "amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));",
     "amax = max(amax, __shfl_xor_sync(p.group == 32 ? 0xffffffffu : ((1u << p.group) - 1u) << l.gi, "
     "amax, off));",
     True),
    ("M7 fp16 / bf16: uint2 wire stores without checking the wire's alignment",
     "csrc/cuda/codec.cu",
     "  for (const uint8_t* w : wire) vec &= !w || detail::aligned(w + 2 * head, 8);\n",
     "",
     True),
    ("M8 int4 encode: a partial quad writes a byte per code",
     "csrc/cuda/codec.cu",
     "      for (uint32_t j = 0; 2 * j < k; ++j) {\n        payload[2 * q + j]",
     "      for (uint32_t j = 0; j < k; ++j) {\n        payload[2 * q + j]",
     True),
    ("M9 stochastic rounding: the element index without the block's offset",
     "csrc/cuda/codec.cu",
     "codec::random_bits(a.key, a.index + at + 4 * q + j)",
     "codec::random_bits(a.key, a.index + 4 * q + j)",
     True),
    ("M10 int8 / int4 decode: lanes step by kCache quads, not kCache groups",
     "csrc/cuda/codec.cu",
     "q0 < nq; q0 += kCache * p.group)",
     "q0 < nq; q0 += kCache)",
     True),
    ("M11 reduce: the scalar tail starts one element late",
     "csrc/cuda/reduce.cu",
     "  const size_t tail_begin = p.head + p.nvec * kVec;",
     "  const size_t tail_begin = p.head + p.nvec * kVec + (p.n > p.head + p.nvec * kVec ? 1 : 0);",
     True),
    ("M12 decode: the residual zeroed though there is no acc",
     "csrc/cuda/codec.cu",
     "  if (a.acc && a.residual) {\n    const float zero[4]",
     "  if (a.residual) {\n    const float zero[4]",
     True),
    ("V1 int8 / int4 encode: idle groups return before the shuffle (valid CUDA)",
     "csrc/cuda/codec.cu",
     "    for (uint32_t off = p.group >> 1; off > 0; off >>= 1) "
     "amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));\n    if (!active) continue;\n",
     "    if (!active) continue;\n    for (uint32_t off = p.group >> 1; off > 0; off >>= 1) "
     "amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, off));\n",
     False),
]


def verdict(build: Path, exe: str) -> str:
    """What one sweep said: 'passed', or 'caught: ...'."""
    p = subprocess.run([str(build / exe), "--quick"], capture_output=True, text=True, timeout=1800)
    if p.returncode == 0:
        return "passed"
    text = p.stdout + p.stderr
    m = re.search(r"FAILED: (.*)", text)
    m = m or re.search(r"(ERROR: AddressSanitizer: \S+|runtime error: [^\n]*)", text)
    return "caught: " + (m.group(1)[:240] if m else f"exit {p.returncode}")


def main(only: list[str]) -> int:
    failures = 0
    with tempfile.TemporaryDirectory(prefix="pycoll-planted-") as scratch:
        for name, path, text, replacement, is_bug in PLANTED:
            if only and name.split()[0] not in only:
                continue
            tree = Path(scratch) / "tree"
            shutil.rmtree(tree, ignore_errors=True)
            for d in ("csrc", "cmake", "tests/kernels"):
                shutil.copytree(ROOT / d, tree / d)
            source = tree / path
            code = source.read_text()
            if text not in code:
                print(f"== {name}: STALE (its text is no longer in {path})")
                failures += 1
                continue
            source.write_text(code.replace(text, replacement, 1))
            build = Path(scratch) / "build"  # afresh: the copies keep their sources' times
            shutil.rmtree(build, ignore_errors=True)
            subprocess.run(["cmake", "-S", str(tree / "tests/kernels"), "-B", str(build)], check=True,
                           capture_output=True)
            subprocess.run(["cmake", "--build", str(build), "-j", "2"], check=True, capture_output=True)
            said = {exe: verdict(build, exe) for exe in ("kernel_sweep", "kernel_sweep_shadow")}
            ok = all(v.startswith("caught") for v in said.values()) if is_bug else all(
                v == "passed" for v in said.values())
            failures += not ok
            print(f"== {name}: {'ok' if ok else 'WRONG'}")
            for exe, v in said.items():
                print(f"   {exe}: {v}")
            sys.stdout.flush()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
