#include "device_fill.hpp"

#include "fa/cuda_check.hpp"
#include "fa/device.hpp"
#include "fa/kit.cuh"

namespace fa::test {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 4096;  // a grid-stride loop covers any n

/// splitmix64's finaliser: a well-mixed 64-bit hash of x.
__device__ std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

template <class T>
__global__ void fill_kernel(T* data, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float unit = float(mix(seed ^ mix(std::uint64_t(i))) >> 40) * 0x1.0p-24f;  // [0, 1)
    data[i] = kit::from_float<T>(lo + (hi - lo) * unit);
  }
}

template <class T>
__global__ void count_kernel(const T* data, std::int64_t n, unsigned long long* count) {
  const std::int64_t stride = std::int64_t(gridDim.x) * blockDim.x;
  unsigned long long mine = 0;
  for (std::int64_t i = std::int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    mine += !isfinite(kit::to_float(data[i]));
  if (mine) atomicAdd(count, mine);
}

/// Runs f.template operator()<T>() for dtype's element type T.
template <class F>
void for_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::f32: return f.template operator()<float>();
    case DType::f16: return f.template operator()<__half>();
    case DType::bf16: return f.template operator()<__nv_bfloat16>();
  }
}

}  // namespace

void fill_uniform(void* data, DType dtype, std::int64_t n, std::uint64_t seed, float lo, float hi) {
  for_dtype(dtype, [&]<class T>() {
    fill_kernel<T><<<kBlocks, kThreads>>>(static_cast<T*>(data), n, seed, lo, hi);
    FA_CHECK_LAUNCH();
  });
}

std::int64_t count_non_finite(const void* data, DType dtype, std::int64_t n) {
  DeviceBuffer count(sizeof(unsigned long long));
  FA_CUDA_CHECK(cudaMemset(count.get(), 0, sizeof(unsigned long long)));
  for_dtype(dtype, [&]<class T>() {
    count_kernel<T><<<kBlocks, kThreads>>>(static_cast<const T*>(data), n, count.as<unsigned long long>());
    FA_CHECK_LAUNCH();
  });
  unsigned long long host = 0;
  count.download(&host, sizeof host);
  return std::int64_t(host);
}

}  // namespace fa::test
