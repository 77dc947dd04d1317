/* A stand-in for libnccl with NCCL's C entry points (types as NCCL's nccl.h documents them), for testing
 * pycoll's NCCL binding without a GPU: tests/unit/test_nccl_loading.py compiles it and points
 * NCCL_LIBRARY at it. It behaves like a non-blocking communicator: calls answer ncclInProgress and
 * ncclCommGetAsyncError reports ncclInProgress for a few polls before the result. "Device" pointers are
 * host pointers: collectives copy send to recv, which is what one rank gets from sum/min/max/prod/avg.
 *
 * STUB_NCCL_MODE (read at each call) picks a failure:
 *   init_hang       init never completes        init_fail     init ends in ncclSystemError
 *   init_reject     init returns ncclInvalidArgument at once
 *   launch_hang     collectives never finish    group_hang    ncclGroupEnd never finishes
 *   remote_error    a collective is taken, then the communicator reports ncclRemoteError
 * Exported stub_* variables record what pycoll passed, for the tests to read with ctypes.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

enum { kSuccess = 0, kSystemError = 2, kInvalidArgument = 4, kInvalidUsage = 5, kRemoteError = 6, kInProgress = 7 };

typedef struct {
  char internal[128];
} UniqueId;

typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} ConfigHead;

typedef struct {
  int rank, nranks;
  int state; /* what ncclCommGetAsyncError reports once `polls` reaches 0 */
  int polls; /* polls left answering ncclInProgress; -1: forever */
  int in_group;
} Comm;

int stub_config_size = -1, stub_config_magic_ok = 0, stub_config_version = -1, stub_config_blocking = -2;
int stub_config_next_int = 0; /* the int after `blocking` (padding in a 2.14-sized config) */
int stub_inits = 0, stub_aborts = 0, stub_destroys = 0, stub_finalizes = 0, stub_polls = 0;
int stub_last_dtype = -1, stub_last_op = -1, stub_last_root = -1, stub_last_peer = -1;
long long stub_last_count = -1;
char stub_last_call[32];
unsigned char stub_last_id[128];
int stub_version = 22805;

static int group_depth = 0;
static Comm* group_comms[16];
static int n_group_comms = 0;
static const void* pending_send = NULL;
static size_t pending_send_bytes = 0;
static char last_error[256] = "";

static int mode(const char* m) {
  const char* v = getenv("STUB_NCCL_MODE");
  return v && strstr(v, m) != NULL;
}

static size_t type_size(int t) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return (t >= 0 && t < 10) ? sizes[t] : 0;
}

static void set_error(const char* text) {
  strncpy(last_error, text, sizeof(last_error) - 1);
}

int ncclGetVersion(int* v) {
  *v = stub_version;
  return kSuccess;
}

int ncclGetUniqueId(UniqueId* id) {
  for (int i = 0; i < 128; ++i) id->internal[i] = (char)(i * 7 + 1);
  return kSuccess;
}

