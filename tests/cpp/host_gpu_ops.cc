// GPU ops on a machine without a GPU, for the tests of the torch plugin's
// GPU path (tests/integration/test_host_gpu.py) and bench/gpu_op_cost.py.
// Each op is computed by the CPU and shown to nanhunt's callbacks as the
// same op on cuda:0, through a RecordFunction made as torch's dispatcher
// makes one: its tensors are CUDA tensors over the CPU results' memory,
// its stream comes from a stand-in CUDA device guard. Under the preload
// with tests/cpp/host_gpu_library.cc as libnanhunt_cuda.so, the plugin
// enqueues their checks and judges their results late, as on a GPU. Knows
// nothing of nanhunt.
//
//   host_gpu_ops overflow STEP STEPS [named-steps]
//                                     a training loop (real CPU steps) whose
//                                     GPU mm overflows fp16 at step STEP;
//                                     named-steps: each optimizer step in the
//                                     record Python's optimizers make
//   host_gpu_ops capture              GPU ops on a stream capturing a graph
//   host_gpu_ops devices              ops on two GPUs and a side stream
//   host_gpu_ops in-place             an output overflowed in place by the
//                                     next op
//   host_gpu_ops released             an output whose storage gives its
//                                     memory back before the next op
//   host_gpu_ops casts-and-fills      a cast to fp16 past its limit, a
//                                     zero_ and a zeros (nested copy_, fill_)
//   host_gpu_ops async-copy           fp16 GPU values copied into a host
//                                     fp32 buffer with non_blocking=True
//   host_gpu_ops mask-constants       masks of torch.finfo(dtype).min, one
//                                     cast to fp16 (-inf)
//   host_gpu_ops scaled-gradients [forward]
//                                     a loss scale in use (a real CPU
//                                     _amp_update_scale_ at each step's
//                                     end), and in backward a GPU matmul
//                                     near fp16's limit at step 1 and past
//                                     it at step 2; forward: that matmul
//                                     runs in the forward pass instead
//   host_gpu_ops own-loss-scaler [accumulate|captured]
//                                     a loss scaler of the program's own:
//                                     8 iterations, each begun by a GPU
//                                     linear of a GPU parameter; a GPU matmul of
//                                     the backward pass overflows fp16 in
//                                     iterations 0, 1 and 4, and the
//                                     program, reading its flag on the host
//                                     (.item() of a GPU value), frees the
//                                     gradients and skips those updates;
//                                     accumulate: 2 micro-batches an
//                                     update, gradients held until its
//                                     end; micro-batch 0 overflows, and
//                                     update 0 is skipped after micro-
//                                     batch 1 (the flag read each time);
//                                     captured: each iteration's linear
//                                     but the first on a stream capturing
//                                     a CUDA graph
//   host_gpu_ops given-up [first]     8 iterations, of which the program
//                                     gives 3 and 4 up before their
//                                     backward pass: a GPU mul overflows
//                                     fp16, and the program reads its
//                                     loss's verdict on the host; first:
//                                     0 and 1, before anything trained
//   host_gpu_ops gan                  4 iterations of a GAN: a
//                                     discriminator's update, then a
//                                     generator's, each begun by a GPU
//                                     linear of its GPU parameter; the
//                                     generator's GPU mul overflows fp16
//                                     in iteration 1. Each update's
//                                     optimizer is named inside its record
//                                     as the Python step guard names it
//   host_gpu_ops dropped [kept]       a softmax's NaN over a fully masked
//                                     row, zeroed right after, each step,
//                                     with results arriving after the
//                                     step's optimizer step; kept: the
//                                     softmaxes kept in a list
//   host_gpu_ops spectral             an fp16 FFT as FNO models run one on
//                                     a GPU: its complex32 spectrum
//                                     overflows at the zero frequency, a
//                                     strided scaled copy of it passes the
//                                     inf on, and the inverse FFT after it
//   host_gpu_ops batch-norm           model.half()'s batch norm on raw
//                                     features: native_batch_norm updates
//                                     its fp16 running_var in place (its
//                                     schema does not say so) past 65504
//                                     and returns finite values
//   host_gpu_ops load-checkpoint [gpu]
//                                     load_state_dict of a checkpoint
//                                     loaded on the host whose weight holds
//                                     a NaN: its copy_ into the GPU
//                                     parameter, then a linear of it; gpu:
//                                     loaded straight onto the GPU (no op
//                                     wrote it there that nanhunt checks)
//   host_gpu_ops loaded-state [unread]
//                                     a resumed Adam whose exp_avg_sq, loaded
//                                     straight onto the GPU, holds an inf:
//                                     the step guard tells nanhunt before
//                                     the update, which mul_s it in place
//                                     and addcmul_s it; unread: as when the
//                                     step guard could not read it
//   host_gpu_ops unwritten            GPU memory no op wrote, with an inf
//                                     in its last rows, read a part at a
//                                     time by two mms
//   host_gpu_ops loop N               N small GPU adds (bench/gpu_op_cost.py)
#include <dlfcn.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <chrono>
#include <thread>
#include <functional>
#include <string>
#include <vector>

#include "interpose/torch/torch_compat.h"
#include "tests/cpp/host_gpu.h"

