/// @file parallel.hpp
/// @brief parallel_for: a loop over indices spread over the host's cores, used by the float64 reference (its rows)
/// and by the random inputs (their chunks).
#pragma once

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace fa {

/// Threads parallel_for uses for count items: one per core (at most 64), no more than items, at least 1.
inline int workers_for(std::int64_t count) {
  const std::int64_t cores = std::min<unsigned>(std::max(1u, std::thread::hardware_concurrency()), 64u);
  return int(std::max<std::int64_t>(1, std::min(count, cores)));
}

/// work(worker, index) for every index in [0, count), worker < workers_for(count), spread over the cores.
/// Worker w takes indices w, w + workers, ...: interleaved, so causal rows of every length are shared out.
template <class Work>
void parallel_for(std::int64_t count, Work work) {
  const int workers = workers_for(count);
  auto run = [&](int worker) {
    for (std::int64_t index = worker; index < count; index += workers) work(worker, index);
  };
  std::vector<std::thread> threads;
  for (int w = 1; w < workers; ++w) threads.emplace_back(run, w);
  run(0);
  for (auto& t : threads) t.join();
}

}  // namespace fa
