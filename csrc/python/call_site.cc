#include "python/call_site.h"

#include <Python.h>
#include <frameobject.h>

// CPython 3.11 and 3.12: the calling thread's interpreter frames are read where they are, without making a
// frame object for each (the public PyEval_GetFrame / PyFrame_GetBack make one per frame, which cost
// about 0.5 us per collective); other versions take the public way.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030D0000
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#define PYCOLL_INTERPRETER_FRAMES 1
#endif

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>

#include "engine/flight_recorder.h"

namespace pycoll::python {

namespace {

// Each table holds a reference to every code object it keys (so that its address is not reused by another
// while it is a key); past kMaxCached keys, nothing more is cached (the answer is worked out every time).
constexpr size_t kMaxCached = 1 << 16;

struct SiteKey {
  PyCodeObject* code;
  int lasti;
  bool operator==(const SiteKey& o) const { return code == o.code && lasti == o.lasti; }
};
struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.code) ^ (static_cast<size_t>(k.lasti) * 0x9e3779b97f4a7c15ull);
  }
};

std::vector<std::string> g_internal;  // all guarded by the GIL
std::unordered_map<PyCodeObject*, bool> g_code_internal;
std::unordered_map<SiteKey, int, SiteKeyHash> g_sites;

std::string utf8(PyObject* s) {
  const char* p = s && PyUnicode_Check(s) ? PyUnicode_AsUTF8(s) : nullptr;
  if (!p) {
    PyErr_Clear();
    return "?";
  }
  return p;
}

// In front of the tables: the last answers, by a hash of their key (a collective's call walks the same two
// or three frames every time: one probe of an array each, not a hash table's).
constexpr size_t kFront = 64;
struct FrontInternal {
  PyCodeObject* code = nullptr;
  bool internal = false;
};
struct FrontSite {
  PyCodeObject* code = nullptr;
  int lasti = -1, id = -1;
};
FrontInternal g_front_internal[kFront];
FrontSite g_front_site[kFront];

// In front of those, in one cache line: what the last walks met, by depth. Each collective's call finds its
// answer here by touching this one line (the arrays above spread a walk's answers over several lines, and
// between two collectives the interpreter pushes them out of the first-level cache; a rank that shares its
// core with others finds every line cold after each switch). Six depths: pycoll.allreduce's own frames down
// to the native call. Like the arrays, it holds only code objects the tables hold.
constexpr int kLastDepth = 6;
struct alignas(64) LastWalk {
  PyCodeObject* internal[kLastDepth] = {};  // an internal code object met at this depth
  PyCodeObject* site_code = nullptr;        // the last call site
  int site_lasti = -1, site_id = -1;
};
static_assert(sizeof(LastWalk) == 64, "the last walk's answers fill one cache line");
LastWalk g_last;

size_t front_slot(const void* p, int salt = 0) {
  return ((reinterpret_cast<uintptr_t>(p) >> 4) ^ static_cast<uintptr_t>(salt)) % kFront;
}

bool internal_slow(PyCodeObject* code);

// Only what the tables hold goes in front: a code object they hold a reference to stays alive, so its
// address is never another's.
bool is_internal(PyCodeObject* code) {
  FrontInternal& f = g_front_internal[front_slot(code)];
  if (f.code == code) return f.internal;
  const bool internal = internal_slow(code);
  if (g_code_internal.count(code)) f = FrontInternal{code, internal};
  return internal;
}

bool internal_slow(PyCodeObject* code) {
  auto it = g_code_internal.find(code);
  if (it != g_code_internal.end()) return it->second;
  const std::string file = utf8(code->co_filename);
  bool internal = false;
  for (const std::string& prefix : g_internal) internal = internal || file.compare(0, prefix.size(), prefix) == 0;
  if (g_code_internal.size() < kMaxCached) {
    Py_INCREF(code);
    g_code_internal.emplace(code, internal);
  }
  return internal;
}

int site_slow(PyCodeObject* code, int lasti);

int site_of(PyCodeObject* code, int lasti) {
  FrontSite& f = g_front_site[front_slot(code, lasti)];
  if (f.code == code && f.lasti == lasti) return f.id;
  const int id = site_slow(code, lasti);
  if (g_sites.count(SiteKey{code, lasti})) f = FrontSite{code, lasti, id};
  return id;
}

int site_slow(PyCodeObject* code, int lasti) {
  const SiteKey key{code, lasti};
  auto it = g_sites.find(key);
  if (it != g_sites.end()) return it->second;
  // `lasti`: the byte offset of the frame's instruction, or before 3.11 its line as -1 - line.
  const int line = lasti >= 0 ? PyCode_Addr2Line(code, lasti) : -1 - lasti;
#if PY_VERSION_HEX >= 0x030B0000
  PyObject* name = code->co_qualname;
#else
  PyObject* name = code->co_name;
#endif
  const std::string text = utf8(code->co_filename) + ":" + std::to_string(line) + " in " + utf8(name);
  const int id = trace::FlightRecorder::get().site_id(text);
  if (g_sites.size() < kMaxCached) {
    Py_INCREF(code);
    g_sites.emplace(key, id);
  }
  return id;
}

}  // namespace

void add_internal_paths(const std::vector<std::string>& prefixes) {
  for (const std::string& p : prefixes) g_internal.push_back(p);
  for (auto& [code, internal] : g_code_internal) Py_DECREF(code);
  g_code_internal.clear();  // decided again against the new list
  for (FrontInternal& f : g_front_internal) f = FrontInternal{};
  g_last = LastWalk{};
}

int call_site() {
  if (!trace::FlightRecorder::get().on()) return -1;  // the line the record's begin reads next
#ifdef PYCOLL_INTERPRETER_FRAMES
  int depth = 0;
  for (_PyInterpreterFrame* f = PyThreadState_Get()->cframe->current_frame; f && depth < 64; f = f->previous) {
#if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK) continue;  // the interpreter's own entry frames
#endif
    PyCodeObject* const code = f->f_code;
    const int at = depth++;
    if (at < kLastDepth && g_last.internal[at] == code) continue;
    // The last call site again (a frame still being set up is before its first instruction: never a site).
    const int lasti = _PyInterpreterFrame_LASTI(f) * static_cast<int>(sizeof(_Py_CODEUNIT));
    if (code == g_last.site_code && lasti == g_last.site_lasti) return g_last.site_id;
    // pycoll's own frames first: the test of whether a frame is only being set up reads its code object's
    // header, which the interpreter's hot loop does not touch.
    if (is_internal(code)) {
      if (at < kLastDepth && g_front_internal[front_slot(code)].code == code) g_last.internal[at] = code;
      continue;
    }
    if (_PyFrame_IsIncomplete(f)) continue;
    const int id = site_of(code, lasti);
    const FrontSite& front = g_front_site[front_slot(code, lasti)];
    if (front.code == code && front.lasti == lasti) {
      g_last.site_code = code;
      g_last.site_lasti = lasti;
      g_last.site_id = id;
    }
    return id;
  }
  return -1;
#else
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  int id = -1;
  for (int depth = 0; f && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    const bool internal = is_internal(code);
#if PY_VERSION_HEX >= 0x030B0000
    if (!internal) id = site_of(code, PyFrame_GetLasti(f));
#else
    if (!internal) id = site_of(code, -1 - PyFrame_GetLineNumber(f));  // before 3.11: the line itself
#endif
    Py_DECREF(code);
    if (!internal) break;
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return id;
#endif
}

}  // namespace pycoll::python
