// The emulation's own tests: probe kernels (written here, compiled with cuda_emulation.h as the real
// kernels are) whose results have closed forms, under every schedule order, and deliberately broken ones
// whose faults must be reported with the threads and call sites involved, after which the emulation must
// run the next launch as if nothing happened.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "check.h"
#include "cuda/emulation/cuda_emulation.h"

#if defined(__SANITIZE_ADDRESS__) && defined(__x86_64__)
#include <sys/wait.h>
#include <unistd.h>
#endif

namespace pycoll::kernel_tests {
namespace {

using emulation::DeviceShape;
using emulation::Order;
using emulation::Schedule;

const Order kOrders[] = {Order::kInOrder, Order::kReversed, Order::kRandom};

template <class... P, class... A>
cudaError_t run(dim3 grid, dim3 block, void (*kernel)(P...), const A&... args) {
  (void)cudaGetLastError();
  emulation::launch(kernel, grid, block, 0, nullptr, args...);
  return cudaGetLastError();
}

void on(Order order, uint64_t seed = 7, DeviceShape shape = DeviceShape{}) {
  emulation::use_device(shape, Schedule{order, seed});
}

bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

// ---- probes with closed-form results -------------------------------------------------------------------

struct Seen {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
  unsigned arrival;
};

__global__ void record_indices(Seen* out, unsigned* counter) {
  const unsigned b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  const unsigned t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  Seen& s = out[b * blockDim.x * blockDim.y * blockDim.z + t];
  s.thread = threadIdx;
  s.block = blockIdx;
  s.block_dim = blockDim;
  s.grid_dim = gridDim;
  s.arrival = (*counter)++;
}

void test_indices_and_orders() {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  const unsigned per_block = 64, blocks = 12, n = per_block * blocks;
  std::vector<std::vector<unsigned>> random_arrivals;
  for (Order order : kOrders) {
    for (uint64_t seed : {1u, 2u}) {
      if (order != Order::kRandom && seed == 2) continue;
      on(order, seed);
      std::vector<Seen> seen(n);
      unsigned counter = 0;
      CHECK(run(grid, block, record_indices, seen.data(), &counter) == cudaSuccess, "a 3-D launch");
      CHECK(counter == n, "every thread ran once");
      std::vector<unsigned> arrivals;
      for (unsigned i = 0; i < n; ++i) {
        const Seen& s = seen[i];
        const unsigned b = i / per_block, t = i % per_block;
        CHECK(s.block.x == b % 3 && s.block.y == b / 3 % 2 && s.block.z == b / 6, "blockIdx");
        CHECK(s.thread.x == t % 8 && s.thread.y == t / 8 % 4 && s.thread.z == t / 32, "threadIdx");
        CHECK(s.block_dim.x == 8 && s.block_dim.y == 4 && s.block_dim.z == 2, "blockDim");
        CHECK(s.grid_dim.x == 3 && s.grid_dim.y == 2 && s.grid_dim.z == 2, "gridDim");
        if (order == Order::kInOrder) CHECK(s.arrival == i, "in order: blocks and threads in order");
        if (order == Order::kReversed) CHECK(s.arrival == n - 1 - i, "reversed: blocks and threads reversed");
        arrivals.push_back(s.arrival);
      }
      if (order == Order::kRandom) random_arrivals.push_back(arrivals);
      const emulation::LaunchRecord r = emulation::last_launch();
      CHECK(r.ran && r.threads == n && r.grid.x == 3 && r.block.z == 2 && r.warp_ops == 0, "the launch record");
    }
  }
  CHECK(random_arrivals[0] != random_arrivals[1], "two seeds, two schedules");
  on(Order::kRandom, 1);
  std::vector<Seen> seen(n);
  unsigned counter = 0;
  run(grid, block, record_indices, seen.data(), &counter);
  for (unsigned i = 0; i < n; ++i) CHECK(seen[i].arrival == random_arrivals[0][i], "a seed repeats its schedule");
  std::sort(random_arrivals[0].begin(), random_arrivals[0].end());
  for (unsigned i = 0; i < n; ++i) CHECK(random_arrivals[0][i] == i, "random: a permutation");
}

__global__ void indices_across_a_switch(unsigned* out) {
  const unsigned before = threadIdx.x + blockIdx.x * blockDim.x;
  __syncwarp();
  const unsigned after = threadIdx.x + blockIdx.x * blockDim.x;
  out[2 * after] = before;
  out[2 * after + 1] = after;
}

void test_indices_follow_switches() {
  for (Order order : kOrders) {
    on(order);
    std::vector<unsigned> out(2 * 4 * 96, ~0u);
    CHECK(run(dim3(4), dim3(96), indices_across_a_switch, out.data()) == cudaSuccess, "launch");
    for (unsigned i = 0; i < 4 * 96; ++i) CHECK(out[2 * i] == i && out[2 * i + 1] == i, "threadIdx after a switch");
    CHECK(emulation::last_launch().warp_ops == 4 * 3, "one __syncwarp per warp");
  }
}

struct Shuffled {
  int sum, idx, up, down;
  unsigned ballot;
  int any, all, none;
};

__global__ void shuffles(Shuffled* out, int width, unsigned up_delta, unsigned down_delta) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  const int v = lane * 10 + static_cast<int>(blockIdx.x);
  int sum = v;
  for (int off = width / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off, width);
  Shuffled& s = out[blockIdx.x * blockDim.x + threadIdx.x];
  s.sum = sum;
  s.idx = __shfl_sync(0xffffffffu, v, 3, width);
  s.up = __shfl_up_sync(0xffffffffu, v, up_delta, width);
  s.down = __shfl_down_sync(0xffffffffu, v, down_delta, width);
  s.ballot = __ballot_sync(0xffffffffu, lane % 3 == 0);
  s.any = __any_sync(0xffffffffu, lane == 7);
  s.all = __all_sync(0xffffffffu, lane < 32);
  s.none = __any_sync(0xffffffffu, 0);
}

// Sources out of range take CUDA's documented values: __shfl_sync's source lane modulo the width (a negative
// one too), up / down past the segment and xor into a later segment (or past the warp) the caller's own
// value, xor into an earlier segment that lane's. 8-byte values move whole; votes with a false somewhere
// and with a partial mask.
struct OutOfRange {
  int idx_negative, up_past, down_past, xor_far, xor_earlier;
  double d;
  long long ll;
  unsigned ballot_half;
  int all_some_false, any_half;
};

__global__ void out_of_range(OutOfRange* out, int width) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  OutOfRange& s = out[threadIdx.x];
  s.idx_negative = __shfl_sync(0xffffffffu, lane, -1, width);
  s.up_past = __shfl_up_sync(0xffffffffu, lane, static_cast<unsigned>(width), width);
  s.down_past = __shfl_down_sync(0xffffffffu, lane, static_cast<unsigned>(width) + 5u, width);
  s.xor_far = __shfl_xor_sync(0xffffffffu, lane, 64, width);
  s.xor_earlier = __shfl_xor_sync(0xffffffffu, lane, width, width);  // lane ^ width: the next segment up or down
  s.d = __shfl_xor_sync(0xffffffffu, 1.0 / 3.0 + lane, 1);
  s.ll = __shfl_sync(0xffffffffu, (1LL << 40) + lane, 7);
  s.all_some_false = __all_sync(0xffffffffu, lane != 9);
  if (lane < 16) {
    s.ballot_half = __ballot_sync(0x0000ffffu, lane % 2);
    s.any_half = __any_sync(0x0000ffffu, lane == 20);
  } else {
    s.ballot_half = __ballot_sync(0xffff0000u, lane % 2);
    s.any_half = __any_sync(0xffff0000u, lane == 20);
  }
}

