// fa-bench --suite trace: step 02's trace lesson in numbers.
//
// trace_in_place sends the whole n x n matrix over PCIe to read n elements of
// it; trace_diagonal_copy sends only those n. Each call is timed whole with
// std::chrono, from a host matrix in ordinary (pageable) memory to the result
// on the host: device allocation, transfer, kernel, result back. A third row,
// on_device, times trace_on_device on a matrix already in device memory with
// CUDA events (result buffer, kernel, 4 bytes back): what is left once the
// matrix transfer is gone. Median of kReps calls after one warm-up call.
#include "trace_bench.hpp"

#include "02_reductions/trace.hpp"
#include "fa/device.hpp"
#include "reference.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <new>
#include <stdexcept>
#include <vector>

namespace fa {
namespace {

constexpr int kReps = 7;
constexpr int kSizes[] = {1024, 4096, 8192, 16384};

// One measurement: a row of the table and of the CSV.
struct TraceRow {
  const char* variant;
  const char* dtype;
  int rows, cols;
  double ms, ms_min, ms_max;
  std::size_t h2d_bytes;  // matrix bytes sent host -> device per call
  double speedup;         // in_place time / this time
  bool correct;           // every call returned the CPU trace
};

struct Timing {
  double median, min, max;
};

// Calls `call` once to warm up, then kReps times; `call` returns its milliseconds.
template <class Call>
Timing time_calls(Call&& call) {
  call();
  std::vector<double> ms;
  for (int r = 0; r < kReps; ++r) ms.push_back(call());
  std::sort(ms.begin(), ms.end());
  return {ms[kReps / 2], ms.front(), ms.back()};
}

// Milliseconds of wall-clock time that `work` takes.
template <class Work>
double wall_ms(Work&& work) {
  const auto start = std::chrono::steady_clock::now();
  work();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

// Small integers in [-8, 8]: float and int traces are then exact, so every
// call can be checked with ==.
template <class T>
void fill(std::vector<T>& matrix) {
  for (std::size_t idx = 0; idx < matrix.size(); ++idx)
    matrix[idx] = T(int((idx * 2654435761ull >> 16) % 17) - 8);
}

template <class T>
void time_type(const char* dtype, std::vector<TraceRow>& rows) {
  for (const int n : kSizes) {
    const std::size_t bytes = std::size_t(n) * n * sizeof(T);
    std::size_t free_bytes = 0, total_bytes = 0;
    FA_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    if (bytes + (std::size_t(256) << 20) > free_bytes) {
      std::fprintf(stderr, "  skip %s %d x %d: %zu MiB of device memory free\n", dtype, n, n, free_bytes >> 20);
      continue;
    }
    std::vector<T> matrix;
    try {
      matrix.resize(std::size_t(n) * n);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr, "  skip %s %d x %d: not enough host memory\n", dtype, n, n);
      continue;
    }
    fill(matrix);
    const double expected = reference_trace(matrix.data(), n, n);
    bool in_place_ok = true, diagonal_ok = true, on_device_ok = true;

    const Timing in_place = time_calls([&] {
      return wall_ms([&] { in_place_ok &= double(step02::trace_in_place(matrix.data(), n, n)) == expected; });
    });
    const Timing diagonal = time_calls([&] {
      return wall_ms([&] { diagonal_ok &= double(step02::trace_diagonal_copy(matrix.data(), n, n)) == expected; });
    });
    DeviceBuffer device_matrix(bytes);
    device_matrix.upload(matrix.data(), bytes);
    CudaEventTimer timer;
    const Timing on_device = time_calls([&] {
      timer.start();
      on_device_ok &= double(step02::trace_on_device(device_matrix.as<T>(), n, n)) == expected;
      timer.stop();
      return double(timer.elapsed_ms());
    });

    auto row = [&](const char* variant, const Timing& t, std::size_t h2d, bool ok) {
      rows.push_back({variant, dtype, n, n, t.median, t.min, t.max, h2d, in_place.median / t.median, ok});
      const TraceRow& r = rows.back();
      std::printf("%-10s %-5s %6d %6d %10.3f %12zu %10.1f %4s\n", r.variant, r.dtype, r.rows, r.cols, r.ms,
                  r.h2d_bytes, r.speedup, r.correct ? "yes" : "NO");
      std::fflush(stdout);
    };
    row("in_place", in_place, bytes, in_place_ok);
    row("diag_copy", diagonal, std::size_t(n) * sizeof(T), diagonal_ok);
    row("on_device", on_device, 0, on_device_ok);
  }
}

void write_csv(const std::string& path, const std::vector<TraceRow>& rows, const std::string& gpu) {
  std::ofstream csv(path);
  if (!csv) throw std::runtime_error("cannot write " + path);
  csv << "variant,dtype,rows,cols,ms,ms_min,ms_max,reps,h2d_bytes,speedup_vs_in_place,correct,gpu\n";
  csv.precision(6);
  for (const auto& r : rows)
    csv << r.variant << ',' << r.dtype << ',' << r.rows << ',' << r.cols << ',' << r.ms << ',' << r.ms_min << ','
        << r.ms_max << ',' << kReps << ',' << r.h2d_bytes << ',' << r.speedup << ',' << (r.correct ? 1 : 0)
        << ",\"" << gpu << "\"\n";
}

}  // namespace

int run_trace_suite(const std::string& csv_path) {
  if (!gpu_available()) {
    std::fprintf(stderr, "fa-bench: no CUDA device found; the benchmark needs a GPU\n");
    return 2;
  }
  const std::string gpu = gpu_name();
  std::printf("trace on %s: host matrix (pageable) -> result on host, median of %d calls after a warm-up\n"
              "on_device: matrix already in device memory, no matrix transfer\n",
              gpu.c_str(), kReps);
  std::printf("%-10s %-5s %6s %6s %10s %12s %10s %4s\n", "variant", "type", "rows", "cols", "ms", "H2D bytes",
              "x in_place", "ok");
  std::vector<TraceRow> rows;
  time_type<int>("int", rows);
  time_type<float>("float", rows);
  write_csv(csv_path, rows, gpu);
  std::printf("wrote %zu rows to %s\n", rows.size(), csv_path.c_str());
  const bool all_correct = std::all_of(rows.begin(), rows.end(), [](const TraceRow& r) { return r.correct; });
  return all_correct ? 0 : 1;
}

}  // namespace fa
