#include "parallel/thread-pool.h"

#include <cassert>
#include <climits>
#include <cmath>

#ifdef __EMSCRIPTEN__
#include <emscripten/threading.h>
#endif

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
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_workers();
  for (std::thread& worker : workers_) worker.join();
}

// Under Emscripten the workers sleep on the generation word itself (memory.atomic.wait32 in
// the worker, memory.atomic.notify here, which never blocks). Through std::condition_variable
// (musl's, Emscripten 3.1.6) the notifying thread sometimes waited for the woken worker: in
// traces of two-thread decode steps (AMD EPYC Zen 4 KVM host, Node 20) notify_all() returned
// after 1.2 ms, the worker having run 30 of the 32 items meanwhile, in one idle pattern of five.
void ThreadPool::wake_workers() {
#ifdef __EMSCRIPTEN__
  emscripten_futex_wake(&generation_, INT_MAX);
#else
  wake_.notify_all();
#endif
}

void ThreadPool::wait_for_generation_after(uint32_t seen) {
#ifdef __EMSCRIPTEN__
  while (generation_.load(std::memory_order_acquire) == seen) emscripten_futex_wait(&generation_, seen, INFINITY);
#else
  std::unique_lock<std::mutex> lock(mutex_);
  wake_.wait(lock, [&] { return generation_.load(std::memory_order_relaxed) != seen; });
#endif
}

void ThreadPool::drain(const Job& job, int32_t thread) {
  for (;;) {
    const int32_t item = next_item_.fetch_add(1, std::memory_order_relaxed);
    if (item >= job.items) return;
    job.task(job.context, item, thread);
    finished_items_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::worker_main(int32_t thread) {
  started_workers_.fetch_add(1, std::memory_order_release);
  uint32_t seen = 0;
  for (;;) {
    wait_for_generation_after(seen);
    Job job;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      seen = generation_.load(std::memory_order_relaxed);
      if (stopping_) return;
      job = job_;
      joined_workers_.fetch_add(1, std::memory_order_relaxed);
    }
    drain(job, thread);
    joined_workers_.fetch_sub(1, std::memory_order_release);
  }
}

void ThreadPool::run(int32_t items, Task task, void* context) {
  if (workers_.empty() || items <= 1) {
    for (int32_t item = 0; item < items; item++) task(context, item, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // A worker that woke late for the last run may still be in its loop, about to find
    // next_item_ past that run's end; it leaves without the lock. Until then next_item_ is its.
    while (joined_workers_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
    job_ = Job{task, context, items};
    next_item_.store(0, std::memory_order_relaxed);
    finished_items_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_workers();
  drain(Job{task, context, items}, 0);
  // Wait for the items other threads took, not for the threads: a worker that has not woken
  // yet has taken none, and this thread has done them. (With a busy process on the other vCPU
  // of a 2-vCPU host, a two-thread GQA decode step, Hq32 Hkv8 E128 at 8192 positions, took
  // 7.8-9.2 ms this way and 8.4-12.2 ms when run() waited for every worker to have come by;
  // docs/performance-log.md.)
  // Spin rather than block: a browser's main thread may not sleep on a futex, and the wait is
  // at most one item long.
  while (finished_items_.load(std::memory_order_acquire) != items) std::this_thread::yield();
}

}  // namespace sdpa