namespace {

constexpr int kDevices = 2;  // cuda:0 and cuda:1
constexpr c10::StreamId kSideStreamId = 5;  // a stream of torch.cuda.Stream()
thread_local c10::DeviceIndex t_device = 0;
thread_local c10::StreamId t_stream[kDevices] = {0, 0};  // each device's current stream

c10::Device Cuda(c10::DeviceIndex index) { return c10::Device(c10::DeviceType::CUDA, index); }

// The cudaStream_t of a stand-in stream: its id.
void* StandInHandle(const c10::Stream& s) {
  return reinterpret_cast<void*>(static_cast<intptr_t>(s.id()));
}

// CUDA as far as the plugin asks (devices and streams), with no driver.
class HostGpuGuard final : public c10::impl::DeviceGuardImplInterface {
 public:
  c10::DeviceType type() const override { return c10::DeviceType::CUDA; }
  c10::Device exchangeDevice(c10::Device d) const override {
    const c10::Device old = getDevice();
    t_device = d.index();
    return old;
  }
  c10::Device getDevice() const override { return Cuda(t_device); }
  void setDevice(c10::Device d) const override { t_device = d.index(); }
  void uncheckedSetDevice(c10::Device d) const noexcept override { t_device = d.index(); }
  // noexcept: torch 2.6 and older declare them so (a stricter override
  // is right for every version).
  c10::Stream getStream(c10::Device device) const noexcept override {
    return c10::Stream(c10::Stream::UNSAFE, device, t_stream[device.index()]);
  }
  c10::Stream exchangeStream(c10::Stream s) const noexcept override {
    const c10::Stream old = getStream(s.device());
    t_stream[s.device_index()] = s.id();
    return old;
  }
  c10::DeviceIndex deviceCount() const noexcept override { return kDevices; }
#if NANHUNT_TORCH_AT_LEAST(2, 11)
  void* getStreamNativeHandle(const c10::Stream s) const override {
    return StandInHandle(s);
  }
#endif
};

// A CUDA tensor on `device` over `host`'s memory, which it keeps alive.
at::Tensor OnGpu(const at::Tensor& host, c10::DeviceIndex device = 0) {
  return at::from_blob(host.data_ptr(), host.sizes(), host.strides(),
                       [keep = host](void*) {}, host.options().device(Cuda(device)),
                       Cuda(device));
}

// How an op's values are computed on the host: by ATen ops, hidden from
// the callbacks by a RecordFunctionGuard, or by plain C++ (the loop that
// bench/gpu_op_cost.py counts: with callbacks registered, each guard
// rebuilds torch's callback list, thousands of instructions no GPU op
// costs).
enum class OnHost { kAtenOps, kPlainCpp };

// `name`.`overload` with `inputs` on the GPU: computed by `on_host` (with
// no RecordFunction of its own), seen by callbacks as the dispatcher shows
// an op.
at::Tensor GpuOp(const char* name, const char* overload, std::vector<c10::IValue> inputs,
                 const std::function<at::Tensor()>& on_host, OnHost how = OnHost::kAtenOps) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  at::RecordFunction record(at::RecordScope::FUNCTION);
  record.before(std::cref(op.schema()),
                c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  at::Tensor host;
  if (how == OnHost::kPlainCpp) {
    host = on_host();
  } else {
    at::RecordFunctionGuard off(false);
    host = on_host();
  }
  // On its first operand's device, as a CUDA op's result is.
  c10::DeviceIndex device = 0;
  for (const c10::IValue& v : inputs) {
    if (v.isTensor()) {
      device = v.toTensor().device().index();
      break;
    }
  }
  at::Tensor out = OnGpu(host, device);
  if (record.isActive()) record.setOutputs(std::vector<c10::IValue>{out});
  return out;
}

at::Tensor HostOf(const at::Tensor& t) {  // the memory a CUDA tensor here lies in
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(),
                       t.options().device(at::kCPU));
}

at::Tensor Mm(const at::Tensor& a, const at::Tensor& b) {
  return GpuOp("aten::mm", "", {a, b}, [&] {
    return at::mm(HostOf(a).to(at::kFloat), HostOf(b).to(at::kFloat)).to(a.scalar_type());
  });
}

at::Tensor Add(const at::Tensor& a, const at::Tensor& b) {
  return GpuOp("aten::add", "Tensor", {a, b, c10::Scalar(1)},
               [&] { return at::add(HostOf(a), HostOf(b)); });
}

// Its result is every other column of a buffer of NaN: a strided output,
// which the check must read value by value, never the NaN between.
at::Tensor Mul(const at::Tensor& a, const at::Tensor& b) {
  return GpuOp("aten::mul", "Tensor", {a, b}, [&] {
    const at::Tensor product = at::mul(HostOf(a), HostOf(b));
    at::Tensor buffer = at::full({product.size(0), 2 * product.size(1)}, NAN, product.options());
    at::Tensor every_other = buffer.slice(1, 0, buffer.size(1), 2);
    every_other.copy_(product);
    return every_other;
  });
}

// Set-up the training script would do where nanhunt does not look (data
// loading): no RecordFunction.
at::Tensor Unseen(const std::function<at::Tensor()>& make) {
  at::RecordFunctionGuard off(false);
  return make();
}