void test_sources_out_of_range() {
  for (Order order : kOrders) {
    for (int width : {4, 16}) {
      on(order);
      std::vector<OutOfRange> out(32);
      CHECK(run(dim3(1), dim3(32), out_of_range, out.data(), width) == cudaSuccess, "launch");
      for (int lane = 0; lane < 32; ++lane) {
        const OutOfRange& s = out[lane];
        const int base = lane / width * width;
        CHECK(s.idx_negative == base + width - 1, "__shfl_sync(-1): the segment's last lane");
        CHECK(s.up_past == lane && s.down_past == lane, "up / down past the segment: the caller's own value");
        CHECK(s.xor_far == lane, "xor past the warp: the caller's own value");
        const int other = lane ^ width;
        CHECK(s.xor_earlier == (other < lane ? other : lane), "xor: an earlier segment's lane, a later one's own");
        CHECK(s.d == 1.0 / 3.0 + (lane ^ 1), "an 8-byte double");
        CHECK(s.ll == (1LL << 40) + 7, "an 8-byte integer");
        CHECK(s.all_some_false == 0, "__all_sync with one lane false");
        CHECK(s.ballot_half == (lane < 16 ? 0x0000aaaau : 0xaaaa0000u), "a ballot over half a warp");
        CHECK(s.any_half == (lane < 16 ? 0 : 1), "__any_sync over half a warp");
      }
    }
  }
}

