// Found only through rpath_probe's RPATH ($ORIGIN/private).
extern "C" __attribute__((visibility("default"))) int rpath_probe_dep_value() { return 42; }
