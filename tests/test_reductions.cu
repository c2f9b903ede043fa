// Step 02's reductions (steps/02_reductions/reductions.cuh) on the GPU, for
// every block size from 1 to 1024, int and float.
//
// The inputs are chosen so that an error cannot hide: values are distinct, the
// maximum sits at a random position, one input is all negative (a max that
// starts from 0 would be caught), and every value is a multiple of 1/2 small
// enough that float sums are exact in any order, so float results are compared
// exactly too. Each kernel makes back-to-back calls on one shared scratch with
// different inputs: a call that read the previous call's partial results would
// return the wrong total. Every thread writes what it got, and every thread's
// result is checked (all threads receive the result).
#include "02_reductions/reductions.cuh"
#include "fa/device.hpp"
#include "gpu.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

using namespace fa;

namespace {

constexpr int kMaxBlockSize = 1024;
constexpr int kBlocks = 2;   // two blocks with different data: blocks must not mix
constexpr int kResults = 4;  // per thread: sum(a), sum(b), max(a), max(b)

template <class T>
__global__ void block_reductions_kernel(const T* a, const T* b, T* out) {
  __shared__ step02::BlockReduceScratch<T> scratch;
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  const T x = a[index], y = b[index];
  // Four calls in a row on the same scratch.
  const T sum_a = step02::block_sum(x, scratch);
  const T sum_b = step02::block_sum(y, scratch);
  const T max_a = step02::block_max(x, scratch);
  const T max_b = step02::block_max(y, scratch);
  out[kResults * index + 0] = sum_a;
  out[kResults * index + 1] = sum_b;
  out[kResults * index + 2] = max_a;
  out[kResults * index + 3] = max_b;
}

// Each warp reduces its own lanes; the last warp of the block may be partial.
template <class T>
__global__ void warp_reductions_kernel(const T* a, T* out) {
  const int index = blockIdx.x * blockDim.x + threadIdx.x;
  const int warp = threadIdx.x / step02::kWarpSize;
  const int lanes = min(step02::kWarpSize, int(blockDim.x) - warp * step02::kWarpSize);
  out[2 * index + 0] = step02::warp_sum(a[index], lanes);
  out[2 * index + 1] = step02::warp_max(a[index], lanes);
}

// int values as they are; float values halved, so that the float inputs are not all integers.
template <class T>
T scaled(int value) {
  return std::is_integral<T>::value ? T(value) : T(value) / T(2);
}

// The inputs of one launch: kBlocks blocks of block_size threads.
//  a: a random permutation of -2, -3, ..., all negative, shifted per block;
//  b: a random permutation of distinct even values of both signs, shifted per block.
// No int sum or max can then be -1, the value of the 0xFF bytes the output is
// poisoned with, so a result that was never written cannot pass.
template <class T>
struct Inputs {
  std::vector<T> a, b;
  Inputs(int block_size, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<int> order(block_size);
    for (int block = 0; block < kBlocks; ++block) {
      std::iota(order.begin(), order.end(), 0);
      std::shuffle(order.begin(), order.end(), rng);
      for (int k : order) a.push_back(scaled<T>(-(k + 2 + block * block_size)));
      std::shuffle(order.begin(), order.end(), rng);
      for (int k : order) b.push_back(scaled<T>(2 * (k - block_size / 2 + 3 * block)));
    }
  }
};

// The CPU's answer for the block (or warp) of values [first, first + count).
template <class T>
T cpu_sum(const std::vector<T>& v, int first, int count) {
  return std::accumulate(v.begin() + first, v.begin() + first + count, T(0));
}
template <class T>
T cpu_max(const std::vector<T>& v, int first, int count) {
  return *std::max_element(v.begin() + first, v.begin() + first + count);
}

// How many threads got a wrong result; the first one is described in `first_bad`.
struct Mismatches {
  int count = 0;
  std::string first_bad;
  template <class T>
  void check(bool ok, const char* what, int thread, T got, T expected) {
    if (ok) return;
    if (count++ == 0) {
      std::ostringstream text;
      text << what << " at thread " << thread << ": got " << got << ", expected " << expected;
      first_bad = text.str();
    }
  }
};

}  // namespace

