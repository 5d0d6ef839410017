// The CUDA target of a build without CUDA (TILE_WITH_CUDA=OFF): it declares CUDA's caps and
// limits, so plans and IR are those a CUDA build would make, and still returns the generated
// CUDA source (the emitter prints text and needs no CUDA header); only launch() is refused.
#include "backend/cuda/emit_cuda.hpp"
#include "target/target.hpp"

namespace tile {

namespace {

class NoCudaTarget final : public Target {
 public:
  const char* name() const override { return "cuda"; }
  TargetCaps caps() const override {  // can_launch stays false
    TargetCaps c;
    c.max_cluster_size = 16;  // as the CUDA target declares before a device lowers it
    return c;
  }
  DeviceLimits limits(const CallOptions&) const override { return with_caps(DeviceLimits{}, caps()); }

  std::string source(const PreparedKernel& pk) const override {
    return cuda::emit_cuda(pk.lowered.main.kernel, source_header(pk));
  }

  LaunchRecord launch(const PreparedKernel&, const BoundCall& call, const CallOptions&) const override {
    throw NoDriverError(call.program->name() +
                        ": no CUDA backend: Tile was built without CUDA (TILE_WITH_CUDA=OFF); run on the CPU "
                        "backend (Backend::cpu) or rebuild with -DTILE_WITH_CUDA=ON");
  }
};

}  // namespace

const Target& cuda_target() {
  static const NoCudaTarget target;
  return target;
}

}  // namespace tile
