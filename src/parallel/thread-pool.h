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
  // whichever thread is free; returns when all have finished, without waiting for a worker
  // that has not taken any (one still waking up). Not reentrant.
  void run(int32_t items, Task task, void* context);

 private:
  // One run()'s loop, as a worker copies it (under mutex_) when it joins.
  struct Job {
    Task task;
    void* context;
    int32_t items;
  };

  void worker_main(int32_t thread);
  void drain(const Job& job, int32_t thread);
  // Sleeps until generation_ differs from `seen` (a worker, between runs).
  void wait_for_generation_after(uint32_t seen);
  // Wakes every worker sleeping in wait_for_generation_after; never blocks.
  void wake_workers();

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;  // native builds only (wake_workers)
  // Bumped (under mutex_) for every run() and for shutdown (wrapping); the word sleeping
  // workers wait on (wait_for_generation_after).
  std::atomic<uint32_t> generation_{0};
  bool stopping_ = false;
  Job job_{};                // written under mutex_, only while no worker has joined
  std::atomic<int32_t> next_item_{0};
  std::atomic<int32_t> finished_items_{0};
  // Workers that copied job_ and are still draining it: a worker that wakes after its run()
  // returned finds next_item_ past the end and leaves; run() resets next_item_ only when none
  // is left in the loop before.
  std::atomic<int32_t> joined_workers_{0};
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
