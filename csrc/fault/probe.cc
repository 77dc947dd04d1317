#include "fault/probe.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <vector>

#include "engine/flight_recorder.h"
#include "fault/wire.h"
#include "kernels/types.h"
#include "transport/hmac.h"

namespace pycoll::fault {

namespace {

constexpr const char* kProbeTag = "?probe 1 ";
constexpr size_t kMaxRecords = 1 << 20;

std::mutex g_mu;
StackDumper g_dumper = nullptr;
long g_main_tid = 0;
unsigned long g_main_ident = 0;
struct CommInfo {
  std::string info, members;
};
std::map<int, CommInfo> g_comms;

std::string to_hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) s += digits[p[i] >> 4], s += digits[p[i] & 15];
  return s;
}

// The main thread's scheduler state and CPU time (ticks), from /proc/self/task/<tid>/stat.
bool read_stat(long tid, char* state, double* cpu_s) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return false;
  const size_t close = line.rfind(')');  // the name may hold spaces and parentheses
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 2));
  std::vector<std::string> fields;
  for (std::string x; rest >> x;) fields.push_back(x);
  if (fields.size() < 13) return false;
  *state = fields[0][0];
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  *cpu_s = (std::stod(fields[11]) + std::stod(fields[12])) / ticks;  // utime, stime
  return true;
}

// The system call the thread is in, by name for the ones a waiting thread is usually in.
std::string read_syscall(long tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/syscall");
  std::string first;
  if (!(f >> first)) return "";
  if (first == "running") return "running";
  static const std::map<std::string, const char*> names = {{"0", "read"},
                                                           {"7", "poll"},
                                                           {"23", "select"},
                                                           {"35", "nanosleep"},
                                                           {"45", "recvfrom"},
                                                           {"47", "recvmsg"},
                                                           {"61", "wait4"},
                                                           {"202", "futex"},
                                                           {"230", "clock_nanosleep"},
                                                           {"232", "epoll_wait"},
                                                           {"270", "pselect6"},
                                                           {"271", "ppoll"},
                                                           {"281", "epoll_pwait"},
                                                           {"-1", "none (in user space)"}};
  auto it = names.find(first);
  return it != names.end() ? it->second : "syscall " + first;
}

std::string main_thread_json() {
  long tid;
  unsigned long ident;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    tid = g_main_tid, ident = g_main_ident;
  }
  if (tid == 0) return "null";
  char state = '?';
  double cpu0 = 0, cpu1 = 0;
  const bool ok = read_stat(tid, &state, &cpu0);
  const std::string syscall = read_syscall(tid);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const bool ok1 = ok && read_stat(tid, &state, &cpu1);
  char buf[64];
  std::string s = "{\"tid\":" + std::to_string(tid) + ",\"ident\":" + std::to_string(ident);
  s += ",\"state\":" + json_string(ok1 ? std::string(1, state) : "gone");
  s += ",\"syscall\":" + json_string(syscall);
  std::snprintf(buf, sizeof buf, ",\"cpu_s\":%.3f,\"busy\":%.2f}", cpu1, ok1 ? (cpu1 - cpu0) / 0.1 : 0.0);
  return s + buf;
}

std::string record_json(const trace::Record& r, trace::FlightRecorder& rec) {
  const Descriptor& d = r.desc;
  std::string s = "{\"ticket\":" + std::to_string(r.ticket) + ",\"comm\":" + std::to_string(r.comm) +
                  ",\"seq\":" + std::to_string(r.seq);
  s += ",\"collective\":" + json_string(code_name(kCollectiveNames, kNumCollectives, d.collective));
  s += ",\"algorithm\":" + json_string(code_name(kAlgorithmNames, kNumAlgorithms, d.algorithm));
  s += ",\"dtype\":" + json_string(dtype_name(DType(d.dtype)));
  s += ",\"op\":" + json_string(redop_name(RedOp(d.op)));
  s += ",\"count\":" + std::to_string(d.count) + ",\"root\":" + std::to_string(d.root);
  s += ",\"codec\":" + (d.codec ? json_string(codec_name(d.codec)) : std::string("null"));
  s += ",\"site\":" + json_string(rec.site_name(r.site));
  s += ",\"state\":" + json_string(trace::state_name(r.state));
  s += ",\"gpu\":" + std::string(r.gpu ? "true" : "false");
  s += ",\"enqueued\":" + std::to_string(r.enqueue_ns) + ",\"started\":" + std::to_string(r.start_ns) +
       ",\"ended\":" + std::to_string(r.end_ns) + "}";
  return s;
}

}  // namespace

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\', out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);  // UTF-8 passes through
    }
  }
  return out + "\"";
}

