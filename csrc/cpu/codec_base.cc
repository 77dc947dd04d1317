#define PYCOLL_ISA_NS base
#include "cpu/codec_loops.h"
