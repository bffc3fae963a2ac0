// A small fixed-size thread pool for batched CPU work. Work items are independent and each writes
// its own outputs, so results never depend on the number of threads.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvarn {

class ThreadPool {
 public:
  // num_threads counts the calling thread: a pool of 1 runs everything inline. Throws (e.g.
  // std::system_error, std::bad_alloc) when a worker cannot be started, after stopping and
  // joining the workers it did start.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Runs fn(i) for i in [0, n), spread over the pool; returns when all are done. If fn throws
  // (on any thread), no further items are started, ParallelFor waits for the items already
  // running, then rethrows the first exception in the calling thread. Calls from several
  // threads at once are serialized.
  void ParallelFor(size_t n, const std::function<void(size_t)>& fn);

 private:
  void WorkerLoop(int worker);
  void RunShare(int worker);
  void StopWorkers();

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one ParallelFor at a time
  std::mutex mutex_;
  std::condition_variable start_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t)>* fn_ = nullptr;
  size_t n_ = 0;
  size_t next_ = 0;
  int pending_ = 0;
  unsigned generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;  // the first exception of the current ParallelFor
};

}  // namespace kvarn
