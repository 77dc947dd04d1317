// Where the user called a collective from (the flight recorder's call sites, engine/flight_recorder.h):
// the innermost Python frame outside pycoll's own files (and torch's, once the torch layer registers
// them), as "file:line in function". Called with the GIL held, on every recorded collective.
#pragma once

#include <string>
#include <vector>

namespace pycoll::python {

// The calling thread's call site id (FlightRecorder::site_id), or -1 (recording off, no Python frame
// outside the internal files).
int call_site();
// Files under these directories are internal: their frames are skipped.
void add_internal_paths(const std::vector<std::string>& prefixes);

}  // namespace pycoll::python
