// Background threads that never take the host's signals.
#pragma once

#include <pthread.h>
#include <signal.h>

#include <thread>
#include <utility>

namespace nanhunt {

// Starts `fn` on a thread with every signal blocked (heaptrack's rule): a
// SIGINT meant for Python's main thread, or the host's own handlers, must
// never run on a thread nanhunt added. The caller's mask is unchanged.
template <class Fn>
std::thread StartQuietThread(Fn&& fn) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  std::thread t(std::forward<Fn>(fn));
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return t;
}

}  // namespace nanhunt
