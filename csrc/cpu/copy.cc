#include "cpu/copy.h"

#include <cstdint>
#include <cstring>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace pycoll::cpu {

void stream_copy(void* dst, const void* src, size_t n) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16;
  if (head > n) head = n;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);
#else
  std::memcpy(dst, src, n);
#endif
}

void copy_twice(void* dst, void* also, const void* src, size_t n, bool stream) {
#if defined(__SSE2__)
  auto* d = static_cast<uint8_t*>(dst);
  auto* a = static_cast<uint8_t*>(also);
  auto* s = static_cast<const uint8_t*>(src);
  size_t head = stream ? (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16 : 0;  // streaming stores: aligned
  if (head > n) head = n;
  std::memcpy(d, s, head);
  std::memcpy(a, s, head);
  d += head;
  a += head;
  s += head;
  n -= head;
  for (; n >= 64; n -= 64, d += 64, a += 64, s += 64) {
    __m128i v[4];
    for (int k = 0; k < 4; ++k) v[k] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16 * k));
    for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(a + 16 * k), v[k]);
    if (stream) {
      for (int k = 0; k < 4; ++k) _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
    } else {
      for (int k = 0; k < 4; ++k) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + 16 * k), v[k]);
    }
  }
  std::memcpy(d, s, n);
  std::memcpy(a, s, n);
#else
  (void)stream;
  std::memcpy(dst, src, n);
  std::memcpy(also, src, n);
#endif
}

void stream_fence() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

}  // namespace pycoll::cpu