// An op that writes `out` (by `body`, whose nested ops the callbacks see)
// and returns it: in place, or as torch's composite kernels return a fresh
// tensor their nested ops wrote. The output is `out` itself, which keeps
// its memory alive while a check of it is held back.
at::Tensor OpWriting(const char* name, const char* overload, std::vector<c10::IValue> inputs,
                     const at::Tensor& out, const std::function<void()>& body) {
  const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
  at::RecordFunction record(at::RecordScope::FUNCTION);
  record.before(std::cref(op.schema()),
                c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  body();
  if (record.isActive()) record.setOutputs(std::vector<c10::IValue>{out});
  return out;
}

// An fp16 tensor of `value`s on `device`, made where nanhunt does not look
// (data loading).
at::Tensor GpuFull(at::IntArrayRef sizes, double value, c10::DeviceIndex device = 0) {
  return OnGpu(Unseen([&] { return torch::full(sizes, value, torch::kHalf); }), device);
}

// A parameter on the GPU: `value` everywhere, requiring grad.
at::Tensor GpuParameter(at::IntArrayRef sizes, double value) {
  at::Tensor p = GpuFull(sizes, value);
  p.set_requires_grad(true);
  return p;
}

// A linear layer without bias on the GPU: a forward pass's first op.
at::Tensor GpuLinear(const at::Tensor& input, const at::Tensor& weight) {
  return GpuOp("aten::linear", "", {input, weight, c10::IValue()},
               [&] { return at::linear(HostOf(input), HostOf(weight)); });
}

// Real CPU training around the GPU ops, so that there are steps: at step
// `overflow_step` the GPU matmul's fp16 result overflows (16 x 300 x 300
// = 1,440,000 > 65504) and the ops after it only pass the inf on.
int Overflow(int overflow_step, int steps, bool named_steps) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  for (int step = 0; step < steps; ++step) {
    optimizer.zero_grad();
    torch::Tensor out = model->forward(x);
    const double value = step == overflow_step ? 300.0 : 1.0;
    const at::Tensor host_a = Unseen([&] { return torch::full({16, 16}, value, torch::kHalf); });
    const at::Tensor a = OnGpu(host_a);
    const at::Tensor h = Mm(a, a);
    // A transposed (non-contiguous) operand, and a strided result.
    const at::Tensor sum = Add(h, OnGpu(host_a.t()));
    Mul(sum, sum);
    torch::Tensor loss = torch::mse_loss(out, y);
    loss.backward();
    if (named_steps) {
      RECORD_USER_SCOPE("Optimizer.step#SGD.step");
      optimizer.step();
    } else {
      optimizer.step();
    }
    std::printf("step %d loss %a\n", step, loss.item<float>());
  }
  return 0;
}

// Ops on a stream capturing a graph are left unchecked, and named.
int Capture() {
  const at::Tensor a = GpuFull({8, 8}, 1.0);
  Mm(a, a);
  t_stream[0] = kHostGpuCapturingStreamId;
  const at::Tensor h = Mm(a, a);
  Add(h, h);
  t_stream[0] = 0;
  Add(a, a);
  std::printf("captured 2 ops\n");
  return 0;
}

// Ops on cuda:0, on a side stream of cuda:0, and on cuda:1, where the
// last one overflows (300 * 300 > 65504): each checked on its own device
// and stream (HOST_GPU_LOG shows where), the origin the cuda:1 mul.
int Devices() {
  const at::Tensor a = GpuFull({16, 16}, 1.0, 0);
  const at::Tensor b = GpuFull({16, 16}, 300.0, 1);
  Mm(a, a);
  t_stream[0] = kSideStreamId;  // torch.cuda.stream(side)
  Add(a, a);
  t_stream[0] = 0;
  Mul(b, b);
  std::printf("ran on 2 devices\n");
  return 0;
}

// An output overflowed in place by the next op (2 * 2 * 40000 > 65504): a
// check held back for a batch must be enqueued before that write, or it
// would read the inf and name the mul, not the mul_.
int InPlace() {
  const at::Tensor a = GpuFull({16, 16}, 2.0);
  const at::Tensor y = Mul(a, a);
  OpWriting("aten::mul_", "Scalar", {y, c10::Scalar(40000.0)}, y,
            [&] { Unseen([&] { return HostOf(y).mul_(40000.0); }); });
  std::printf("overflowed in place\n");
  return 0;
}

// An output whose storage gives its memory back (FSDP's resize_(0))
// before its held check is enqueued: dropped, not read.
int Released() {
  const at::Tensor a = GpuFull({8, 8}, 2.0);
  at::Tensor doomed = Mul(a, a);
  doomed.storage().unsafeGetStorageImpl()->set_nbytes(0);
  Add(a, a);
  std::printf("released 1 output\n");
  return 0;
}

// A fresh GPU tensor whose values are garbage (torch.empty).
at::Tensor Fresh(at::IntArrayRef sizes, at::ScalarType dtype) {
  return OnGpu(Unseen([&] { return torch::empty(sizes, torch::TensorOptions().dtype(dtype)); }));
}

// src.to(dtype) as torch runs it: _to_copy writes a fresh tensor with a
// nested copy_.
at::Tensor Cast(const at::Tensor& src, at::ScalarType dtype) {
  const at::Tensor out = Fresh(src.sizes(), dtype);
  return OpWriting("aten::_to_copy", "", {src, dtype, c10::IValue(), c10::IValue(),
                                          c10::IValue(), false, c10::IValue()},
                   out, [&] {
                     OpWriting("aten::copy_", "", {out, src, false}, out, [&] {
                       Unseen([&] { return HostOf(out).copy_(HostOf(src)); });
                     });
                   });
}

// t.zero_() on a GPU: a nested fill_.
at::Tensor Zero(const at::Tensor& t) {
  return OpWriting("aten::zero_", "", {t}, t, [&] {
    OpWriting("aten::fill_", "Scalar", {t, c10::Scalar(0.0)}, t,
              [&] { Unseen([&] { return HostOf(t).zero_(); }); });
  });
}

// torch.zeros on a GPU: zero_ of a fresh tensor, nested.
at::Tensor Zeros(at::IntArrayRef sizes) {
  const at::Tensor out = Fresh(sizes, at::kHalf);
  return OpWriting("aten::zeros", "", {sizes.vec(), at::kHalf, c10::IValue(), c10::IValue(),
                                       c10::IValue()},
                   out, [&] { Zero(out); });
}

// Casts and fills, whose nested copy_ and fill_ write the tensor the
// enclosing op returns: 50000 + 50000 is finite in fp32 and past fp16's
// 65504, so the cast to fp16 is an origin; zeroed, the cast's result holds
// finite values again, and adding 2 x 60000 to them is an origin too.
int CastsAndFills() {
  const at::Tensor a = OnGpu(Unseen([] { return torch::full({8, 8}, 50000.0, torch::kFloat); }));
  const at::Tensor x = Add(a, a);
  const at::Tensor h = Cast(x, at::kHalf);
  Zero(h);
  const at::Tensor c = GpuFull({8, 8}, 60000.0);
  OpWriting("aten::add_", "Tensor", {h, c, c10::Scalar(2)}, h,
            [&] { Unseen([&] { return HostOf(h).add_(HostOf(c), 2); }); });
  Zeros({8, 8});
  std::printf("cast 1 tensor, filled 2\n");
  return 0;
}

