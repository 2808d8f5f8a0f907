// ptestore's XNNPACK load-options shim (part of ptestore, Apache-2.0).
//
// The Python bindings of ExecuTorch load every method with no LoadBackendOptionsMap, so
// XNNPACK's packed-weight cache (enabled per load through the runtime spec only) cannot
// be switched on from Python. This library defines Program::load_method with the exact
// signature of the installed runtime's header: loaded RTLD_GLOBAL before the bindings'
// extension, it is the definition their calls bind to. It adds the XNNPACK options when a
// path is configured (ptestore_xnn_configure) and forwards to the runtime's own
// definition in that extension (named by ptestore_xnn_set_runtime). The library is not
// linked against the extension: loaded RTLD_GLOBAL, a dependency would put the
// extension's own symbols in the global scope too, where other extensions of the wheel
// (data_loader) would bind to them and register their kernels twice.
//
// Built by ptestore.xnnpack.native against the headers the executorch wheel ships.

#include <executorch/runtime/backend/backend_options_map.h>
#include <executorch/runtime/backend/options.h>
#include <executorch/runtime/executor/program.h>

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

namespace et = ::executorch::runtime;

namespace {

// The XNNPACK backend's id and its option keys (backends/xnnpack/runtime/XNNPACKBackend.h
// of the wheel's revision; facts, kept as C arrays for BackendOptions::set_option).
constexpr char kXnnpackBackendId[] = "XnnpackBackend";
constexpr char kWeightCacheKey[] = "weight_cache_enabled";
constexpr char kPackedPathKey[] = "packed_cache_path";

// One configuration per path: its options must outlive every method loaded with it (the
// runtime keeps no copy), so a configuration is never freed; configuring a path again
// reuses its configuration (memory bounded by the distinct paths, not by the calls).
struct Config {
  et::BackendOptions<2> options;
  et::LoadBackendOptionsMap map;  // XNNPACK's options alone, for callers that pass none
};

std::mutex g_mutex;  // guards g_configs and g_runtime
std::map<std::string, Config*> g_configs;
// The configuration of the loads that follow in this thread (null: they pass through
// unchanged). Per thread: a method loaded meanwhile by another thread (plain bindings,
// another program) never gets this path.
thread_local Config* t_config = nullptr;
std::atomic<long> g_seen{0};  // load_method calls that went through this shim
std::atomic<long> g_added{0};  // of those, the ones given the XNNPACK options
thread_local long t_seen = 0;  // the same two, of the calling thread's loads
thread_local long t_added = 0;

using LoadMethodFn = et::Result<et::Method> (*)(
    const et::Program*,
    const char*,
    et::MemoryManager*,
    et::EventTracer*,
    const et::NamedDataMap*,
    const et::LoadBackendOptionsMap*,
    et::Span<const et::Kernel>);

// The bindings' extension that holds the runtime's own definitions: set by
// ptestore_xnn_set_runtime before the first load, opened (already loaded) on first use.
char g_runtime[4096] = {0};

LoadMethodFn next_load_method() {
  static LoadMethodFn fn = [] {
    // The mangled name of the member function this file defines (the same signature).
    const char* name =
        "_ZNK10executorch7runtime7Program11load_methodEPKcPNS0_13MemoryManagerEPNS0_"
        "11EventTracerEPKNS0_12NamedDataMapEPKNS0_21LoadBackendOptionsMapENS0_4SpanIKNS0_"
        "6KernelEEE";
    void* sym = nullptr;
    void* handle = dlopen(g_runtime, RTLD_LAZY | RTLD_NOLOAD);
    if (handle != nullptr) {
      sym = dlsym(handle, name);
    }
    if (sym == nullptr) {
      std::fprintf(
          stderr,
          "ptestore xnnpack shim: the runtime's Program::load_method was not found in "
          "'%s' (ptestore_xnn_set_runtime names the loaded bindings extension)\n",
          g_runtime);
      std::abort();
    }
    return reinterpret_cast<LoadMethodFn>(sym);
  }();
  return fn;
}

}  // namespace