TEMPLATE_TEST_CASE("block_sum and block_max are right for every block size, twice in a row",
                   "[gpu][step02][reductions]", int, float) {
  FA_REQUIRE_GPU();
  using T = TestType;
  const std::size_t max_values = std::size_t(kBlocks) * kMaxBlockSize;
  DeviceBuffer a(max_values * sizeof(T)), b(max_values * sizeof(T)), out(kResults * max_values * sizeof(T));
  std::vector<T> results(kResults * max_values);
  for (int block_size = 1; block_size <= kMaxBlockSize; ++block_size) {
    const Inputs<T> in(block_size, std::uint32_t(block_size));
    const std::size_t values = in.a.size();
    a.upload(in.a.data(), values * sizeof(T));
    b.upload(in.b.data(), values * sizeof(T));
    out.poison();
    block_reductions_kernel<T><<<kBlocks, block_size>>>(a.as<T>(), b.as<T>(), out.as<T>());
    FA_CHECK_LAUNCH();
    out.download(results.data(), kResults * values * sizeof(T));

    Mismatches bad;
    for (int block = 0; block < kBlocks; ++block) {
      const int first = block * block_size;
      const T expected[kResults] = {cpu_sum(in.a, first, block_size), cpu_sum(in.b, first, block_size),
                                    cpu_max(in.a, first, block_size), cpu_max(in.b, first, block_size)};
      const char* names[kResults] = {"block_sum(a)", "block_sum(b)", "block_max(a)", "block_max(b)"};
      for (int t = first; t < first + block_size; ++t)
        for (int r = 0; r < kResults; ++r)
          bad.check(results[kResults * t + r] == expected[r], names[r], t, results[kResults * t + r], expected[r]);
    }
    INFO("block size " << block_size << ": " << bad.first_bad);
    CHECK(bad.count == 0);
  }
}

TEMPLATE_TEST_CASE("warp_sum and warp_max are right for full and partial warps",
                   "[gpu][step02][reductions]", int, float) {
  FA_REQUIRE_GPU();
  using T = TestType;
  const std::size_t max_values = std::size_t(kBlocks) * kMaxBlockSize;
  DeviceBuffer a(max_values * sizeof(T)), out(2 * max_values * sizeof(T));
  std::vector<T> results(2 * max_values);
  for (int block_size = 1; block_size <= kMaxBlockSize; ++block_size) {
    const Inputs<T> in(block_size, std::uint32_t(block_size) + 7919u);
    const std::size_t values = in.b.size();
    a.upload(in.b.data(), values * sizeof(T));
    out.poison();
    warp_reductions_kernel<T><<<kBlocks, block_size>>>(a.as<T>(), out.as<T>());
    FA_CHECK_LAUNCH();
    out.download(results.data(), 2 * values * sizeof(T));

    Mismatches bad;
    for (int block = 0; block < kBlocks; ++block) {
      for (int warp_start = 0; warp_start < block_size; warp_start += step02::kWarpSize) {
        const int first = block * block_size + warp_start;
        const int lanes = std::min(step02::kWarpSize, block_size - warp_start);
        const T sum = cpu_sum(in.b, first, lanes), max = cpu_max(in.b, first, lanes);
        for (int t = first; t < first + lanes; ++t) {
          bad.check(results[2 * t] == sum, "warp_sum", t, results[2 * t], sum);
          bad.check(results[2 * t + 1] == max, "warp_max", t, results[2 * t + 1], max);
        }
      }
    }
    INFO("block size " << block_size << ": " << bad.first_bad);
    CHECK(bad.count == 0);
  }
}
