#include "engine/memory/cuda_backend.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/memory/cuda_status.h"

namespace vamp {
namespace {

// The CUDA version whose ABI of each entry point we ask for. Every function used here has kept
// its signature since the VMM API appeared (CUDA 10.2), and drivers keep serving old versions.
constexpr unsigned int kDriverApiVersion = 12000;

// Driver entry points, looked up at run time. Member names are the driver functions' names so a
// failed call's error can name it.
struct DriverApi {
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuGetErrorString) cuGetErrorString = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;

  static absl::StatusOr<DriverApi> Load() {
    DriverApi api;
    VAMP_RETURN_IF_ERROR(Resolve("cuGetErrorName", &api.cuGetErrorName));
    VAMP_RETURN_IF_ERROR(Resolve("cuGetErrorString", &api.cuGetErrorString));
    VAMP_RETURN_IF_ERROR(
        Resolve("cuMemGetAllocationGranularity", &api.cuMemGetAllocationGranularity));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemCreate", &api.cuMemCreate));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemRelease", &api.cuMemRelease));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemAddressReserve", &api.cuMemAddressReserve));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemAddressFree", &api.cuMemAddressFree));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemMap", &api.cuMemMap));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemUnmap", &api.cuMemUnmap));
    VAMP_RETURN_IF_ERROR(Resolve("cuMemSetAccess", &api.cuMemSetAccess));
    return api;
  }

  template <typename Fn>
  static absl::Status Resolve(const char* symbol, Fn* fn) {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult query = cudaDriverEntryPointSymbolNotFound;
    VAMP_RETURN_IF_ERROR(
        CudaRuntimeStatus(cudaGetDriverEntryPointByVersion(symbol, &ptr, kDriverApiVersion,
                                                           cudaEnableDefault, &query),
                          absl::StrCat("cudaGetDriverEntryPointByVersion(", symbol, ")")));
    if (query != cudaDriverEntryPointSuccess || ptr == nullptr) {
      return absl::UnavailableError(absl::StrCat("the CUDA driver does not provide ", symbol,
                                                 " (entry point query result ",
                                                 static_cast<int>(query), ")"));
    }
    *fn = reinterpret_cast<Fn>(ptr);
    return absl::OkStatus();
  }

  // OK for CUDA_SUCCESS, otherwise an error naming the call and the driver's description.
  absl::Status Check(CUresult result, const char* call) const {
    if (result == CUDA_SUCCESS) return absl::OkStatus();
    const char* name = "unknown";
    const char* text = "unknown error";
    cuGetErrorName(result, &name);
    cuGetErrorString(result, &text);
    std::string message = absl::StrCat(call, " failed: ", name, " (", text, ")");
    switch (result) {
      case CUDA_ERROR_OUT_OF_MEMORY:
        return absl::ResourceExhaustedError(message);
      case CUDA_ERROR_INVALID_VALUE:
        return absl::InvalidArgumentError(message);
      case CUDA_ERROR_NO_DEVICE:
      case CUDA_ERROR_NOT_INITIALIZED:
      case CUDA_ERROR_NOT_SUPPORTED:
        return absl::UnavailableError(message);
      default:
        return absl::InternalError(message);
    }
  }
};

