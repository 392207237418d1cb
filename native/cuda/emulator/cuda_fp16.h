// cuda_fp16.h: the CUDA emulator stands in for it (kvg_cuda_emulator.h).
#include "kvg_cuda_emulator.h"
