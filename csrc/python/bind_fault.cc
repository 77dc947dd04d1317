// The fault plane's native side (csrc/fault/): the process's control listener and a plane's links, as
// pycoll/fault/listener.py and pycoll/fault/plane.py drive them. Every call that may wait releases the GIL.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "fault/links.h"
#include "fault/listener.h"
#include "python/bindings.h"
#include "python/gil.h"

namespace py = pybind11;

namespace pycoll::python {

void bind_fault(py::module_& m) {
  using fault::ControlLinks;
  using fault::ControlListener;
  py::class_<ControlListener, std::shared_ptr<ControlListener>>(m, "ControlListener")
      .def(py::init([](const std::string& bind, const py::bytes& secret) {
             return std::make_shared<ControlListener>(bind, std::string(secret));
           }),
           py::arg("bind"), py::arg("secret"))
      .def_property_readonly("port", &ControlListener::port)
      .def(
          "forget", [](ControlListener& l, const std::string& plane) { without_gil([&] { l.forget(plane); }); },
          py::arg("plane"))
      .def(
          "next_join",
          [](ControlListener& l, double timeout_s) -> py::object {
            ControlListener::Join j;
            const bool got = without_gil([&] { return l.next_join(timeout_s, &j); });
            if (!got) return py::none();
            return py::make_tuple(j.fd, j.challenge, py::bytes(j.body));
          },
          py::arg("timeout_s"),
          "the next join request: (fd, challenge, JSON body), the caller owning fd; None after timeout_s");

  py::class_<ControlLinks>(m, "ControlLinks")
      .def(py::init([](std::shared_ptr<ControlListener> listener, int rank, int world, const std::string& plane,
                       const std::string& token, double heartbeat_timeout_s, const std::vector<std::string>& addresses,
                       double answer_timeout_s, const std::vector<int>& peers) {
             fault::LinksConfig config;
             config.rank = rank;
             config.world = world;
             config.plane = plane;
             config.token = token;
             config.heartbeat_timeout_s = heartbeat_timeout_s;
             config.answer_timeout_s = answer_timeout_s;
             config.peers = peers;
             return std::make_unique<ControlLinks>(std::move(listener), config, addresses);
           }),
           py::arg("listener"), py::arg("rank"), py::arg("world"), py::arg("plane"), py::arg("token"),
           py::arg("heartbeat_timeout_s"), py::arg("addresses"), py::arg("answer_timeout_s") = 0.0,
           py::arg("peers") = std::vector<int>{})
      .def(
          "wait_formed",
          [](ControlLinks& l, double timeout_s) { return without_gil([&] { return l.wait_formed(timeout_s); }); },
          py::arg("timeout_s"))
      .def("failures", &ControlLinks::failures)
      .def(
          "send",
          [](ControlLinks& l, int peer, const py::bytes& body) {
            std::string b = body;
            return static_cast<int>(without_gil([&] { return l.send(peer, b); }));
          },
          py::arg("peer"), py::arg("body"), "0: queued; 1: its link is gone; 2: it reads nothing it is sent")
      .def(
          "drop", [](ControlLinks& l, int peer) { without_gil([&] { l.drop(peer); }); }, py::arg("peer"))
      .def(
          "take",
          [](ControlLinks& l, double timeout_s) {
            std::vector<ControlLinks::Event> events = without_gil([&] { return l.take(timeout_s); });
            py::list out;
            for (auto& e : events) out.append(py::make_tuple(e.peer, std::string(1, e.kind), py::bytes(e.data)));
            return out;
          },
          py::arg("timeout_s"), "events since the last call: (peer, kind 'f' | 'c' | 's', data)")
      .def("settle", [](ControlLinks& l) { return without_gil([&] { return l.settle(); }); })
      .def(
          "close", [](ControlLinks& l, double flush_s) { without_gil([&] { l.close(flush_s); }); }, py::arg("flush_s"))
      .def("_hold_for_testing", [](ControlLinks& l, double s) { without_gil([&] { l.hold(s); }); }, py::arg("seconds"));
}

}  // namespace pycoll::python
