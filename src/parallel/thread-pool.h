// A fixed set of worker threads that run one parallel loop at a time. The calling thread
// takes part, so a pool of `threads` uses threads - 1 workers. Under Emscripten the workers
// are pthreads (Web Workers), created from the pool Emscripten preloads at start-up.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace sdpa {

class ThreadPool {
 public:
  // task(context, item, thread): thread is in [0, threads()), unique among concurrent calls,
  // so it can index per-thread scratch.
  using Task = void (*)(void* context, int32_t item, int32_t thread);

  explicit ThreadPool(int32_t threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int32_t threads() const { return static_cast<int32_t>(workers_.size()) + 1; }

  // Runs task for every item in [0, items), handing items out in increasing order to
  // whichever thread is free; returns when all have finished. Not reentrant.
  void run(int32_t items, Task task, void* context);

 private:
  void worker_main(int32_t thread);
  void drain(int32_t thread);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  uint64_t generation_ = 0;  // bumped (under mutex_) for every run() and for shutdown
  bool stopping_ = false;
  Task task_ = nullptr;
  void* context_ = nullptr;
  int32_t items_ = 0;
  std::atomic<int32_t> next_item_{0};
  std::atomic<int32_t> busy_workers_{0};
  std::atomic<int32_t> started_workers_{0};  // workers that have reached worker_main
};

// Runs task for every item in [0, items): on pool (ThreadPool::run), or, with no pool, on the
// calling thread as thread 0 in increasing item order (the order a one-thread pool uses too).
inline void run_tasks(ThreadPool* pool, int32_t items, ThreadPool::Task task, void* context) {
  if (pool != nullptr) {
    pool->run(items, task, context);
  } else {
    for (int32_t item = 0; item < items; item++) task(context, item, 0);
  }
}

}  // namespace sdpa
