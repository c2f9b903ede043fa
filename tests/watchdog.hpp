/// @file watchdog.hpp
/// @brief A deadline for kernels that may never finish: the exercise grader and the zero-tile test
/// run barrier protocols that deadlock when wrong, and a hung kernel must end the process with a
/// report rather than hang it.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

namespace fa::test {

/// A kernel whose threads wait on a barrier that no thread completes never returns, and neither would
/// the program waiting for it (the grader, a test). The watchdog gives each case `seconds`; past that it names the case, says what usually
/// causes it, and ends the process: a hung kernel cannot be cancelled, only its process ended.
class Watchdog {
 public:
  /// `seconds` per case; `ending` closes the report ("the grade stops at a hung case").
  Watchdog(int seconds, std::string ending)
      : seconds_(seconds), ending_(std::move(ending)), thread_([this] { watch(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  /// Starts timing the case `what`; `passed` cases have passed before it.
  void start(std::string what, int passed) {
    std::lock_guard<std::mutex> lock(mutex_);
    what_ = std::move(what), passed_ = passed, since_ = std::chrono::steady_clock::now(), running_ = true;
  }
  /// The case finished.
  void stop() {
    std::lock_guard<std::mutex> lock(mutex_);
    running_ = false;
  }

 private:
  void watch() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, std::chrono::milliseconds(500));
      if (!running_ || std::chrono::steady_clock::now() - since_ < std::chrono::seconds(seconds_)) continue;
      std::printf("[HANG] %s\n       no result after %d s: the kernel waits on a barrier that no thread completes\n"
                  "       (an arrive left out, a wait on the wrong phase, a turn never handed over)\n\n"
                  "%d cases passed before it; %s\n",
                  what_.c_str(), seconds_, passed_, ending_.c_str());
      std::fflush(stdout);
      std::_Exit(1);
    }
  }

  const int seconds_;
  const std::string ending_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::string what_;
  int passed_ = 0;
  std::chrono::steady_clock::time_point since_;
  bool running_ = false, stopping_ = false;
  std::thread thread_;  // last: it starts in the constructor and reads the members above
};

}  // namespace fa::test
