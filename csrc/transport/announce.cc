#include "transport/announce.h"

namespace pycoll {

Error descriptor_mismatch(int rank, int peer, uint64_t seq, const Descriptor& mine, const Descriptor& theirs) {
  return Error(ErrorKind::kMismatch,
               "collective #" + std::to_string(seq) + " differs between ranks (" + differences(mine, theirs) +
                   "): rank " + std::to_string(rank) + " called " + describe(mine) + " but rank " +
                   std::to_string(peer) + " called " + describe(theirs),
               peer);
}

void throw_header_mismatch(int rank, int peer, const FragHeader& got, uint64_t seq, const Descriptor& desc,
                           uint64_t expected_msg_bytes, const Descriptor* theirs_at_got_seq,
                           const Descriptor* theirs_at_seq) {
  const std::string mine = describe(desc);
  if (got.seq != seq) {
    std::string what = "rank " + std::to_string(peer) + " sent data of its collective #" + std::to_string(got.seq) +
                       " to rank " + std::to_string(rank) + ", which is in collective #" + std::to_string(seq) + " " +
                       mine + ": the ranks did not call the same sequence of collectives";
    if (theirs_at_got_seq) what += " (rank " + std::to_string(peer) + " is in " + describe(*theirs_at_got_seq) + ")";
    throw Error(ErrorKind::kMismatch, what, peer);
  }
  if (got.desc_hash != desc.hash()) {
    if (theirs_at_seq) throw descriptor_mismatch(rank, peer, seq, desc, *theirs_at_seq);
    throw Error(ErrorKind::kMismatch,
                "collective #" + std::to_string(seq) + " differs between rank " + std::to_string(rank) + " " + mine +
                    " and rank " + std::to_string(peer),
                peer);
  }
  throw Error(ErrorKind::kMismatch,
              "rank " + std::to_string(peer) + " sent a message of " + std::to_string(got.msg_bytes) +
                  " bytes where rank " + std::to_string(rank) + " expected " + std::to_string(expected_msg_bytes) +
                  " in collective #" + std::to_string(seq) + " " + mine + sizes_hint(rank, peer, desc),
              peer);
}

void throw_count_mismatch(int rank, int peer, uint32_t got, uint32_t expected, uint64_t seq, const Descriptor& desc) {
  throw Error(ErrorKind::kMismatch,
              "rank " + std::to_string(peer) + " sent an encoded message of " + std::to_string(got) +
                  " elements where rank " + std::to_string(rank) + " expected " + std::to_string(expected) +
                  " (both encode into as many bytes) in collective #" + std::to_string(seq) + " " + describe(desc) +
                  sizes_hint(rank, peer, desc),
              peer);
}

std::string sizes_hint(int rank, int peer, const Descriptor& desc) {
  if (desc.collective != kAllToAll) return "";
  return ": rank " + std::to_string(peer) + "'s send_counts[" + std::to_string(rank) + "] must equal rank " +
         std::to_string(rank) + "'s recv_counts[" + std::to_string(peer) + "]";
}

std::string reported_by(int rank, const std::string& message) {
  if (message.rfind("(reported by rank", 0) == 0) return message;
  return "(reported by rank " + std::to_string(rank) + ") " + message;
}

}  // namespace pycoll