void test_shuffle_semantics() {
  unsigned ballot = 0;
  for (int l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (Order order : kOrders) {
    for (int width = 1; width <= 32; width *= 2) {
      on(order, static_cast<uint64_t>(width));
      const unsigned up = width > 1 ? 1 : 0, down = width > 2 ? 2 : 0;
      std::vector<Shuffled> out(2 * 64);
      CHECK(run(dim3(2), dim3(64), shuffles, out.data(), width, up, down) == cudaSuccess, "launch");
      for (int i = 0; i < 128; ++i) {
        const int b = i / 64, lane = i % 32, base = lane / width * width, seg = lane % width;
        auto value = [&](int l) { return l * 10 + b; };
        int sum = 0;
        for (int l = base; l < base + width; ++l) sum += value(l);
        const Shuffled& s = out[i];
        CHECK(s.sum == sum, "xor butterfly: the segment's sum (width " + std::to_string(width) + ")");
        CHECK(s.idx == value(base + 3 % width), "__shfl_sync: lane 3 of the segment");
        CHECK(s.up == value(seg >= static_cast<int>(up) ? lane - static_cast<int>(up) : lane), "__shfl_up_sync");
        CHECK(s.down == value(seg + static_cast<int>(down) < width ? lane + static_cast<int>(down) : lane),
              "__shfl_down_sync");
        CHECK(s.ballot == ballot && s.any == 1 && s.all == 1 && s.none == 0, "votes");
      }
    }
  }
}

__global__ void two_halves(int* out) {
  const int lane = static_cast<int>(threadIdx.x % 32);
  int v = lane;
  if (lane < 16) {
    v = __shfl_xor_sync(0x0000ffffu, v, 1, 16);
  } else {
    v = __shfl_xor_sync(0xffff0000u, v, 2, 16);
  }
  out[threadIdx.x] = v;
}

__global__ void partial_warp(int* out, unsigned mask, int lane_mask) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x >= 32) v = __shfl_xor_sync(mask, v, lane_mask, 16);
  out[threadIdx.x] = v;
}

// Exited lanes take no part in __syncwarp and the votes (CUDA: "non-exited threads in mask").
__global__ void votes_after_exits(unsigned* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane == 3 || lane == 30) return;
  __syncwarp();
  out[threadIdx.x] = __ballot_sync(0xffffffffu, 1) | (__all_sync(0xffffffffu, 1) ? 0u : 1u << 3);
}