const char* ncclGetErrorString(int r) {
  switch (r) {
    case kSuccess:
      return "no error";
    case kSystemError:
      return "unhandled system error (stub)";
    case kInvalidArgument:
      return "invalid argument (stub)";
    case kInvalidUsage:
      return "invalid usage (stub)";
    case kRemoteError:
      return "remote process exited or there was a network error (stub)";
    case kInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(void* comm) {
  (void)comm;
  return last_error;
}

int ncclCommInitRankConfig(Comm** out, int nranks, UniqueId id, int rank, ConfigHead* config) {
  ++stub_inits;
  stub_config_size = (int)config->size;
  stub_config_magic_ok = config->magic == 0xcafebeef;
  stub_config_version = (int)config->version;
  stub_config_blocking = config->blocking;
  if (config->size >= 24) memcpy(&stub_config_next_int, (const char*)config + 20, sizeof(int));
  memcpy(stub_last_id, id.internal, 128);
  if (mode("init_reject")) {
    set_error("stub: rank out of range");
    *out = NULL;
    return kInvalidArgument;
  }
  Comm* c = calloc(1, sizeof(Comm));
  c->rank = rank;
  c->nranks = nranks;
  c->state = mode("init_fail") ? kSystemError : kSuccess;
  c->polls = mode("init_hang") ? -1 : 3;
  if (mode("init_fail")) set_error("stub: socket connect to rank 1 refused");
  *out = c;
  return kInProgress;
}

int ncclCommGetAsyncError(Comm* c, int* state) {
  ++stub_polls;
  if (c->polls != 0) {
    if (c->polls > 0) --c->polls;
    *state = kInProgress;
    return kSuccess;
  }
  *state = c->state;
  return kSuccess;
}

int ncclCommFinalize(Comm* c) {
  ++stub_finalizes;
  c->polls = 2;
  return kInProgress;
}

int ncclCommDestroy(Comm* c) {
  ++stub_destroys;
  free(c);
  return kSuccess;
}

int ncclCommAbort(Comm* c) {
  ++stub_aborts;
  free(c);
  return kSuccess;
}

/* Records a call; outside a group it answers ncclInProgress for two polls (or forever). */
static int launch(Comm* c, const char* name, long long count, int dtype) {
  strncpy(stub_last_call, name, sizeof(stub_last_call) - 1);
  stub_last_count = count;
  stub_last_dtype = dtype;
  if (group_depth > 0) {
    if (!c->in_group && n_group_comms < 16) group_comms[n_group_comms++] = c;
    c->in_group = 1;
    return kSuccess;
  }
  if (mode("remote_error")) { /* taken at once; the failure shows up afterwards */
    c->state = kRemoteError;
    set_error("stub: rank 1 exited");
    return kSuccess;
  }
  c->polls = mode("launch_hang") ? -1 : 2;
  return kInProgress;
}

static void copy(const void* send, void* recv, size_t bytes) {
  if (send && recv && send != recv && bytes) memmove(recv, send, bytes);
}

int ncclAllReduce(const void* s, void* r, size_t n, int t, int op, Comm* c, void* stream) {
  (void)stream;
  stub_last_op = op;
  if (t < 0 || t > 9) return kInvalidArgument;
  copy(s, r, n * type_size(t));
  return launch(c, "ncclAllReduce", (long long)n, t);
}

int ncclReduceScatter(const void* s, void* r, size_t n, int t, int op, Comm* c, void* stream) {
  (void)stream;
  stub_last_op = op;
  copy((const char*)s + (size_t)c->rank * n * type_size(t), r, n * type_size(t));
  return launch(c, "ncclReduceScatter", (long long)n, t);
}

int ncclAllGather(const void* s, void* r, size_t n, int t, Comm* c, void* stream) {
  (void)stream;
  copy(s, (char*)r + (size_t)c->rank * n * type_size(t), n * type_size(t));
  return launch(c, "ncclAllGather", (long long)n, t);
}

int ncclBroadcast(const void* s, void* r, size_t n, int t, int root, Comm* c, void* stream) {
  (void)stream;
  stub_last_root = root;
  copy(s, r, n * type_size(t));
  return launch(c, "ncclBroadcast", (long long)n, t);
}

int ncclSend(const void* buf, size_t n, int t, int peer, Comm* c, void* stream) {
  (void)stream;
  stub_last_peer = peer;
  pending_send = buf;
  pending_send_bytes = n * type_size(t);
  return launch(c, "ncclSend", (long long)n, t);
}

int ncclRecv(void* buf, size_t n, int t, int peer, Comm* c, void* stream) {
  (void)stream;
  stub_last_peer = peer;
  if (pending_send && peer == c->rank)
    copy(pending_send, buf, n * type_size(t) < pending_send_bytes ? n * type_size(t) : pending_send_bytes);
  pending_send = NULL;
  return launch(c, "ncclRecv", (long long)n, t);
}

int ncclGroupStart(void) {
  ++group_depth;
  return kSuccess;
}

int ncclGroupEnd(void) {
  if (group_depth == 0) return kInvalidUsage;
  if (--group_depth > 0) return kSuccess;
  for (int i = 0; i < n_group_comms; ++i) {
    group_comms[i]->in_group = 0;
    group_comms[i]->polls = mode("group_hang") ? -1 : 2;
  }
  int any = n_group_comms > 0;
  n_group_comms = 0;
  return any ? kInProgress : kSuccess;
}