extern "C" {

// Configure the packed-weight cache for the loads that follow in the calling thread: a
// path enables it there, null or "" turns it off. Returns 0, or -1 when the path does not
// fit the runtime's option value (kMaxOptionValueLength - 1 bytes); the configuration
// is then off.
__attribute__((visibility("default"))) int ptestore_xnn_configure(const char* path) {
  t_config = nullptr;
  if (path == nullptr || path[0] == '\0') {
    return 0;
  }
  if (std::strlen(path) >= et::kMaxOptionValueLength) {
    return -1;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  auto found = g_configs.find(path);
  if (found != g_configs.end()) {
    t_config = found->second;
    return 0;
  }
  Config* config = new Config();
  if (config->options.set_option(kWeightCacheKey, true) != et::Error::Ok ||
      config->options.set_option(kPackedPathKey, path) != et::Error::Ok ||
      config->map.set_options(kXnnpackBackendId, config->options.view()) != et::Error::Ok) {
    delete config;
    return -1;
  }
  g_configs.emplace(path, config);
  t_config = config;
  return 0;
}

// How many distinct paths have a configuration (each kept for the process's life).
__attribute__((visibility("default"))) long ptestore_xnn_configs() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return static_cast<long>(g_configs.size());
}

// Name the bindings' extension (its path) whose Program::load_method this library
// forwards to. Returns 0, or -1 when the path is too long.
__attribute__((visibility("default"))) int ptestore_xnn_set_runtime(const char* path) {
  if (path == nullptr || std::strlen(path) >= sizeof(g_runtime)) {
    return -1;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  std::strcpy(g_runtime, path);
  return 0;
}

// The longest path ptestore_xnn_configure accepts.
__attribute__((visibility("default"))) long ptestore_xnn_max_path() {
  return static_cast<long>(et::kMaxOptionValueLength) - 1;
}

// How many load_method calls went through the shim (which = 0) and how many of them
// were given the XNNPACK options (which = 1): proof that the interposition holds. The
// same of the calling thread's loads alone: which = 2 and 3.
__attribute__((visibility("default"))) long ptestore_xnn_count(int which) {
  switch (which) {
    case 0:
      return g_seen.load();
    case 1:
      return g_added.load();
    case 2:
      return t_seen;
    default:
      return t_added;
  }
}

}  // extern "C"

namespace executorch {
namespace runtime {

// The runtime's assertion path (ET_CHECK in the inline header code) ends here; the wheel
// keeps its own copy hidden, so this library has one of its own.
void runtime_abort() {
  std::fprintf(stderr, "ptestore xnnpack shim: an ExecuTorch runtime check failed\n");
  std::abort();
}

__attribute__((visibility("default"))) Result<Method> Program::load_method(
    const char* method_name,
    MemoryManager* memory_manager,
    EventTracer* event_tracer,
    const NamedDataMap* named_data_map,
    const LoadBackendOptionsMap* backend_options,
    Span<const Kernel> kernels) const {
  g_seen.fetch_add(1);
  ++t_seen;
  Config* config = t_config;
  if (config == nullptr || (backend_options != nullptr &&
                            backend_options->has_options(kXnnpackBackendId))) {
    // Off, or the caller chose XNNPACK's options itself: leave them alone.
    return next_load_method()(
        this, method_name, memory_manager, event_tracer, named_data_map,
        backend_options, kernels);
  }
  g_added.fetch_add(1);
  ++t_added;
  if (backend_options == nullptr) {  // the bindings' case: the configuration's own map
    return next_load_method()(
        this, method_name, memory_manager, event_tracer, named_data_map, &config->map,
        kernels);
  }
  // The caller's options for other backends, plus XNNPACK's, in a map that lives as long
  // as the configuration's options (never freed: the method may keep a pointer to it).
  // It holds views of the caller's spans, which must outlive the method anyway.
  auto* merged = new LoadBackendOptionsMap();
  for (size_t i = 0; i < backend_options->size(); ++i) {
    const auto entry = backend_options->entry_at(i);
    merged->set_options(
        entry.backend_id,
        Span<BackendOption>(
            const_cast<BackendOption*>(entry.options.data()), entry.options.size()));
  }
  if (merged->set_options(kXnnpackBackendId, config->options.view()) != Error::Ok) {
    delete merged;
    return Error::InvalidArgument;
  }
  return next_load_method()(
      this, method_name, memory_manager, event_tracer, named_data_map, merged, kernels);
}

}  // namespace runtime
}  // namespace executorch