// Function `symbol` of `library` when the process has loaded it (under
// the preload), else null: the program links neither.
template <typename Function>
Function LoadedSymbol(const char* library, const char* symbol) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
  return handle != nullptr ? reinterpret_cast<Function>(dlsym(handle, symbol)) : nullptr;
}

// torch.load(path, map_location="cpu") of a checkpoint saved after its run
// diverged, then model.load_state_dict: a copy_ of each host tensor into
// its GPU parameter, and the first forward op reads it. `onto_gpu`: torch.load
// put it on the GPU (its bytes copied as uint8, which nanhunt does not
// check), and the copy_ is from GPU to GPU. `named`: the parameter's name
// is told to nanhunt around the copy, as step_guard.py's load_state_dict
// wrapper does (nanhunt_loading_into, nanhunt_loading_done).
int LoadCheckpoint(bool onto_gpu, bool named) {
  const at::Tensor weight = GpuParameter({4, 8}, 0.5);
  const at::Tensor on_host = Unseen([] {
    at::Tensor t = torch::full({4, 8}, 0.25, torch::kHalf);
    t[1][3] = NAN;
    return t;
  });
  const at::Tensor saved = onto_gpu ? OnGpu(on_host) : on_host;
  using Into = void (*)(const void*, const char*);
  using Done = void (*)();
  static const Into into = LoadedSymbol<Into>("libnanhunt_torch.so", "nanhunt_loading_into");
  static const Done done = LoadedSymbol<Done>("libnanhunt_torch.so", "nanhunt_loading_done");
  if (named && into != nullptr) into(weight.storage().data(), "parameter 0.weight");
  OpWriting("aten::copy_", "", {weight, saved, false}, weight,
            [&] { Unseen([&] { return HostOf(weight).copy_(on_host); }); });
  if (named && done != nullptr) done();
  GpuLinear(GpuFull({2, 8}, 1.0), weight);
  std::printf("loaded 1 parameter\n");
  return 0;
}

// Masks as Hugging Face builds them, of torch.finfo(dtype).min: fp32
// scores masked_fill'ed with fp32's, cast to fp16 (-inf: autocast does it
// to scaled_dot_product_attention's attn_mask); fp16 scores filled with
// fp16's own 65504 by torch.where. Masks, neither an origin nor a warning.
int MaskConstants() {
  const at::Tensor above = OnGpu(Unseen([] { return torch::ones({8, 8}, torch::kBool).triu(1); }));
  const at::Tensor scores = OnGpu(Unseen([] { return torch::linspace(-4, 4, 64).view({8, 8}); }));
  const double fp32_min = -3.4028234663852886e38, fp16_min = -65504.0;
  const at::Tensor masked =
      GpuOp("aten::masked_fill", "Scalar", {scores, above, c10::Scalar(fp32_min)},
            [&] { return HostOf(scores).masked_fill(HostOf(above), fp32_min); });
  Cast(masked, at::kHalf);
  const at::Tensor half = Cast(scores, at::kHalf);
  GpuOp("aten::where", "ScalarOther", {above, half, c10::Scalar(fp16_min)},
        [&] { return at::where(HostOf(above), c10::Scalar(fp16_min), HostOf(half)); });
  // An additive mask, (1.0 - keep) * -1e9: torch wraps -1e9 into a host
  // tensor, past fp16's range, and the product is -inf where masked.
  const at::Tensor masked_out = GpuFull({8, 8}, 1.0);  // 1.0 - keep, where all are masked
  at::Tensor number = at::scalar_tensor(-1e9, at::kDouble);
  number.unsafeGetTensorImpl()->set_wrapped_number(true);
  GpuOp("aten::mul", "Tensor", {masked_out, number},
        [&] { return HostOf(masked_out) * -1e9; });
  std::printf("masked 3 ways\n");
  return 0;
}

// host_buffer.copy_(gpu_values, non_blocking=True) into a fp32 buffer that
// still holds NaN from before (a step whose gradients overflowed, say):
// the finite values land after the op returns, as the GPU runs the copy.
int AsyncCopy() {
  const at::Tensor values = GpuFull({8}, 1.0);
  const at::Tensor buffer = Unseen([] { return torch::full({8}, NAN, torch::kFloat); });
  OpWriting("aten::copy_", "", {buffer, values, true}, buffer, [] {});
  Unseen([&] { return buffer.copy_(HostOf(values)); });  // the copy, run later
  const bool finite = Unseen([&] { return buffer.isfinite().all(); }).item<bool>();
  std::printf("copied %s\n", finite ? "finite values" : "NaN");
  return 0;
}

// 16 x value^2 in fp16, on the GPU: 16 x 61^2 = 59536 is 91% of fp16's
// 65504, 16 x 300^2 is past it.
void GpuMatmulOf(double value) {
  const at::Tensor a = GpuFull({16, 16}, value);
  Mm(a, a);
}

double MatmulValueAt(int step) { return step == 1 ? 61.0 : step == 2 ? 300.0 : 1.0; }

// The identity, whose backward runs GpuMatmulOf(`value`) first: a GPU
// op of the backward pass, in the gradients a loss scale scales.
struct GpuOpInBackward : torch::autograd::Function<GpuOpInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               double value) {
    ctx->saved_data["value"] = value;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    GpuMatmulOf(ctx->saved_data["value"].toDouble());
    return {grads[0], torch::Tensor()};
  }
};

