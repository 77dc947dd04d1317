#define PYCOLL_ISA_NS base
#include "cpu/reduce_loops.h"