void test_masks() {
  for (Order order : kOrders) {
    on(order);
    std::vector<int> out(64);
    CHECK(run(dim3(1), dim3(64), two_halves, out.data()) == cudaSuccess, "disjoint masks at two call sites");
    for (int i = 0; i < 64; ++i) CHECK(out[i] == ((i % 32) < 16 ? (i % 32) ^ 1 : (i % 32) ^ 2), "two halves");
    for (unsigned mask : {0xffu, 0xffffffffu}) {  // a full mask in a partial warp: the missing lanes take no part
      std::vector<int> part(40);
      CHECK(run(dim3(1), dim3(40), partial_warp, part.data(), mask, 1) == cudaSuccess, "the 8 lanes of a partial warp");
      for (int i = 0; i < 40; ++i) CHECK(part[i] == (i < 32 ? i : 32 + ((i - 32) ^ 1)), "partial warp");
    }
  }
}

__global__ void block_sum(const int* in, int* out) {
  __shared__ int s[256];
  s[threadIdx.x] = in[blockIdx.x * 256 + threadIdx.x];
  __syncthreads();
  for (unsigned k = 128; k > 0; k /= 2) {
    if (threadIdx.x < k) s[threadIdx.x] += s[threadIdx.x + k];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = s[0];
}

void test_exited_lanes() {
  for (Order order : kOrders) {
    on(order);
    std::vector<unsigned> out(64, 0);
    CHECK(run(dim3(1), dim3(64), votes_after_exits, out.data()) == cudaSuccess, "__syncwarp and votes after exits");
    for (int i = 0; i < 64; ++i)
      if (i % 32 != 3 && i % 32 != 30) CHECK(out[i] == ~((1u << 3) | (1u << 30)), "exited lanes vote 0; all is true");
  }
}

void test_shared_memory_and_barriers() {
  std::vector<int> in(5 * 256);
  std::iota(in.begin(), in.end(), 0);
  for (Order order : kOrders) {
    on(order);
    std::vector<int> out(5, -1);
    CHECK(run(dim3(5), dim3(256), block_sum, in.data(), out.data()) == cudaSuccess, "launch");
    for (int b = 0; b < 5; ++b) CHECK(out[b] == 256 * 256 * b + 255 * 256 / 2, "a block's sum over shared memory");
    CHECK(emulation::last_launch().barriers == 5 * 9, "nine barriers per block");
  }
}

// ---- faults: the launch stops, says who and where, and the next one runs --------------------------------

__global__ void exits_before_a_shuffle(int* out) {
  const unsigned lane = threadIdx.x % 32;
  if (lane == 3) return;
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(lane), 1);
}
__global__ void shuffles_at_two_sites(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x & 1u) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  }
  out[threadIdx.x] = v;
}
__global__ void shuffles_with(int* out, int lane_mask, int width) {
  out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, static_cast<int>(threadIdx.x), lane_mask, width);
}
__global__ void leaves_out_its_lane(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(1u << ((threadIdx.x + 1) % 32), 1, 0);
}
__global__ void reads_outside_its_mask(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, static_cast<int>(threadIdx.x), 20);
}
__global__ void barriers_at_two_sites(int* out) {
  if (threadIdx.x < 128) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}
__global__ void exits_before_a_barrier(int* out) {
  if (threadIdx.x == 5) return;
  __syncthreads();
  out[threadIdx.x] = 1;
}
__global__ void waits_for_a_thread_at_the_barrier(int* out) {
  if (threadIdx.x == 1) {
    __syncwarp(0x3u);
  } else {
    __syncthreads();
  }
  out[threadIdx.x] = 1;
}

void expect_fault(const char* what, cudaError_t err, std::initializer_list<const char*> parts) {
  CHECK(err == cudaErrorLaunchFailure, std::string(what) + ": a launch failure, got " + cudaGetErrorName(err));
  const std::string text = cudaGetErrorString(err);
  for (const char* p : parts) CHECK(contains(text, p), std::string(what) + ": the message names '" + p + "': " + text);
  // The next launch runs normally, on the fibers the fault abandoned.
  std::vector<Shuffled> out(64);
  CHECK(run(dim3(1), dim3(64), shuffles, out.data(), 32, 1u, 1u) == cudaSuccess, "a launch after a fault");
  CHECK(out[5].sum == 4960 && out[40].up == 70, std::string("a launch after a fault computes: ") + what);
}