// GradScaler's routine: its scale is known from step 0's update on, and
// a matmul of the gradients it scales nears fp16's limit at step 1 and
// passes it at step 2, which the scaler skips. Each step starts with a
// GPU add, and ends after a pause in which the results arrive, as on a
// GPU a step behind.
int ScaledGradients(bool in_forward) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  torch::Tensor scale = torch::full({}, 1024.0);
  torch::Tensor growth_tracker = torch::zeros({}, torch::kInt);
  torch::Tensor found_inf = torch::zeros({});
  for (int step = 0; step < 4; ++step) {
    const at::Tensor one = GpuFull({4}, 1.0);
    Add(one, one);
    optimizer.zero_grad();
    torch::Tensor out = model->forward(x);
    if (in_forward) {
      GpuMatmulOf(MatmulValueAt(step));
    } else {
      out = GpuOpInBackward::apply(out, MatmulValueAt(step));
    }
    torch::Tensor loss = torch::mse_loss(out, y) * scale;
    loss.backward();
    optimizer.step();
    found_inf.fill_(step == 2 ? 1.0 : 0.0);
    at::_amp_update_scale_(scale, growth_tracker, found_inf, 2.0, 0.5, 2000);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::printf("step %d scale %g\n", step, scale.item<double>());
  }
  return 0;
}

// t.item() of a GPU value: the host waits for the GPU and reads it.
double Item(const at::Tensor& t) {
  const c10::OperatorHandle op =
      c10::Dispatcher::singleton().findSchemaOrThrow("aten::_local_scalar_dense", "");
  std::vector<c10::IValue> inputs{t};
  at::RecordFunction record(at::RecordScope::FUNCTION);
  record.before(std::cref(op.schema()),
                c10::ArrayRef<const c10::IValue>(inputs.data(), inputs.size()));
  const double value = Unseen([&] { return HostOf(t).to(at::kFloat); }).item<double>();
  if (record.isActive()) record.setOutputs(std::vector<c10::IValue>{c10::Scalar(value)});
  return value;
}

at::Tensor g_held_gradient;  // OwnLossScaler(accumulate): kept until the update

// The identity, whose backward runs a GPU matmul of 16 x `value`^2 (past
// fp16's limit for 300) and, with `hold`, keeps its result in
// g_held_gradient, as .grad keeps a micro-batch's gradient.
struct GpuGradientInBackward : torch::autograd::Function<GpuGradientInBackward> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, torch::Tensor x,
                               double value, bool hold) {
    ctx->saved_data["value"] = value;
    ctx->saved_data["hold"] = hold;
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const at::Tensor a = GpuFull({16, 16}, ctx->saved_data["value"].toDouble());
    const at::Tensor gradient = Mm(a, a);
    if (ctx->saved_data["hold"].toBool()) g_held_gradient = gradient;
    return {grads[0], torch::Tensor(), torch::Tensor()};
  }
};

int OwnLossScaler(bool accumulate, bool captured) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  const at::Tensor input = GpuFull({4, 4}, 0.5);
  const at::Tensor w = GpuParameter({4, 4}, 1.0);
  int skipped = 0;
  bool inf_in_update = false;  // in any micro-batch of this update
  for (int i = 0; i < 8; ++i) {
    const bool overflow = accumulate ? i == 0 : (i == 0 || i == 1 || i == 4);
    // The iteration's first op: F.linear on the GPU parameter, grad mode
    // on, a composite op (its nested ops unseen here), then a GPU op of
    // the same step on its result.
    if (captured && i > 0) t_stream[0] = kHostGpuCapturingStreamId;
    const at::Tensor h = GpuLinear(input, w);
    t_stream[0] = 0;
    GpuOp("aten::mul", "Tensor", {h, h}, [&] { return at::mul(HostOf(h), HostOf(h)); });
    torch::Tensor out = model->forward(x);
    out = GpuGradientInBackward::apply(out, overflow ? 300.0 : 1.0, accumulate);
    torch::Tensor loss = torch::mse_loss(out, y);
    loss.backward();
    inf_in_update |= overflow;
    // What the program decides by: a verdict on its gradients, computed on
    // the GPU (here: planted), read on the host after each backward pass.
    const bool found_inf = Item(GpuFull({}, inf_in_update ? 1.0 : 0.0)) != 0;
    if (accumulate && i % 2 == 0) continue;  // the next micro-batch
    if (found_inf) {
      ++skipped;  // the gradients freed, the update skipped
    } else {
      optimizer.step();
    }
    optimizer.zero_grad();
    g_held_gradient = at::Tensor();
    inf_in_update = false;
  }
  std::printf("skipped %d updates\n", skipped);
  return 0;
}

// A loop that gives an iteration up on a non-finite loss (`if not
// torch.isfinite(loss): continue`): 8 iterations, each begun by a GPU
// linear of a GPU parameter; in iterations 3 and 4 (with `first`, 0 and
// 1: counted as forward passes until the process trains) its input is
// scaled up
// and the GPU mul after it overflows fp16 (1200^2 > 65504). The program
// reads on the host whether its loss is finite (.item() of a GPU value)
// and goes on to the next batch without a backward pass; the others train
// (real CPU steps, in the record Python's optimizers make).
int GivenUp(bool first) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  const at::Tensor w = GpuParameter({4, 4}, 1.0);
  const at::Tensor b = GpuParameter({4, 4}, 0.0);
  int given_up = 0;
  for (int i = 0; i < 8; ++i) {
    const bool overflow = first ? i < 2 : i == 3 || i == 4;
    const at::Tensor input = GpuFull({4, 4}, overflow ? 300.0 : 0.5);
    const at::Tensor h = GpuLinear(input, w);
    const at::Tensor squared =
        GpuOp("aten::mul", "Tensor", {h, h}, [&] { return at::mul(HostOf(h), HostOf(h)); });
    // A second parameter read: before anything trains, a pass is told by a
    // parameter read again after another (core/step_tracker.h).
    GpuOp("aten::add", "Tensor", {squared, b, c10::Scalar(1)},
          [&] { return at::add(HostOf(squared), HostOf(b)); });
    // The loss's verdict, computed on the GPU (here: planted).
    if (!std::isfinite(Item(GpuFull({}, overflow ? INFINITY : 1.0)))) {
      ++given_up;
      continue;
    }
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    RECORD_USER_SCOPE("Optimizer.step#SGD.step");
    optimizer.step();
  }
  std::printf("gave up %d iterations\n", given_up);
  return 0;
}

