// A small C++ LibTorch training program, unaware of nanhunt. It trains a
// linear model for a few steps; at step `overflow_step` (argv[1], default
// 3) its forward pass also computes an fp16 dot product that overflows.
// argv[3]: micro-batches of gradient accumulation per update (default 1);
// the overflow is in the step's last one. argv[4] "first-layer": the
// overflow is the model's own instead, in its first op: fp16 autocast casts
// an input scaled past 65504 inside the linear layer. argv[4] "nan-weight":
// no overflow, but the weight holds a NaN from the start, written to its
// memory as loading a checkpoint that diverged does (no op of the run made it).
// Losses are printed as hex floats so runs can be compared bit for bit.
#include <torch/torch.h>

#include <ATen/autocast_mode.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  const int overflow_step = argc > 1 ? std::atoi(argv[1]) : 3;
  const int steps = argc > 2 ? std::atoi(argv[2]) : 6;
  const int micro_batches = argc > 3 ? std::atoi(argv[3]) : 1;
  const bool in_first_layer = argc > 4 && std::string(argv[4]) == "first-layer";
  const bool nan_weight = argc > 4 && std::string(argv[4]) == "nan-weight";
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  if (nan_weight) model->weight.data_ptr<float>()[3] = NAN;
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor loss;
    for (int micro_batch = 0; micro_batch < micro_batches; ++micro_batch) {
      const bool overflow = step == overflow_step && micro_batch == micro_batches - 1;
      torch::Tensor out;
      if (in_first_layer) {
        at::autocast::set_autocast_dtype(at::kCPU, at::kHalf);
        at::autocast::set_autocast_enabled(at::kCPU, true);
        out = model->forward(overflow ? x * 1e5 : x).to(torch::kFloat);
        at::autocast::set_autocast_enabled(at::kCPU, false);
        at::autocast::clear_cache();
      } else {
        out = model->forward(x);
      }
      if (overflow && !in_first_layer) {
        const torch::Tensor h = torch::full({4}, 300.0, torch::kHalf);
        const torch::Tensor score = torch::matmul(h, h);  // 360000 > 65504
        std::printf("score %f\n", score.item<float>());
      }
      loss = torch::mse_loss(out, y);
      loss.backward();
    }
    optimizer.step();
    std::printf("step %d loss %a\n", step, loss.item<float>());
  }
  return 0;
}
