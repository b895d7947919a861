// Hidden `kvshift dist-selftest`: exercises every collective of the world
// communicator with known values (run it under mpirun). --mismatch makes
// rank r pass 3 + r elements to an all-reduce, which must end in a clear
// kvs::Error on every rank, not a hang (tests/parallel/test_dist_dp.cpp).
// --stall-rank R keeps rank R out of MPI (asleep) for --stall-s seconds (before
// the first collective, or with --stall-at-end after the last one), and
// --exit-rank R makes rank R exit before the first collective: the other ranks
// must stop within KVS_COLLECTIVE_TIMEOUT_S, naming rank R (docs/RELIABILITY.md).
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>
#include <vector>

#include "cli/commands/commands.h"
#include "cli/commands/world_guard.h"
#include "core/error.h"
#include "dist/world.h"

namespace kvs::cli {
namespace {

struct Faults {
  bool mismatch = false, stall_at_end = false;
  int stall_rank = -1, exit_rank = -1;
  double stall_s = 60;
};

void selftest(dist::Communicator& w, const Faults& f) {
  using dist::DType;
  using dist::ReduceOp;
  const int n = w.size(), r = w.rank();
  const bool mismatch = f.mismatch;
  if (r == f.exit_rank) ::_exit(0);  // gone without a word, as a crashed node
  if (r == f.stall_rank && !f.stall_at_end) std::this_thread::sleep_for(std::chrono::duration<double>(f.stall_s));
  if (mismatch) {
    std::vector<float> buf(3 + r, 1.0f);
    w.all_reduce(buf.data(), buf.size(), DType::F32, ReduceOp::Sum);
    fail("dist-selftest: the mismatched all_reduce did not fail");
  }
  // all_reduce: sum and average of rank+1.
  double s[2] = {r + 1.0, r + 1.0};
  w.all_reduce(s, 1, DType::F64, ReduceOp::Sum);
  w.all_reduce(s + 1, 1, DType::F64, ReduceOp::Average);
  // Max (the vocab-parallel cross-entropy's row maxima): the largest rank wins, in both types.
  float mf = static_cast<float>(r);
  double md = -static_cast<double>(r);
  w.all_reduce(&mf, 1, DType::F32, ReduceOp::Max);
  w.all_reduce(&md, 1, DType::F64, ReduceOp::Max);
  KVS_CHECK(mf == n - 1 && md == 0.0, "all_reduce max: got {} and {}", mf, md);
  KVS_CHECK(s[0] == n * (n + 1) / 2.0 && std::abs(s[1] - (n + 1) / 2.0) < 1e-12, "all_reduce: got {} and {}", s[0],
            s[1]);
  // reduce_scatter: element i of every rank is i, so rank r receives n * (2r, 2r+1).
  std::vector<float> send(2 * n), recv(2);
  for (int i = 0; i < 2 * n; ++i) send[i] = static_cast<float>(i);
  w.reduce_scatter(send.data(), recv.data(), 2, DType::F32, ReduceOp::Sum);
  KVS_CHECK(recv[0] == n * 2.0f * r && recv[1] == n * (2.0f * r + 1), "reduce_scatter: rank {} got {} {}", r, recv[0],
            recv[1]);
  // all_gather: rank order.
  float mine = static_cast<float>(10 * r);
  std::vector<float> all(n);
  w.all_gather(&mine, all.data(), 1, DType::F32);
  for (int i = 0; i < n; ++i) KVS_CHECK(all[i] == 10.0f * i, "all_gather: slot {} holds {}", i, all[i]);
  // broadcast from the last rank.
  double b = r == n - 1 ? 42.0 : -1.0;
  w.broadcast(&b, 1, DType::F64, n - 1);
  KVS_CHECK(b == 42.0, "broadcast: rank {} got {}", r, b);
  // split into even and odd ranks.
  auto sub = w.split(r % 2, r);
  KVS_CHECK(sub->size() == (n + 1 - r % 2) / 2 && sub->rank() == r / 2, "split: rank {} got {} of {}", r, sub->rank(),
            sub->size());
  w.barrier();
  if (r == f.stall_rank && f.stall_at_end) std::this_thread::sleep_for(std::chrono::duration<double>(f.stall_s));
}

}  // namespace

void add_dist_selftest(CLI::App& app) {
  auto* cmd = app.add_subcommand("dist-selftest", "Check the world communicator's collectives (run under mpirun)");
  cmd->group("");  // hidden: a developer and test tool
  auto f = std::make_shared<Faults>();
  cmd->add_flag("--mismatch", f->mismatch, "Make the ranks pass different sizes to one all-reduce (must fail cleanly)");
  cmd->add_option("--stall-rank", f->stall_rank, "This rank sleeps outside MPI before the first collective");
  cmd->add_option("--stall-s", f->stall_s, "How long --stall-rank sleeps (default 60 s)");
  cmd->add_flag("--stall-at-end", f->stall_at_end, "--stall-rank sleeps after the last collective, not before the first");
  cmd->add_option("--exit-rank", f->exit_rank, "This rank exits before the first collective");
  cmd->callback([f]() {
    auto world = dist::make_world(Device::Cpu);  // host buffers: the MPI (or single) backend
    run_on_world(*world, [&] { selftest(*world, *f); });
    if (world->rank() == 0)
      std::printf("dist-selftest: %d ranks, backend %s: ok\n", world->size(), world->backend().c_str());
  });
}

}  // namespace kvs::cli
