#define PYCOLL_ISA_NS base
#include "cpu/rotation_loops.h"