void test_faults() {
  for (Order order : kOrders) {
    on(order);
    std::vector<int> out(256);
    expect_fault("a shuffle reads a lane that exited", run(dim3(2), dim3(64), exits_before_a_shuffle, out.data()),
                 {"reads lane 3 in __shfl_xor_sync(mask 0xffffffff) at kernels/selftest.cc:", "which exited"});
    expect_fault("two call sites", run(dim3(1), dim3(32), shuffles_at_two_sites, out.data()),
                 {"of its warp waited in __shfl_xor_sync", "kernels/selftest.cc:"});
    expect_fault("a width of 3", run(dim3(1), dim3(32), shuffles_with, out.data(), 1, 3), {"width 3", "power of two"});
    expect_fault("a mask without the caller", run(dim3(1), dim3(32), leaves_out_its_lane, out.data()),
                 {"leaves out its own lane"});
    expect_fault("a source outside the mask", run(dim3(1), dim3(32), reads_outside_its_mask, out.data()),
                 {"reads lane 20", "outside the mask"});
    expect_fault("a shuffle reads past a partial warp",
                 run(dim3(1), dim3(40), partial_warp, out.data(), 0xffffffffu, 8),
                 {"reads lane 8", "which does not exist (a partial warp)"});
    expect_fault("barriers at two sites", run(dim3(1), dim3(256), barriers_at_two_sites, out.data()),
                 {"__syncthreads at kernels/selftest.cc:", "threads of its block waited in __syncthreads"});
    expect_fault("an exit before a barrier", run(dim3(1), dim3(64), exits_before_a_barrier, out.data()),
                 {"thread 5 of block 0", "exited"});
    expect_fault("a barrier and a warp sync waiting on each other",
                 run(dim3(1), dim3(32), waits_for_a_thread_at_the_barrier, out.data()),
                 {"no thread of block 0 can go on", "in warp 0, lane 1 waited in __syncwarp(mask 0x00000003)",
                  "31 threads waited in __syncthreads"});
  }
}

// ---- AddressSanitizer keeps a kernel frame's redzones across a switch ---------------------------------------
// (x86-64, where fiber.cc switches by itself; elsewhere swapcontext makes AddressSanitizer clear them.)
#if defined(__SANITIZE_ADDRESS__) && defined(__x86_64__)
// (UBSan off here: its bounds and object-size checks would see the overflow before AddressSanitizer.)
__attribute__((no_sanitize("undefined"))) __global__ void overflows_a_local_after_a_switch(int* out, const int* index) {
  int local[4] = {1, 2, 3, static_cast<int>(threadIdx.x)};
  const int k = *index;
  __syncwarp();  // the frame lives on across a fiber switch
  out[threadIdx.x] = local[k];
}

// In a child process: the overflow must end it with AddressSanitizer's report.
void test_asan_sees_frames_across_switches() {
  int fds[2];
  CHECK(pipe(fds) == 0, "pipe");
  const pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    on(Order::kInOrder);
    const int index = 4;
    std::vector<int> out(32);
    run(dim3(1), dim3(32), overflows_a_local_after_a_switch, out.data(), &index);
    _exit(0);
  }
  close(fds[1]);
  std::string report;
  char buf[4096];
  for (ssize_t n; (n = read(fds[0], buf, sizeof buf)) > 0;) report.append(buf, static_cast<size_t>(n));
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0), "a stack overflow after a switch went unseen");
  CHECK(contains(report, "stack-buffer-overflow"), "AddressSanitizer's report: " + report.substr(0, 300));
}
#endif

// ---- configurations and the runtime's answers -----------------------------------------------------------