// Calls driver function `fn` through `api` and returns its error (named after `fn`) on failure.
#define VAMP_CU_RETURN_IF_ERROR(api, fn, ...) \
  VAMP_RETURN_IF_ERROR((api).Check((api).fn(__VA_ARGS__), #fn))

class CudaMemoryBackend final : public MemoryBackend {
 public:
  CudaMemoryBackend(int device, DriverApi api, CUmemAllocationProp prop, uint64_t page_bytes,
                    uint64_t total_bytes)
      : device_(device),
        api_(api),
        prop_(prop),
        page_bytes_(page_bytes),
        total_bytes_(total_bytes) {}

  absl::string_view name() const override { return "cuda"; }
  uint64_t page_bytes() const override { return page_bytes_; }
  uint64_t device_memory_bytes() const override { return total_bytes_; }

  absl::StatusOr<PhysicalPageHandle> CreatePhysicalPage() override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    CUmemGenericAllocationHandle handle = 0;
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemCreate, &handle, page_bytes_, &prop_, 0);
    return static_cast<PhysicalPageHandle>(handle);
  }

  absl::Status ReleasePhysicalPage(PhysicalPageHandle page) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemRelease, static_cast<CUmemGenericAllocationHandle>(page));
    return absl::OkStatus();
  }

  absl::StatusOr<DeviceAddress> ReserveAddressRange(uint64_t bytes) override {
    if (bytes == 0 || bytes % page_bytes_ != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("ReserveAddressRange: ", bytes,
                       " bytes is not a positive multiple of the page (", page_bytes_, ")"));
    }
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    CUdeviceptr ptr = 0;
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemAddressReserve, &ptr, bytes, page_bytes_, 0, 0);
    return static_cast<DeviceAddress>(ptr);
  }

  absl::Status FreeAddressRange(DeviceAddress base, uint64_t bytes) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemAddressFree, static_cast<CUdeviceptr>(base), bytes);
    return absl::OkStatus();
  }

  absl::Status MapPage(DeviceAddress address, PhysicalPageHandle page) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemMap, static_cast<CUdeviceptr>(address), page_bytes_, 0,
                            static_cast<CUmemGenericAllocationHandle>(page), 0);
    return absl::OkStatus();
  }

  absl::Status SetReadWriteAccess(DeviceAddress address, uint64_t bytes) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    CUmemAccessDesc desc = {};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = device_;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    VAMP_CU_RETURN_IF_ERROR(api_, cuMemSetAccess, static_cast<CUdeviceptr>(address), bytes, &desc,
                            1);
    return absl::OkStatus();
  }

  absl::Status UnmapPages(DeviceAddress address, uint64_t bytes) override {
    if (address % page_bytes_ != 0 || bytes % page_bytes_ != 0) {
      return absl::InvalidArgumentError("UnmapPages: range is not page-aligned");
    }
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    // Each page is its own mapping, and cuMemUnmap takes whole mappings.
    for (uint64_t offset = 0; offset < bytes; offset += page_bytes_) {
      VAMP_CU_RETURN_IF_ERROR(api_, cuMemUnmap, static_cast<CUdeviceptr>(address + offset),
                              page_bytes_);
    }
    return absl::OkStatus();
  }

  absl::Status CopyHostToDevice(DeviceAddress dst, const void* src, uint64_t bytes) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemcpy(reinterpret_cast<void*>(dst), src, bytes, cudaMemcpyHostToDevice));
    return absl::OkStatus();
  }

  absl::Status CopyDeviceToHost(void* dst, DeviceAddress src, uint64_t bytes) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    VAMP_CUDART_RETURN_IF_ERROR(
        cudaMemcpy(dst, reinterpret_cast<const void*>(src), bytes, cudaMemcpyDeviceToHost));
    return absl::OkStatus();
  }

  absl::StatusOr<void*> AllocatePinnedHost(uint64_t bytes) override {
    VAMP_RETURN_IF_ERROR(MakeCurrent());
    void* ptr = nullptr;
    VAMP_CUDART_RETURN_IF_ERROR(cudaHostAlloc(&ptr, bytes, cudaHostAllocDefault));
    return ptr;
  }

  void FreePinnedHost(void* ptr) override {
    if (ptr != nullptr) cudaFreeHost(ptr);
  }

 private:
  // Driver calls act on the calling thread's current context; cudaSetDevice makes the device's
  // primary context current (a thread-local store once it exists).
  absl::Status MakeCurrent() const {
    VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(device_));
    return absl::OkStatus();
  }

  const int device_;
  const DriverApi api_;
  const CUmemAllocationProp prop_;
  const uint64_t page_bytes_;
  const uint64_t total_bytes_;
};

class CudaStreamFence final : public InFlightFence {
 public:
  CudaStreamFence(int device, std::vector<void*> streams)
      : device_(device), streams_(std::move(streams)) {}

  absl::Status WaitUntilIdle() override {
    VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(device_));
    if (streams_.empty()) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaDeviceSynchronize());
      return absl::OkStatus();
    }
    for (void* stream : streams_) {
      VAMP_CUDART_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
    }
    return absl::OkStatus();
  }

 private:
  const int device_;
  const std::vector<void*> streams_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<MemoryBackend>> CreateCudaMemoryBackend(int device) {
  int count = 0;
  const cudaError_t count_err = cudaGetDeviceCount(&count);
  if (count_err != cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("CUDA memory backend: no usable CUDA device (",
                     CudaRuntimeStatus(count_err, "cudaGetDeviceCount").message(), ")"));
  }
  if (count == 0) return absl::UnavailableError("CUDA memory backend: no CUDA device");
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA memory backend: device ", device,
                                                   " does not exist (", count, " device(s))"));
  }
  VAMP_CUDART_RETURN_IF_ERROR(cudaSetDevice(device));
  // Create the primary context now, so driver calls below have one.
  VAMP_CUDART_RETURN_IF_ERROR(cudaFree(nullptr));
  VAMP_ASSIGN_OR_RETURN(DriverApi api, DriverApi::Load());

  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  VAMP_CU_RETURN_IF_ERROR(api, cuMemGetAllocationGranularity, &granularity, &prop,
                          CU_MEM_ALLOC_GRANULARITY_MINIMUM);
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  VAMP_CUDART_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return std::unique_ptr<MemoryBackend>(
      new CudaMemoryBackend(device, api, prop, granularity, total_bytes));
}

std::unique_ptr<InFlightFence> CreateCudaStreamFence(int device, std::vector<void*> streams) {
  return std::make_unique<CudaStreamFence>(device, std::move(streams));
}

}  // namespace vamp
