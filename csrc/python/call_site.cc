#include "python/call_site.h"

#include <Python.h>
#include <frameobject.h>

#include <cstddef>
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

bool is_internal(PyCodeObject* code) {
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

int site_of(PyCodeObject* code, int lasti) {
  const SiteKey key{code, lasti};
  auto it = g_sites.find(key);
  if (it != g_sites.end()) return it->second;
  const int line = PyCode_Addr2Line(code, lasti);
  const std::string text = utf8(code->co_filename) + ":" + std::to_string(line) + " in " + utf8(code->co_qualname);
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
}

int call_site() {
  if (!trace::FlightRecorder::get().on()) return -1;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  int id = -1;
  for (int depth = 0; f && depth < 64; ++depth) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new reference
    const bool internal = is_internal(code);
    if (!internal) id = site_of(code, PyFrame_GetLasti(f));
    Py_DECREF(code);
    if (!internal) break;
    PyFrameObject* back = PyFrame_GetBack(f);  // new reference
    Py_DECREF(f);
    f = back;
  }
  Py_XDECREF(f);
  return id;
}

}  // namespace pycoll::python
