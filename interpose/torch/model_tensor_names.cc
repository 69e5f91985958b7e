#include "interpose/torch/model_tensor_names.h"

#include <atomic>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "interpose/torch/python_api.h"

namespace nanhunt {
namespace {

// Bounds the cost of a run whose every batch holds NaN: the first few
// findings are the ones read.
constexpr int kMaxLookups = 16;
std::atomic<int> g_lookups{0};

// Walks the objects Python's collector tracks (modules and optimizers are
// among them) for the one that holds the storage. The model is the root
// module with the most parameters, so that a parameter is named by its
// path in it. Warnings are silenced: isinstance on some of torch's own
// deprecated objects warns, and the program's stderr is not ours.
constexpr char kFindName[] = R"py(
def _name(ptr):
    import gc, sys, warnings
    torch = sys.modules.get("torch")
    if torch is None:
        return ""
    def holds(t):
        try:
            return (torch.is_tensor(t) and t.layout == torch.strided
                    and t.untyped_storage().data_ptr() == ptr)
        except Exception:
            return False
    modules, optimizers = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            try:
                if isinstance(o, torch.nn.Module):
                    modules.append(o)
                elif isinstance(o, torch.optim.Optimizer):
                    optimizers.append(o)
            except Exception:
                pass
    inner = {id(c) for m in modules for c in m.children()}
    roots = [m for m in modules if id(m) not in inner]
    roots.sort(key=lambda m: -sum(1 for _ in m.parameters()))
    names = {}
    for root in roots:
        for name, p in root.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), name)
    for root in roots:
        for name, p in root.named_parameters(remove_duplicate=False):
            if holds(p):
                return "parameter " + name
        for name, b in root.named_buffers(remove_duplicate=False):
            if holds(b):
                return "buffer " + name
    for opt in optimizers:
        kind = type(opt).__name__
        try:  # another library's optimizer may keep its state otherwise
            for p, state in opt.state.items():
                for key, value in state.items():
                    if holds(value):
                        return "%s state %s of %s" % (kind, key, names.get(id(p), "a parameter"))
            for g, group in enumerate(opt.param_groups):
                for i, p in enumerate(group["params"]):
                    if holds(p):  # trained, but held by no module
                        return "parameter %d of %s's param_groups[%d]" % (i, kind, g)
        except Exception:
            pass
    return ""
RESULT = _name(int(PTR))
del _name
)py";

}  // namespace

std::optional<std::string> NameModelTensor(const void* storage_data) {
  if (storage_data == nullptr) return "";
  if (g_lookups.fetch_add(1, std::memory_order_relaxed) >= kMaxLookups) return "";
  return EvalPython(kFindName, {{"PTR", absl::StrCat(reinterpret_cast<uintptr_t>(storage_data))}},
                    "RESULT");
}

int ModelTensorLookups() { return g_lookups.load(std::memory_order_relaxed); }

}  // namespace nanhunt
