// A probe: what a process answers, natively, when asked where it is (pycoll/flight/probe.py asks; the
// control listener, listener.h, answers on its own thread). It needs nothing of the process's Python: a
// rank whose main thread sleeps, computes in a long C call that holds the GIL, or waits in a collective
// answers the same.
//
//     prober                                  listener
//       connect  ---------------------------> challenge frame (wire.h)
//       probe frame "?probe 1 <records> <flags> <proof>"
//                                             answered by a probe thread: one frame, the report (JSON)
//
// `records`: how many of the flight recorder's last records (engine/flight_recorder.h) to send; `flags`:
// kWithStacks (every thread's Python stack, read as faulthandler reads it: stack_dumper; and the main
// thread's state, sampled over 0.1 s) and kWithMembers
// (each communicator's members' control addresses, for `pycoll trace dump`); `proof`: with a job secret,
// the hex HMAC-SHA256 of the secret over "probe:" and the challenge ("-" without one).
//
// The report: {"pid", "host", "now" (steady clock, ns), "wall" (Unix time, s), "capacity",
// "main": {"tid", "ident", "state", "syscall", "cpu_s", "busy"} (the main thread, from /proc: its
// scheduler state, the system call it is in, its CPU time and the share of a CPU it used over 0.1 s),
// "stacks" (faulthandler's text, or why there is none), "comms": [{"id", "info", "members"?}],
// "records": [{"ticket", "comm", "seq", "collective", "algorithm", "dtype", "op", "count", "root",
// "codec", "site", "state", "gpu", "enqueued", "started", "ended"}]}.
#pragma once

#include <cstddef>
#include <string>

namespace pycoll::fault {

constexpr unsigned kWithStacks = 1, kWithMembers = 2;
// Probes answered at once (threads), and probes waiting for one; one past those is closed unanswered.
constexpr int kMaxProbes = 8;
constexpr size_t kMaxQueuedProbes = 4096;

struct ProbeRequest {
  size_t records = 0;
  unsigned flags = 0;
  std::string proof;
};

// The probe frame's body, and its parse (false: not a probe).
std::string probe_body(const ProbeRequest& r);
bool parse_probe(const std::string& body, ProbeRequest* out);
// The proof a probe carries with `secret` over `challenge_hex` ("-" without a secret).
std::string probe_proof(const std::string& secret, const std::string& challenge_hex);
bool probe_proof_ok(const std::string& secret, const std::string& challenge_hex, const std::string& proof);

// What this process answers (the module comment's report).
std::string probe_report(const ProbeRequest& r);

// Set once by the Python module (csrc/python/bind_trace.cc): every thread's Python stack as text, read
// without the GIL; and the main thread's kernel id and Python ident.
using StackDumper = std::string (*)();
void set_stack_dumper(StackDumper dumper);
void set_main_thread(long tid, unsigned long ident);
// A communicator's info (a JSON object the Python layer wrote: its name, rank, world, epoch) and its
// members' control addresses (a JSON array), by its flight recorder id.
void set_comm_info(int comm, const std::string& info_json, const std::string& members_json);

// `s` as a JSON string literal.
std::string json_string(const std::string& s);

}  // namespace pycoll::fault
