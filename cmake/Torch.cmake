# Finds the torch of ${NANHUNT_PYTHON} without TorchConfig.cmake (which
# wants the CUDA toolchain of the wheel's build): headers, libraries and the
# C++ ABI flag come from the installed package itself, so the same sources
# build against any torch 2.x wheel, CPU or CUDA.
execute_process(
  COMMAND ${NANHUNT_PYTHON} -c
    "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
  OUTPUT_VARIABLE _nh_torch_out
  RESULT_VARIABLE _nh_torch_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _nh_torch_rc EQUAL 0)
  message(FATAL_ERROR "nanhunt: '${NANHUNT_PYTHON}' cannot import torch; run scripts/setup.sh or pass -DNANHUNT_PYTHON=/path/to/python")
endif()
string(REPLACE "\n" ";" _nh_torch_out "${_nh_torch_out}")
list(GET _nh_torch_out 0 NANHUNT_TORCH_DIR)
list(GET _nh_torch_out 1 NANHUNT_TORCH_CXX11_ABI)
list(GET _nh_torch_out 2 NANHUNT_TORCH_VERSION)
message(STATUS "nanhunt: torch ${NANHUNT_TORCH_VERSION} at ${NANHUNT_TORCH_DIR}")

# The plugin shares std::string with nanhunt's core and with Debian's
# abseil, both built with the C++11 ABI: a torch built with the old one
# (every torch wheel on PyPI before 2.7) would link to nothing, or worse.
if(NOT NANHUNT_TORCH_CXX11_ABI)
  message(FATAL_ERROR
    "nanhunt: torch ${NANHUNT_TORCH_VERSION} (${NANHUNT_PYTHON}) was built with the "
    "pre-C++11 string ABI (torch._C._GLIBCXX_USE_CXX11_ABI is False), which the "
    "plugin cannot share strings with: nanhunt's libraries (abseil from Debian) use "
    "the C++11 ABI. Use a torch built with the C++11 ABI: PyPI's torch 2.7 or newer "
    "(pip install 'torch>=2.7'), or a torch built from source, which uses it by "
    "default; or pass -DNANHUNT_WITH_TORCH=OFF to build nanhunt without its plugin.")
endif()
# What the sources are checked against (see the README, "Torch versions").
if(NANHUNT_TORCH_VERSION VERSION_LESS 2.4)
  message(WARNING
    "nanhunt: torch ${NANHUNT_TORCH_VERSION} is older than 2.4, the oldest torch "
    "nanhunt's sources are compiled against; the build may fail.")
endif()

add_library(nanhunt_torch_deps INTERFACE)
target_include_directories(nanhunt_torch_deps SYSTEM INTERFACE
  ${NANHUNT_TORCH_DIR}/include
  ${NANHUNT_TORCH_DIR}/include/torch/csrc/api/include)
target_compile_definitions(nanhunt_torch_deps INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${NANHUNT_TORCH_CXX11_ABI})
target_link_libraries(nanhunt_torch_deps INTERFACE
  ${NANHUNT_TORCH_DIR}/lib/libtorch_cpu.so
  ${NANHUNT_TORCH_DIR}/lib/libc10.so)

# For programs (the LibTorch test binary): the full C++ frontend.
add_library(nanhunt_libtorch INTERFACE)
target_link_libraries(nanhunt_libtorch INTERFACE nanhunt_torch_deps
  ${NANHUNT_TORCH_DIR}/lib/libtorch.so)
