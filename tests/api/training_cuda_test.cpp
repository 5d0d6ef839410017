// The training operators on the CUDA backend against the float64 references of
// tests/support/training_cases.hpp: the CPU sweep's cases and longer rows (to 262144 columns),
// the plans that take every lowering path, and reductions over the rows bitwise identical from
// run to run on the device.
#include "support/training_cases.hpp"

namespace tile::testing {
namespace {

class TrainingCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::driver_available()) GTEST_SKIP() << "no CUDA driver: GPU tests need a GPU";
  }
};

using TrainingCudaSanitizerSubset = TrainingCuda;

TEST_F(TrainingCuda, SeededSweep) {
  std::printf("device: %s\n", cuda::device_info(0).name.c_str());
  for (const TrainCase& c : train_sweep(262144)) expect_train_case_passes(c, Backend::cuda);
}

TEST_F(TrainingCuda, Float64Calls) {
  for (const TrainCase& c : train_sweep_f64(262144)) expect_train_case_passes(c, Backend::cuda);
}

TEST_F(TrainingCuda, EveryOperatorOnEveryLoweringPath) {
  uint64_t seed = 19000;
  std::vector<PlanRequest> plans(1);  // the policy's plan, then every other lowering path
  for (const PlanRequest& p : plan_variants()) plans.push_back(p);
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op)
    for (const PlanRequest& plan : plans)
      for (auto [rows, cols, pad, offset] :
           {std::tuple<int64_t, int64_t, int64_t, int64_t>{37, 1537, 0, 1}, {64, 4096, 0, 0}, {5, 32000, 8, 0}}) {
        TrainCase c;
        c.op = TrainOp(op), c.rows = rows, c.cols = cols, c.pad = pad, c.offset = offset, c.plan = plan,
        c.seed = seed++;
        c.in = c.out = seed % 2 ? DType::bf16 : DType::f32;
        c.special = true;
        c.ce.label_smoothing = 0.05, c.ce.z_loss = 1e-4;
        c.ce.reduction = Reduction(seed % 3);
        expect_train_case_passes(c, Backend::cuda);
      }
}

// Cross-entropy at the vocabularies of the benchmarks, bf16 logits, each form.
TEST_F(TrainingCuda, CrossEntropyAtVocabularySizes) {
  uint64_t seed = 19500;
  for (int64_t vocab : {32000, 50257, 128256, 151936, 262144})
    for (TrainOp op : {TrainOp::cross_entropy, TrainOp::cross_entropy_backward, TrainOp::cross_entropy_fused}) {
      TrainCase c;
      c.op = op, c.rows = 16, c.cols = vocab, c.in = c.out = DType::bf16, c.seed = seed++;
      c.in_place = op == TrainOp::cross_entropy_fused;
      c.ce.reduction = Reduction::mean, c.ce.label_smoothing = 0.1, c.ce.z_loss = 1e-4;
      if (vocab == 262144) c.ce.softcap = 30.0;
      expect_train_case_passes(c, Backend::cuda);
    }
}

TEST_F(TrainingCuda, ReductionsOverTheRowsAreBitwiseIdenticalFromRunToRun) {
  uint64_t seed = 19900;
  for (TrainOp op : {TrainOp::rms_norm_backward, TrainOp::layer_norm_backward, TrainOp::fused_add_rms_norm_backward,
                     TrainOp::cross_entropy, TrainOp::cross_entropy_fused})
    for (int64_t cols : {1000, 4096, 16384, 32768}) {  // the weight gradients on clusters from 16384
      TrainCase c;
      // Many rows per workspace slot; the float64 references on the host bound the size.
      c.op = op, c.rows = std::min<int64_t>(4096, (int64_t(1) << 23) / cols), c.cols = cols, c.seed = seed++;
      c.in = DType::bf16, c.w = DType::f32;
      c.ce.reduction = Reduction::mean;
      SCOPED_TRACE(c.name());
      const TrainResult a = run_train_case(c, Backend::cuda);
      EXPECT_TRUE(a.cmp.ok) << a.cmp.first;
      for (int k = 0; k < 3; ++k) {
        const TrainResult b = run_train_case(c, Backend::cuda);
        for (const char* name : {"dweight", "dbias", "loss", "count"})
          if (a.outputs.count(name)) {
            EXPECT_EQ(a.outputs.at(name), b.outputs.at(name)) << name;
          }
      }
    }
}

TEST_F(TrainingCudaSanitizerSubset, RepresentativeCases) {
  uint64_t seed = 19950;
  for (int op = 0; op <= int(TrainOp::cross_entropy_fused); ++op)
    // 40 x 20000: the weight gradients on clusters of 8 groups looping over row blocks.
    for (auto [rows, cols, offset] :
         {std::tuple<int64_t, int64_t, int64_t>{37, 1537, 1}, {3, 70000, 0}, {40, 20000, 0}}) {
      TrainCase c;
      c.op = TrainOp(op), c.rows = rows, c.cols = cols, c.offset = offset, c.in = DType::bf16, c.seed = seed++;
      c.ce.reduction = Reduction(seed % 3);
      c.in_place = op == int(TrainOp::cross_entropy_fused) || op == int(TrainOp::fused_add_rms_norm);
      c.out = c.in;
      expect_train_case_passes(c, Backend::cuda);
    }
}

}  // namespace
}  // namespace tile::testing
