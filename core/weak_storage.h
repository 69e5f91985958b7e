// A weak reference to a tensor's storage, held by torch-free code: the
// plugin makes it (one owning weak pointer, released into `impl`) and says
// how to let go of it. core/ never looks inside; the plugin reads it back
// when a GPU op's result arrives, to tell later whether the memory still
// belongs to that storage (Monitor's question whether non-finite gradients
// are still held, which a GPU result known only by its address cannot
// answer).
#pragma once

#include <utility>

namespace nanhunt {

class WeakStorage {
 public:
  using Release = void (*)(void* impl);

  WeakStorage() = default;
  WeakStorage(void* impl, Release release) : impl_(impl), release_(release) {}
  WeakStorage(WeakStorage&& other) noexcept
      : impl_(std::exchange(other.impl_, nullptr)), release_(other.release_) {}
  WeakStorage& operator=(WeakStorage&& other) noexcept {
    if (this != &other) {
      Reset();
      impl_ = std::exchange(other.impl_, nullptr);
      release_ = other.release_;
    }
    return *this;
  }
  WeakStorage(const WeakStorage&) = delete;
  WeakStorage& operator=(const WeakStorage&) = delete;
  ~WeakStorage() { Reset(); }

  // The owning weak pointer, still this object's; null when there is none.
  void* impl() const { return impl_; }

 private:
  void Reset() {
    if (impl_ != nullptr && release_ != nullptr) release_(impl_);
    impl_ = nullptr;
  }

  void* impl_ = nullptr;
  Release release_ = nullptr;
};

}  // namespace nanhunt
