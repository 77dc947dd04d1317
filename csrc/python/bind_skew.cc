// The skew recorder of a native communicator (csrc/engine/skew.h), as pycoll/skew.py reads it.
#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "engine/communicator.h"
#include "engine/skew.h"
#include "python/bindings.h"

namespace py = pybind11;

namespace pycoll::python {
namespace {

template <class T>
py::array_t<T> array(const std::vector<T>& v, std::vector<py::ssize_t> shape) {
  py::array_t<T> a(shape);
  std::copy(v.begin(), v.end(), a.mutable_data());
  return a;
}

py::dict snapshot(Communicator& c) {
  const SkewSnapshot s = c.skew().snapshot();
  const py::ssize_t k = s.kinds, w = s.world, n = static_cast<py::ssize_t>(s.recent_seq.size());
  py::dict d;
  d["world"] = s.world;
  d["recorded"] = s.recorded;
  d["unmatched"] = s.unmatched;
  d["unsynced"] = s.unsynced;
  d["count"] = array(s.count, {k, w});
  d["last"] = array(s.last, {k, w});
  d["sum_ns"] = array(s.sum_ns, {k, w});
  d["max_ns"] = array(s.max_ns, {k, w});
  d["inflicted_ns"] = array(s.inflicted_ns, {k, w});
  d["suffered_ns"] = array(s.suffered_ns, {k, w});
  d["hist"] = array(s.hist, {k, w, s.buckets});
  d["recent_seq"] = array(s.recent_seq, {n});
  d["recent_kind"] = array(s.recent_kind, {n});
  d["recent_last"] = array(s.recent_last, {n});
  d["recent_late_ns"] = array(s.recent_late_ns, {n, w});
  d["offset_ns"] = array(s.offset_ns, {w});
  d["uncertainty_ns"] = array(s.uncertainty_ns, {w});
  return d;
}

}  // namespace

void bind_skew(py::module_& m, py::class_<Communicator>& cls) {
  cls.def("skew_snapshot", &snapshot, "the skew recorder's totals, recent collectives and clock (a dict)")
      .def(
          "skew_flush", [](Communicator& c) { c.skew().flush(c.transport()); },
          "processes the collectives whose stamps have all arrived")
      .def(
          "skew_set_domains", [](Communicator& c, const std::vector<int64_t>& d) { c.skew().set_domains(d); },
          py::arg("domains"))
      .def(
          "skew_add_notice",
          [](Communicator& c, int64_t late_ns, uint32_t window) { return c.skew().add_notice(late_ns, window); },
          py::arg("late_ns"), py::arg("window"))
      .def(
          "skew_remove_notice", [](Communicator& c, int id) { c.skew().remove_notice(id); }, py::arg("id"))
      .def(
          "skew_take_events",
          [](Communicator& c) {
            py::list out;
            for (const SkewEvent& e : c.skew().take_events())
              out.append(py::make_tuple(e.notice, e.rank, e.seq, e.window, e.mean_late_ns, e.inflicted_ns));
            return out;
          },
          "[(notice, rank, seq, window, mean_late_ns, inflicted_ns)] since the last call")
      .def_property_readonly("skew_enabled", [](Communicator& c) { return c.skew().enabled(); })
      .def(
          "skew_set_recording", [](Communicator& c, bool on) { c.skew().set_enabled(on); }, py::arg("on"),
          "stops or resumes recording on this rank (to measure what it costs)");
  m.def("skew_bucket_floor", &SkewRecorder::bucket_floor, py::arg("bucket"),
        "the smallest lateness (ns) in a bucket of the skew histogram");
  m.def("skew_bucket", &SkewRecorder::bucket, py::arg("ns"), "the skew histogram's bucket of a lateness (ns)");
}

}  // namespace pycoll::python