// Names optimizer `identity` to nanhunt as step_guard.py's pre-hook does,
// inside its record. Unmonitored: nothing to name it to.
void NameOptimizer(uint64_t identity) {
  using Name = void (*)(uint64_t, int);
  static const Name name = LoadedSymbol<Name>("libnanhunt_torch.so", "nanhunt_optimizer_stepping");
  if (name != nullptr) name(identity, 0);
}

int Gan() {
  torch::manual_seed(0);
  torch::nn::Linear discriminator(8, 1), generator(8, 1);
  torch::optim::SGD d_optimizer(discriminator->parameters(), torch::optim::SGDOptions(0.01));
  torch::optim::SGD g_optimizer(generator->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  const at::Tensor d_weight = GpuParameter({4, 4}, 1.0);
  const at::Tensor g_weight = GpuParameter({4, 4}, 1.0);
  const auto update = [&](torch::nn::Linear& model, torch::optim::SGD& optimizer,
                          const at::Tensor& weight, uint64_t identity, bool overflow) {
    const at::Tensor input = GpuFull({4, 4}, overflow ? 300.0 : 0.5);
    const at::Tensor h = GpuLinear(input, weight);  // begins the update's forward pass
    GpuOp("aten::mul", "Tensor", {h, h}, [&] { return at::mul(HostOf(h), HostOf(h)); });
    optimizer.zero_grad();
    torch::mse_loss(model->forward(x), y).backward();
    RECORD_USER_SCOPE("Optimizer.step#SGD.step");
    NameOptimizer(identity);
    optimizer.step();
  };
  for (int i = 0; i < 4; ++i) {
    update(discriminator, d_optimizer, d_weight, 1, false);
    update(generator, g_optimizer, g_weight, 2, i == 1);
  }
  std::printf("trained 4 iterations\n");
  return 0;
}

// Adam's first update after a resume, on the GPU: its exp_avg_sq, loaded
// with an inf where no op of this run wrote it, is told to nanhunt as
// step_guard.py's pre-hook does (nanhunt_loaded_state), unless `unread`;
// then mul_ and addcmul_ update it in place.
int LoadedState(bool unread) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  const at::Tensor exp_avg_sq = OnGpu(Unseen([] {
    at::Tensor t = torch::full({4, 4}, 0.25, torch::kFloat);
    t[2][1] = INFINITY;
    return t;
  }));
  const at::Tensor grad = GpuFull({4, 4}, 0.5);
  torch::mse_loss(model->forward(x), y).backward();  // a step begins
  {
    RECORD_USER_SCOPE("Optimizer.step#Adam.step");
    torch::NoGradGuard no_grad;  // as torch.optim's step runs
    NameOptimizer(1);
    using Note = void (*)(const void*, int64_t, int64_t, int64_t, int64_t, double, const char*);
    using Done = void (*)();
    static const Note note = LoadedSymbol<Note>("libnanhunt_torch.so", "nanhunt_loaded_state");
    static const Done done = LoadedSymbol<Done>("libnanhunt_torch.so", "nanhunt_loaded_state_done");
    if (note != nullptr && !unread) {
      note(exp_avg_sq.storage().data(), 16, 0, 1, 0, INFINITY,
           "Adam state exp_avg_sq of a parameter");
    }
    OpWriting("aten::mul_", "Scalar", {exp_avg_sq, c10::Scalar(0.999)}, exp_avg_sq,
              [&] { Unseen([&] { return HostOf(exp_avg_sq).mul_(0.999); }); });
    OpWriting("aten::addcmul_", "", {exp_avg_sq, grad, grad, c10::Scalar(0.001)}, exp_avg_sq,
              [&] {
                Unseen([&] {
                  return HostOf(exp_avg_sq).addcmul_(HostOf(grad), HostOf(grad), 0.001);
                });
              });
    if (done != nullptr) done();
  }
  std::printf("updated 1 state\n");
  return 0;
}

// A model loaded with load_state_dict(..., assign=True) from a checkpoint
// torch.load put straight onto the GPU: its weight is the loaded tensor,
// with a NaN no op of this run wrote (the bytes were copied as uint8). It
// is told to nanhunt as step_guard.py's load_state_dict wrapper does
// (nanhunt_loaded_model_tensor), unless `unread`; then the first forward
// pass's mm reads it, and a relu reads the mm's output.
int LoadedParameter(bool unread) {
  at::Tensor weight = OnGpu(Unseen([] {
    at::Tensor t = torch::full({8, 4}, 0.25, torch::kHalf);
    t[3][1] = NAN;
    return t;
  }));
  weight.set_requires_grad(true);
  using Note = void (*)(const void*, int64_t, int64_t, int64_t, int64_t, double, const char*);
  static const Note note =
      LoadedSymbol<Note>("libnanhunt_torch.so", "nanhunt_loaded_model_tensor");
  if (note != nullptr && !unread) {
    note(weight.storage().data(), 32, 1, 0, 0, 0.25, "parameter 0.weight");
  }
  const at::Tensor out = Mm(GpuFull({2, 8}, 1.0), weight);
  GpuOp("aten::relu", "", {out}, [&] { return at::relu(HostOf(out)); });
  std::printf("loaded 1 parameter by assignment\n");
  return 0;
}

