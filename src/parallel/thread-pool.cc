#include "parallel/thread-pool.h"

#include <cassert>

namespace sdpa {

ThreadPool::ThreadPool(int32_t threads) {
  assert(threads >= 1);
  workers_.reserve(static_cast<size_t>(threads - 1));
  for (int32_t t = 1; t < threads; t++) workers_.emplace_back([this, t] { worker_main(t); });
  // Returns once every worker has started, so that starting them is over before the pool is
  // used and whatever it allocates is in use from here on. Measured (Emscripten 3.1.6, Node):
  // with this thread waiting here, 24 more bytes of the heap are in use once the constructor
  // returns, every time; without the wait, the leak tests (heapBytesInUse before and after a
  // series of calls) once saw 24 bytes appear between their two readings, under load, and it
  // could not be made to happen again: a cause suspected, not proven. Spinning as run() does
  // (a browser's main thread may not block); the workers come from the pool Emscripten preloads,
  // so they start without this thread yielding to its event loop.
  while (started_workers_.load(std::memory_order_acquire) != threads - 1) std::this_thread::yield();
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_++;
  }
  wake_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::drain(int32_t thread) {
  for (;;) {
    const int32_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= items_) return;
    task_(context_, item, thread);
  }
}

void ThreadPool::worker_main(int32_t thread) {
  started_workers_.fetch_add(1, std::memory_order_release);
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return generation_ != seen; });
      seen = generation_;
      if (stopping_) return;
    }
    drain(thread);
    busy_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::run(int32_t items, Task task, void* context) {
  if (workers_.empty() || items <= 1) {
    for (int32_t item = 0; item < items; item++) task(context, item, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    task_ = task;
    context_ = context;
    items_ = items;
    next_item_.store(0, std::memory_order_relaxed);
    busy_workers_.store(static_cast<int32_t>(workers_.size()), std::memory_order_relaxed);
    generation_++;
  }
  wake_.notify_all();
  drain(0);
  // The last items are finishing on other threads. Spin rather than block: a browser's main
  // thread may not sleep on a futex, and the wait is at most one item long.
  while (busy_workers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

}  // namespace sdpa
