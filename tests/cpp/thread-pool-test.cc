// ThreadPool::run (src/parallel/thread-pool.h): every item of a run runs exactly once, with that
// run's task and context, on a thread index no concurrent item shares, and run() returns only
// after all of them finished, whether or not a worker woke up in time to take any.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include "parallel/thread-pool.h"

namespace sdpa {
namespace {

constexpr int32_t kMaxThreads = 4;

// One run's items. Contexts stay alive for the whole test, so an item run late, or for the
// wrong run, is counted where the checks find it instead of writing into freed memory.
struct RunRecord {
  int32_t items = 0;
  int32_t slow_every = 0;                         // items i with i % slow_every == 0 sleep (0: none)
  std::vector<std::atomic<int32_t>> hits;         // [items]: times item i ran
  std::atomic<int32_t> finished{0};               // items whose task returned
  std::atomic<int32_t> bad_thread{0};             // thread index out of range
  std::atomic<int32_t> (*in_use)[kMaxThreads];    // shared by every run: thread index busy
  std::atomic<int32_t>* overlaps;                 // two items at once on one thread index

  RunRecord(int32_t n, int32_t slow, std::atomic<int32_t> (*busy)[kMaxThreads], std::atomic<int32_t>* overlap)
      : items(n), slow_every(slow), hits(static_cast<size_t>(n)), in_use(busy), overlaps(overlap) {}
};

void record_item(void* context, int32_t item, int32_t thread) {
  RunRecord& r = *static_cast<RunRecord*>(context);
  if (thread < 0 || thread >= kMaxThreads) {
    r.bad_thread.fetch_add(1);
    return;
  }
  if ((*r.in_use)[thread].exchange(1) != 0) r.overlaps->fetch_add(1);
  if (item >= 0 && item < r.items) r.hits[static_cast<size_t>(item)].fetch_add(1);
  if (r.slow_every > 0 && item % r.slow_every == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
  (*r.in_use)[thread].store(0);
  r.finished.fetch_add(1, std::memory_order_release);
}

// Runs of 0..40 items back to back, some with slow items, some after a pause that lets the
// workers fall asleep, so that workers wake while the calling thread is finishing a run alone.
void check_many_runs(int32_t threads) {
  ThreadPool pool(threads);
  std::atomic<int32_t> in_use[kMaxThreads] = {};
  std::atomic<int32_t> overlaps{0};
  std::vector<std::unique_ptr<RunRecord>> runs;
  for (int32_t n = 0; n < 1200; n++) {
    const int32_t items = n % 41;
    const int32_t slow_every = n % 3 == 0 ? 7 : 0;
    if (n % 50 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    runs.push_back(std::make_unique<RunRecord>(items, slow_every, &in_use, &overlaps));
    RunRecord& r = *runs.back();
    pool.run(items, record_item, &r);
    // Every item has returned by now: nothing is left to a worker.
    ASSERT_EQ(r.finished.load(std::memory_order_acquire), items) << "run " << n << ", " << threads << " threads";
  }
  // Give a late worker time to do anything it (wrongly) might, then look at every run.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  for (size_t n = 0; n < runs.size(); n++) {
    const RunRecord& r = *runs[n];
    EXPECT_EQ(r.finished.load(), r.items) << "run " << n;
    EXPECT_EQ(r.bad_thread.load(), 0) << "run " << n;
    for (int32_t i = 0; i < r.items; i++) {
      ASSERT_EQ(r.hits[static_cast<size_t>(i)].load(), 1) << "run " << n << " item " << i << ", " << threads << " threads";
    }
  }
  EXPECT_EQ(overlaps.load(), 0);
}

TEST(ThreadPool, RunsEveryItemExactlyOnceOnDistinctThreadSlots) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int items : {0, 1, 3, 100}) {
      std::vector<std::atomic<int>> runs(static_cast<size_t>(items));
      struct Context { std::vector<std::atomic<int>>* runs; int threads; std::atomic<bool> bad_slot{false}; } ctx{&runs, threads};
      pool.run(items, [](void* c, int32_t item, int32_t thread) {
        auto* x = static_cast<Context*>(c);
        if (thread < 0 || thread >= x->threads) x->bad_slot = true;
        (*x->runs)[static_cast<size_t>(item)]++;
      }, &ctx);
      EXPECT_FALSE(ctx.bad_slot);
      for (int i = 0; i < items; i++) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << "item " << i;
    }
  }
}

TEST(ThreadPool, EveryItemRunsOnceBeforeRunReturnsTwoThreads) { check_many_runs(2); }
TEST(ThreadPool, EveryItemRunsOnceBeforeRunReturnsThreeThreads) { check_many_runs(3); }
TEST(ThreadPool, EveryItemRunsOnceBeforeRunReturnsFourThreads) { check_many_runs(4); }

// A pool made, used for one short run and destroyed at once, many times: the run finishes
// whether or not a worker has woken up yet, and the destructor stops workers still waking.
TEST(ThreadPool, ShortRunsAndImmediateShutdown) {
  for (int32_t t = 2; t <= kMaxThreads; t++) {
    for (int32_t rep = 0; rep < 50; rep++) {
      ThreadPool pool(t);
      std::atomic<int32_t> in_use[kMaxThreads] = {};
      std::atomic<int32_t> overlaps{0};
      RunRecord r(2, 0, &in_use, &overlaps);
      pool.run(2, record_item, &r);
      EXPECT_EQ(r.finished.load(), 2);
      EXPECT_EQ(r.hits[0].load() + r.hits[1].load(), 2);
    }
  }
}

}  // namespace
}  // namespace sdpa