// Rows [begin, end) of a contiguous 2-d CUDA tensor here: a view of its
// storage, made on the TensorImpl (no CUDA kernel of torch's here makes
// one; nor do views make values).
at::Tensor Rows(const at::Tensor& t, int64_t begin, int64_t end) {
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(c10::Storage(t.storage()),
                                                             t.key_set(), t.dtype());
  view.unsafeGetTensorImpl()->set_sizes_and_strides({end - begin, t.size(1)}, t.strides());
  view.unsafeGetTensorImpl()->set_storage_offset(begin * t.stride(0));
  return view;
}

// GPU memory no op the callbacks see wrote, as a CUDA extension's kernel, a
// DLPack import, a torch.compile region's fused kernels or torch.load's
// bytes leave it: fp16 [8, 4] with an inf in row 6. One mm reads its first
// four rows (finite), another its last four; a weight made the same way
// is read whole by both.
int Unwritten() {
  const at::Tensor x = OnGpu(Unseen([] {
    at::Tensor t = torch::full({8, 4}, 2.0, torch::kHalf);
    t[6][1] = INFINITY;
    return t;
  }));
  const at::Tensor w = GpuFull({4, 4}, 1.0);
  const at::Tensor first = Mm(Rows(x, 0, 4), w);
  const at::Tensor last = Mm(Rows(x, 4, 8), w);
  Add(first, last);
  std::printf("read 2 parts of unwritten memory\n");
  return 0;
}

std::vector<at::Tensor> g_logged;  // Dropped(kept): the softmaxes, kept

// Under the stand-in library: lets its drain thread deliver all but
// HOST_GPU_LAG results (host_gpu_settle), so that each run delivers the
// same results by the same point. Unmonitored: nothing to wait for.
void SettleResults() {
  using Settle = void (*)();
  static const Settle settle = LoadedSymbol<Settle>("libhost_gpu_library.so", "host_gpu_settle");
  if (settle != nullptr) settle();
}

// Attention written by hand over padded keys (as
// tests/integration/scripts/padded_attention_by_hand.py, on the GPU): the
// keys of the last row are all padding, masked with -inf, so its softmax
// row is NaN, zeroed right after by masked_fill. Around it, real CPU
// training with an optimizer record a step; each step's GPU results arrive
// after its optimizer step ended (HOST_GPU_LAG). kept: the softmaxes are
// also kept in a list, so the NaN outlives every step.
int Dropped(bool kept) {
  torch::manual_seed(0);
  torch::nn::Linear model(8, 1);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.01));
  const torch::Tensor x = torch::randn({16, 8});
  const torch::Tensor y = torch::randn({16, 1});
  const at::Tensor padding = OnGpu(Unseen([] {
    at::Tensor m = torch::zeros({4, 4}, torch::kBool);
    m[3].fill_(true);
    return m;
  }));
  for (int step = 0; step < 4; ++step) {
    optimizer.zero_grad();
    torch::Tensor out = model->forward(x);  // begins the step
    {
      const at::Tensor scores = GpuFull({4, 4}, 0.5);
      const at::Tensor masked =
          GpuOp("aten::masked_fill", "Scalar", {scores, padding, c10::Scalar(-INFINITY)},
                [&] { return HostOf(scores).masked_fill(HostOf(padding), -INFINITY); });
      const at::Tensor weights = GpuOp("aten::_softmax", "", {masked, int64_t{-1}, false}, [&] {
        return at::_softmax(HostOf(masked).to(at::kFloat), -1, false).to(at::kHalf);
      });
      GpuOp("aten::masked_fill", "Scalar", {weights, padding, c10::Scalar(0.0)},
            [&] { return HostOf(weights).masked_fill(HostOf(padding), 0.0); });
      if (kept) g_logged.push_back(weights);
    }  // the NaN softmax is freed here, unless kept
    torch::Tensor loss = torch::mse_loss(out, y);
    loss.backward();
    SettleResults();  // the GPU catches up to 4 results behind
    {
      RECORD_USER_SCOPE("Optimizer.step#SGD.step");
      optimizer.step();
    }
  }
  std::printf("trained 4 steps, %zu softmaxes kept\n", g_logged.size());
  return 0;
}

// a + a for a few fp16 values, with no ATen op on the host: an op as
// small as a GPU op is to the host, and nothing else the callbacks see.
at::Tensor PlainAdd(const at::Tensor& a) {
  const int64_t n = a.numel();
  auto* sum = new c10::Half[n];
  const auto* values = static_cast<const c10::Half*>(a.data_ptr());
  for (int64_t i = 0; i < n; ++i) sum[i] = static_cast<float>(values[i]) * 2.0f;
  return at::from_blob(sum, a.sizes(), [](void* p) { delete[] static_cast<c10::Half*>(p); },
                       a.options().device(at::kCPU));
}

// Prints the loop's own wall time (bench/gpu_op_cost.py --wall): start-up
// and exit are not the ops'.
int Loop(long n) {
  const at::Tensor a = GpuFull({4}, 1.5);
  const auto start = std::chrono::steady_clock::now();
  for (long i = 0; i < n; ++i) {
    GpuOp("aten::add", "Tensor", {a, a, c10::Scalar(1)}, [&] { return PlainAdd(a); },
          OnHost::kPlainCpp);
  }
  const std::chrono::duration<double> took = std::chrono::steady_clock::now() - start;
  std::printf("looped %ld in %.6f s\n", n, took.count());
  return 0;
}

