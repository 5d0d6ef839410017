// emit_cuda: raw IR -> CUDA C++ for NVRTC.
//
// CudaEmitter is an IRPrinter that spells loads and stores as 16-byte (or narrower) vector
// instructions with a scalar fallback, shuffles as __shfl_xor_sync, barriers as
// __syncthreads or a named bar.sync per program, and prepends the device helpers
// (device/tile_device.cuh). Text only, no CUDA header: compiled in builds without CUDA too,
// where the no-CUDA target (src/backend/no_cuda/) still returns the source. Tested by
// tests/backend/cuda/emit_cuda_test.cpp.
#pragma once

#include <string>
#include <string_view>

#include "ir/ir.hpp"

namespace tile::cuda {

// The text of src/backend/cuda/device/tile_device.cuh, embedded at build time.
std::string_view device_source();

// A complete translation unit defining `extern "C" __global__ void <kernel.name>(...)`.
// Parameters follow kernel.buffers, then kernel.params. `header_comment` is printed first.
std::string emit_cuda(const ir::Kernel& kernel, const std::string& header_comment = "");

}  // namespace tile::cuda
