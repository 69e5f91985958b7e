// The address of a thread_local, computed once per function.
//
// The torch plugin is loaded with dlopen, so each use of one of its
// thread_locals is a call to __tls_get_addr (11 instructions), and GCC
// makes that call again at every use in a function rather than keep the
// address in a register: the op callbacks made 20 such calls an op
// (bench/op_cost.py). The empty asm makes the address a value the compiler
// cannot recompute, only keep.
#pragma once

namespace nanhunt {

template <class T>
inline T& KeepAddress(T& thread_local_variable) {
  T* address = &thread_local_variable;
  asm("" : "+r"(address));
  return *address;
}

}  // namespace nanhunt