void test_configurations_and_runtime() {
  on(Order::kInOrder, 0, DeviceShape{7, 3, 512});
  int dev = -1, v = 0;
  CHECK(cudaGetDevice(&dev) == cudaSuccess, "cudaGetDevice");
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v == 7, "SM count");
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMaxThreadsPerBlock, dev) == cudaSuccess && v == 512, "max threads");
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, dev) == cudaSuccess && v == 32, "warp size");
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrClockRate, dev) == cudaErrorInvalidValue, "an attribute not emulated");
  CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrWarpSize, 999) == cudaErrorInvalidDevice, "no device 999");
  (void)cudaGetLastError();
  const void* k = reinterpret_cast<const void*>(&block_sum);
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k, 256, 0) == cudaSuccess && v == 3, "occupancy");
  CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&v, k, 1024, 0) == cudaSuccess && v == 0,
        "no block of more threads than the device has");
  int again = -1, other = -1;
  on(Order::kRandom, 5, DeviceShape{7, 3, 512});
  cudaGetDevice(&again);
  on(Order::kInOrder, 0, DeviceShape{8, 3, 512});
  cudaGetDevice(&other);
  CHECK(again == dev && other != dev, "one ordinal per shape (the schedule is not the device)");

  on(Order::kInOrder, 0, DeviceShape{4, 2, 128});
  std::vector<int> out(1024, -1);
  struct Bad {
    dim3 grid, block;
    const char* says;
  };
  const Bad bad[] = {{dim3(0), dim3(32), "a grid dimension is 0"},
                     {dim3(1, 70000), dim3(32), "the grid exceeds"},
                     {dim3(1), dim3(0, 1), "a block dimension is 0"},
                     {dim3(1), dim3(256), "a block of 256 threads, more than the device's 128"},
                     {dim3(1), dim3(1, 1, 65), "deeper than 64"}};
  for (const Bad& b : bad) {
    const cudaError_t err = run(b.grid, b.block, exits_before_a_barrier, out.data());
    CHECK(err == cudaErrorInvalidConfiguration, std::string("refused: ") + b.says);
    CHECK(contains(cudaGetErrorString(err), b.says), std::string("the reason: ") + cudaGetErrorString(err));
    CHECK(!emulation::last_launch().ran, "nothing ran");
  }
  (void)cudaGetLastError();
  emulation::launch(exits_before_a_barrier, dim3(1), dim3(32), 16, nullptr, out.data());
  const cudaError_t shared = cudaGetLastError();
  CHECK(shared == cudaErrorInvalidConfiguration && contains(cudaGetErrorString(shared), "dynamic shared memory"),
        "dynamic shared memory is refused");
  CHECK(std::all_of(out.begin(), out.end(), [](int x) { return x == -1; }), "a refused launch wrote nothing");
  CHECK(cudaGetLastError() == cudaSuccess, "cudaGetLastError clears the error");
}

}  // namespace

int run_selftests() {
  const std::pair<const char*, void (*)()> tests[] = {
      {"indices and orders", test_indices_and_orders},
      {"indices follow switches", test_indices_follow_switches},
      {"shuffle semantics", test_shuffle_semantics},
      {"sources out of range", test_sources_out_of_range},
      {"exited lanes", test_exited_lanes},
      {"masks", test_masks},
      {"shared memory and barriers", test_shared_memory_and_barriers},
      {"faults", test_faults},
      {"configurations and runtime", test_configurations_and_runtime},
#if defined(__SANITIZE_ADDRESS__) && defined(__x86_64__)
      {"AddressSanitizer across switches", test_asan_sees_frames_across_switches},
#endif
  };
  for (const auto& [name, test] : tests) {
    try {
      test();
    } catch (const Failure& f) {
      throw Failure(std::string("self-test '") + name + "': " + f.what());
    }
  }
  emulation::use_device(DeviceShape{}, Schedule{});
  return static_cast<int>(sizeof tests / sizeof tests[0]);
}

}  // namespace pycoll::kernel_tests