std::string probe_body(const ProbeRequest& r) {
  return kProbeTag + std::to_string(r.records) + " " + std::to_string(r.flags) + " " + r.proof;
}

bool parse_probe(const std::string& body, ProbeRequest* out) {
  const std::string tag = kProbeTag;
  if (body.compare(0, tag.size(), tag) != 0) return false;
  std::istringstream in(body.substr(tag.size()));
  unsigned long long records = 0;
  if (!(in >> records >> out->flags >> out->proof)) return false;
  out->records = static_cast<size_t>(std::min<unsigned long long>(records, kMaxRecords));
  return true;
}

std::string probe_proof(const std::string& secret, const std::string& challenge_hex) {
  if (secret.empty()) return "-";
  const std::string message = "probe:" + challenge_hex;
  const Digest d = hmac_sha256(secret.data(), secret.size(), message.data(), message.size());
  return to_hex(d.data(), d.size());
}

bool probe_proof_ok(const std::string& secret, const std::string& challenge_hex, const std::string& proof) {
  const std::string want = probe_proof(secret, challenge_hex);
  if (want.size() != proof.size()) return false;
  unsigned diff = 0;  // in time that does not depend on where they differ
  for (size_t i = 0; i < want.size(); ++i) diff |= static_cast<unsigned>(want[i] ^ proof[i]);
  return diff == 0;
}

void set_stack_dumper(StackDumper dumper) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_dumper = dumper;
}

void set_main_thread(long tid, unsigned long ident) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_main_tid = tid, g_main_ident = ident;
}

void set_comm_info(int comm, const std::string& info_json, const std::string& members_json) {
  std::lock_guard<std::mutex> lock(g_mu);
  g_comms[comm] = CommInfo{info_json, members_json};
}

std::string probe_report(const ProbeRequest& r) {
  trace::FlightRecorder& rec = trace::FlightRecorder::get();
  char host[256] = {0};
  ::gethostname(host, sizeof host - 1);
  const auto wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  char wall_text[64];
  std::snprintf(wall_text, sizeof wall_text, "%.6f", wall);
  std::string s = "{\"pid\":" + std::to_string(::getpid()) + ",\"host\":" + json_string(host) +
                  ",\"now\":" + std::to_string(trace::now_ns()) + ",\"wall\":" + wall_text +
                  ",\"capacity\":" + std::to_string(rec.capacity()) + ",\"recording\":" + (rec.on() ? "true" : "false");
  // Stacks first: the main thread's state is sampled over 0.1 s after it.
  StackDumper dumper;
  std::map<int, CommInfo> comms;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    dumper = g_dumper;
    comms = g_comms;
  }
  if (r.flags & kWithStacks)
    s += ",\"stacks\":" + json_string(dumper ? dumper() : "(this process has no Python stack reader)");
  if (r.flags & kWithStacks) s += ",\"main\":" + main_thread_json();
  s += ",\"comms\":[";
  bool first = true;
  for (const auto& [id, c] : comms) {
    s += std::string(first ? "" : ",") + "{\"id\":" + std::to_string(id) + ",\"info\":" + c.info;
    if ((r.flags & kWithMembers) && !c.members.empty()) s += ",\"members\":" + c.members;
    s += "}";
    first = false;
  }
  s += "],\"records\":[";
  first = true;
  if (r.records > 0) {
    for (const trace::Record& x : rec.snapshot(r.records)) {
      s += (first ? "" : ",") + record_json(x, rec);
      first = false;
    }
  }
  return s + "]}";
}

}  // namespace pycoll::fault