// 64 fp16 values of 2000 sum to 128000 at the zero frequency: past fp16's
// 65504, inf in the complex32 spectrum (computed in complex64 here: the
// CPU has no fp16 FFT). Its scaled copy is every other column of a buffer
// of NaN, so a check that read its real and imaginary parts as anything
// but the view_as_real layout would count NaN that is not in it.
int Spectral() {
  const at::Tensor signal = GpuFull({4, 64}, 2000.0);
  const std::vector<int64_t> last_dim = {1};
  const at::Tensor spectrum = GpuOp(
      "aten::_fft_r2c", "", {signal, c10::IValue(last_dim), int64_t{0}, true}, [&] {
        return at::fft_rfft(HostOf(signal).to(at::kFloat)).to(at::kComplexHalf);
      });
  const at::Tensor scaled = GpuOp("aten::mul", "Scalar", {spectrum, c10::Scalar(0.5)}, [&] {
    const at::Tensor product = HostOf(spectrum).to(at::kComplexFloat) * 0.5;
    at::Tensor buffer = at::full({product.size(0), 2 * product.size(1)},
                                 c10::complex<float>(NAN, NAN), product.options());
    buffer.slice(1, 0, buffer.size(1), 2).copy_(product);
    return buffer.to(at::kComplexHalf).slice(1, 0, buffer.size(1), 2);
  });
  const at::Tensor restored = GpuOp(
      "aten::_fft_c2r", "", {scaled, c10::IValue(last_dim), int64_t{0}, int64_t{64}}, [&] {
        return at::fft_irfft(HostOf(scaled).to(at::kComplexFloat), 64).to(at::kHalf);
      });
  std::printf("restored %s\n", c10::toString(restored.scalar_type()));
  return 0;
}

int BatchNorm() {
  // A feature from 0 to 63000 (an income in dollars): variance 3.3e8.
  const at::Tensor x = OnGpu(Unseen([] {
    return (torch::arange(64, torch::kFloat) * 1000).reshape({64, 1}).expand({64, 3}).to(
        torch::kHalf);
  }));
  const at::Tensor weight = GpuFull({3}, 1.0), bias = GpuFull({3}, 0.0);
  const at::Tensor running_mean = GpuFull({3}, 0.0), running_var = GpuFull({3}, 1.0);
  const at::Tensor y = GpuOp(
      "aten::native_batch_norm", "",
      {x, weight, bias, running_mean, running_var, true, 0.1, 1e-5}, [&] {
        at::Tensor mean = HostOf(running_mean).to(at::kFloat);
        at::Tensor var = HostOf(running_var).to(at::kFloat);
        const auto result = at::native_batch_norm(HostOf(x).to(at::kFloat),
                                                  HostOf(weight).to(at::kFloat),
                                                  HostOf(bias).to(at::kFloat), mean, var,
                                                  true, 0.1, 1e-5);
        HostOf(running_mean).copy_(mean);
        HostOf(running_var).copy_(var);  // 3.3e7 in fp16: inf
        return std::get<0>(result).to(at::kHalf);
      });
  std::printf("normalised %s\n", c10::toString(y.scalar_type()));
  return 0;
}

}  // namespace

#if !NANHUNT_TORCH_AT_LEAST(2, 11)
// Before torch 2.11 the plugin asks libc10_cuda's CUDAStream::stream() for
// a stream's handle (interpose/torch/torch_compat.h), looked up in the
// whole process first: this definition, exported by the program
// (ENABLE_EXPORTS), stands in for it as HostGpuGuard does for CUDA's guard.
extern "C" __attribute__((visibility("default"))) void* HostGpuCudaStreamHandle(
    const c10::Stream* s) __asm__("_ZNK3c104cuda10CUDAStream6streamEv");
void* HostGpuCudaStreamHandle(const c10::Stream* s) { return StandInHandle(*s); }
#endif

int main(int argc, char** argv) {
  static HostGpuGuard guard;
  c10::impl::DeviceGuardImplRegistrar registrar(c10::DeviceType::CUDA, &guard);
  const std::string what = argc > 1 ? argv[1] : "";
  if (what == "overflow") {
    return Overflow(argc > 2 ? std::atoi(argv[2]) : 3, argc > 3 ? std::atoi(argv[3]) : 6,
                    argc > 4 && std::string(argv[4]) == "named-steps");
  }
  if (what == "capture") return Capture();
  if (what == "released") return Released();
  if (what == "devices") return Devices();
  if (what == "in-place") return InPlace();
  if (what == "casts-and-fills") return CastsAndFills();
  if (what == "async-copy") return AsyncCopy();
  if (what == "mask-constants") return MaskConstants();
  if (what == "scaled-gradients") {
    return ScaledGradients(argc > 2 && std::string(argv[2]) == "forward");
  }
  if (what == "own-loss-scaler") {
    const std::string how = argc > 2 ? argv[2] : "";
    return OwnLossScaler(how == "accumulate", how == "captured");
  }
  if (what == "given-up") return GivenUp(argc > 2 && std::string(argv[2]) == "first");
  if (what == "gan") return Gan();
  if (what == "dropped") return Dropped(argc > 2 && std::string(argv[2]) == "kept");
  if (what == "spectral") return Spectral();
  if (what == "batch-norm") return BatchNorm();
  if (what == "load-checkpoint") {
    return LoadCheckpoint(argc > 2 && std::string(argv[2]) == "gpu",
                          argc > 3 && std::string(argv[3]) == "named");
  }
  if (what == "loaded-state") return LoadedState(argc > 2 && std::string(argv[2]) == "unread");
  if (what == "loaded-parameter") {
    return LoadedParameter(argc > 2 && std::string(argv[2]) == "unread");
  }
  if (what == "unwritten") return Unwritten();
  if (what == "loop") return Loop(argc > 2 ? std::atol(argv[2]) : 1000);
  std::fprintf(stderr, "usage: host_gpu_ops overflow [STEP STEPS [named-steps]] | capture | devices | in-place | released | casts-and-fills | async-copy | mask-constants | scaled-gradients [forward] | own-loss-scaler [accumulate|captured] | given-up [first] | dropped [kept] | spectral | batch-norm | load-checkpoint [gpu [named]] | loaded-state [unread] | loaded-parameter [unread] | unwritten | loop N\n");
  return 2;
}
