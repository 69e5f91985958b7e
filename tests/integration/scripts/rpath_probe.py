# Loads a library that dlopens a dependency by bare name through its own
# RPATH; prints what the dependency returned (42 when found).
import ctypes
import sys

lib = ctypes.CDLL(sys.argv[1])
print(lib.rpath_probe_load())
