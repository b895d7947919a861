// MPI collectives behind Communicator. Every collective first agrees on the
// element count (one small MPI_Allreduce of {-count, count} with MPI_MIN), so
// mismatched sizes end in a kvs::Error on every rank instead of a hang or a
// buffer overrun.
//
// Collectives are MPI-3 non-blocking calls waited on with MPI_Test against a
// deadline (KVS_COLLECTIVE_TIMEOUT_S), so a rank that died or hangs ends in a
// kvs::Error on the ranks still waiting instead of a hang. Before giving up,
// a waiting rank asks every peer, on a duplicate of the communicator, which
// collective it is in; peers answer from inside their own wait loops, so the
// silent ones are the ranks that are dead or stuck outside MPI, and the error
// names them (docs/RELIABILITY.md "Dead and slow ranks").
//
// A point-to-point send larger than the eager limit moves only while the
// sending rank is inside MPI when the single-copy (CMA) path is off
// (containers without ptrace, OMPI_MCA_btl_vader_single_copy_mechanism=none)
// or between nodes: a pipeline stage that computes after its isend keeps the
// next stage waiting. So while isends are pending, a progress thread tests
// them every KVS_MPI_PROGRESS_US microseconds (default 100; 0: no thread).
// MPI runs MPI_THREAD_SERIALIZED: every entry into MPI holds mpi_mutex(), and
// the thread only try-locks it (a caller inside MPI progresses everything).
#include "dist/mpi_comm.h"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"

namespace kvs::dist {
namespace {

std::string mpi_error_string(int code) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(buf, static_cast<size_t>(len));
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) fail("MPI {}: {}", what, mpi_error_string(rc));
}

MPI_Datatype mpi_type(DType t) { return t == DType::F32 ? MPI_FLOAT : MPI_DOUBLE; }
// Average is a sum followed by a division (MPI has no average operation).
MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Max ? MPI_MAX : MPI_SUM; }

using Clock = std::chrono::steady_clock;

// Nanoseconds this process spent waiting in MPI collectives (collective_wait_seconds).
std::atomic<int64_t> g_wait_ns{0};

constexpr int kQueryTag = 7001, kReplyTag = 7002;

double timeout_from_env() {
  const char* v = std::getenv("KVS_COLLECTIVE_TIMEOUT_S");
  if (!v) return 1800;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  KVS_CHECK(*v && end && *end == '\0' && x > 0, "KVS_COLLECTIVE_TIMEOUT_S='{}' is not a positive number of seconds",
            v);
  return x;
}

std::shared_ptr<MpiRuntime> runtime() {
  // One runtime per process, shared by every communicator (weak: finalised
  // when the last communicator is destroyed).
  static std::mutex mu;
  static std::weak_ptr<MpiRuntime> weak;
  std::lock_guard<std::mutex> lock(mu);
  auto rt = weak.lock();
  if (!rt) {
    rt = std::make_shared<MpiRuntime>();
    weak = rt;
  }
  return rt;
}

class MpiComm;
// Every live communicator, so a rank waiting in one answers peers' questions
// on all, and the progress thread finds the pending sends (under mpi_mutex()).
// Never destroyed (nor is the mutex): the progress thread, joined by
// SendProgress's destructor at exit, may still use them then.
std::vector<MpiComm*>& live_comms() {
  static auto* v = new std::vector<MpiComm*>;
  return *v;
}

// Held by every call into MPI (recursive: split() calls barrier()).
std::recursive_mutex& mpi_mutex() {
  static auto* m = new std::recursive_mutex;
  return *m;
}
using MpiLock = std::lock_guard<std::recursive_mutex>;

bool progress_sends_of_live_comms();  // below MpiComm: true while a send is pending

// The progress thread: sleeps until a send starts, then tests the pending
// sends every interval until none is left.
class SendProgress {
 public:
  static SendProgress& get() {
    static SendProgress p;
    return p;
  }
  // Whether MPI allows a second thread (MPI_THREAD_SERIALIZED) and the interval is not 0.
  void enable(bool serialized) {
    const char* v = std::getenv("KVS_MPI_PROGRESS_US");
    long us = 100;
    if (v) {
      char* end = nullptr;
      us = std::strtol(v, &end, 10);
      KVS_CHECK(*v && end && *end == '\0' && us >= 0 && us <= 1000000,
                "KVS_MPI_PROGRESS_US='{}' is not a number of microseconds in [0, 1000000]", v);
    }
    interval_ = std::chrono::microseconds(us);
    enabled_ = serialized && us > 0;
  }
  // A send was started (called after MpiComm::isend released the MPI mutex).
  void kick() {
    if (!enabled_) return;
    std::lock_guard<std::mutex> l(mu_);
    ++generation_;
    if (!thread_.joinable()) {
      stop_ = false;
      thread_ = std::thread([this] { loop(); });
    }
    cv_.notify_one();
  }
  ~SendProgress() { stop(); }  // an exit() that skipped ~MpiRuntime
  // Before MPI_Finalize.
  void stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
      cv_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      uint64_t seen;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stop_) return;
        seen = generation_;
      }
      bool pending = true;  // if MPI is busy, its caller progresses: look again later
      {
        std::unique_lock<std::recursive_mutex> m(mpi_mutex(), std::try_to_lock);
        if (m.owns_lock()) pending = progress_sends_of_live_comms();
      }
      std::unique_lock<std::mutex> l(mu_);
      if (pending)
        cv_.wait_for(l, interval_, [&] { return stop_; });
      else
        cv_.wait(l, [&] { return stop_ || generation_ != seen; });
    }
  }

  bool enabled_ = false;
  std::chrono::microseconds interval_{100};
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

class MpiComm final : public Communicator {
 public:
  MpiComm(std::shared_ptr<MpiRuntime> rt, MPI_Comm comm, bool owned)
      : rt_(std::move(rt)), comm_(comm), owned_(owned), timeout_s_(timeout_from_env()) {
    MpiLock lock(mpi_mutex());
    check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    check(MPI_Comm_rank(comm_, &rank_), "Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "Comm_size");
    // Non-blocking with the deadline, like the collectives: a rank missing at start-up is an error, not a hang.
    MPI_Request dup;
    check(MPI_Comm_idup(comm_, &diag_, &dup), "Comm_idup");
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    for (int done = 0; !done;) {
      check(MPI_Test(&dup, &done, MPI_STATUS_IGNORE), "Comm_idup");
      if (!done && Clock::now() > deadline)
        fail("rank {}: MPI Comm_idup did not complete within {} s (KVS_COLLECTIVE_TIMEOUT_S): a rank is missing or stuck",
             rank_, timeout_s_);
      if (!done) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    check(MPI_Comm_set_errhandler(diag_, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    // World ranks, for messages: a sub-communicator's rank 1 may be world rank 3.
    MPI_Group mine, world;
    check(MPI_Comm_group(comm_, &mine), "Comm_group");
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "Comm_group");
    std::vector<int> local(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) local[static_cast<size_t>(r)] = r;
    world_rank_.resize(local.size());
    check(MPI_Group_translate_ranks(mine, size_, local.data(), world, world_rank_.data()), "Group_translate_ranks");
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    post_query_recv();
    live_comms().push_back(this);
  }
  ~MpiComm() override {
    MpiLock lock(mpi_mutex());
    auto& v = live_comms();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
    if (query_req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&query_req_);
      MPI_Request_free(&query_req_);
    }
    MPI_Comm_free(&diag_);
    if (owned_) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override { return "mpi"; }

  void all_reduce(void* buf, size_t count, DType t, ReduceOp op) override {
    MpiLock lock(mpi_mutex());
    begin("all_reduce");
    agree(count);
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, buf, as_int(count), mpi_type(t), mpi_op(op), comm_, &r), "Iallreduce");
    wait(r);
    if (op == ReduceOp::Average) scale(buf, count, t);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op) override {
    MpiLock lock(mpi_mutex());
    begin("reduce_scatter");
    agree(count);
    MPI_Request r;
    check(MPI_Ireduce_scatter_block(send, recv, as_int(count), mpi_type(t), mpi_op(op), comm_, &r),
          "Ireduce_scatter_block");
    wait(r);
    if (op == ReduceOp::Average) scale(recv, count, t);
  }
  void all_gather(const void* send, void* recv, size_t count, DType t) override {
    MpiLock lock(mpi_mutex());
    begin("all_gather");
    agree(count);
    MPI_Request r;
    check(MPI_Iallgather(send, as_int(count), mpi_type(t), recv, as_int(count), mpi_type(t), comm_, &r),
          "Iallgather");
    wait(r);
  }
  void broadcast(void* buf, size_t count, DType t, int root) override {
    MpiLock lock(mpi_mutex());
    begin("broadcast");
    agree(count);
    check_root(root);
    MPI_Request r;
    check(MPI_Ibcast(buf, as_int(count), mpi_type(t), root, comm_, &r), "Ibcast");
    wait(r);
  }
  void broadcast_bytes(void* buf, size_t bytes, int root) override {
    MpiLock lock(mpi_mutex());
    begin("broadcast_bytes");
    agree(bytes);
    check_root(root);
    MPI_Request r;
    check(MPI_Ibcast(buf, as_int(bytes), MPI_BYTE, root, comm_, &r), "Ibcast");
    wait(r);
  }
  void barrier() override {
    MpiLock lock(mpi_mutex());
    begin("barrier");
    MPI_Request r;
    check(MPI_Ibarrier(comm_, &r), "Ibarrier");
    wait(r);
  }
  // Point to point: waited for like the collectives (a deadline, then the
  // silent peers named), but not counted among them: only some ranks take part.
  int isend(const void* buf, size_t count, DType t, int dest, int tag) override {
    KVS_CHECK(dest >= 0 && dest < size_ && dest != rank_, "isend: rank {} is not a peer among {} ranks", dest, size_);
    int id;
    {
      MpiLock lock(mpi_mutex());
      MPI_Request r = MPI_REQUEST_NULL;
      check(MPI_Isend(buf, as_int(count), mpi_type(t), dest, tag, comm_, &r), "Isend");
      id = next_request_++;
      requests_[id] = {r, MPI_SUCCESS};
    }
    SendProgress::get().kick();
    return id;
  }
  void wait(int request) override {
    MpiLock lock(mpi_mutex());
    auto it = requests_.find(request);
    KVS_CHECK(it != requests_.end(), "wait: no pending request {}", request);
    const PendingSend p = it->second;
    requests_.erase(it);
    what_ = "send";
    check(p.error, "Isend (tested by the progress thread)");
    MPI_Request r = p.request;  // MPI_REQUEST_NULL once the progress thread saw it complete
    wait(r);
  }
  // The progress thread's test of this communicator's pending sends (the
  // caller holds mpi_mutex()); true while one is pending. A failed test is
  // kept for wait() to report.
  bool progress_sends() {
    bool pending = false;
    for (auto& [id, p] : requests_) {
      if (p.request == MPI_REQUEST_NULL) continue;
      int done = 0;
      p.error = MPI_Test(&p.request, &done, MPI_STATUS_IGNORE);
      if (p.error != MPI_SUCCESS) p.request = MPI_REQUEST_NULL;
      pending = pending || (p.error == MPI_SUCCESS && !done);
    }
    return pending;
  }
  void recv(void* buf, size_t count, DType t, int src, int tag) override {
    MpiLock lock(mpi_mutex());
    KVS_CHECK(src >= 0 && src < size_ && src != rank_, "recv: rank {} is not a peer among {} ranks", src, size_);
    // A message longer than count is MPI_ERR_TRUNCATE: sizes cannot silently disagree.
    MPI_Request r = MPI_REQUEST_NULL;
    check(MPI_Irecv(buf, as_int(count), mpi_type(t), src, tag, comm_, &r), "Irecv");
    what_ = "recv";
    wait(r);
  }
  // Not a collective: only the peers take part (as isend and recv).
  void exchange(const std::vector<P2P>& ops, DType t) override {
    MpiLock lock(mpi_mutex());
    std::vector<MPI_Request> rs(ops.size(), MPI_REQUEST_NULL);
    for (size_t i = 0; i < ops.size(); ++i) {
      const P2P& o = ops[i];
      KVS_CHECK(o.peer >= 0 && o.peer < size_ && o.peer != rank_, "exchange: rank {} is not a peer among {} ranks",
                o.peer, size_);
      if (o.send)
        check(MPI_Isend(o.buf, as_int(o.count), mpi_type(t), o.peer, kSendRecvTag, comm_, &rs[i]), "Isend");
      else
        check(MPI_Irecv(o.buf, as_int(o.count), mpi_type(t), o.peer, kSendRecvTag, comm_, &rs[i]), "Irecv");
    }
    what_ = "exchange";
    for (MPI_Request& r : rs) wait(r);
  }
  // Every rank of a ring takes part: counted like a collective.
  void send_recv(const void* send, int dest, void* recv, int src, size_t count, DType t) override {
    MpiLock lock(mpi_mutex());
    KVS_CHECK(dest >= 0 && dest < size_ && src >= 0 && src < size_, "send_recv: rank {} or {} outside {} ranks", dest,
              src, size_);
    begin("send_recv");
    MPI_Request rs = MPI_REQUEST_NULL, rr = MPI_REQUEST_NULL;
    check(MPI_Irecv(recv, as_int(count), mpi_type(t), src, kSendRecvTag, comm_, &rr), "Irecv");
    check(MPI_Isend(send, as_int(count), mpi_type(t), dest, kSendRecvTag, comm_, &rs), "Isend");
    wait(rr);
    wait(rs);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MpiLock lock(mpi_mutex());
    barrier();  // every rank is here (or the deadline names the missing one): MPI_Comm_split itself blocks
    MPI_Comm sub = MPI_COMM_NULL;
    check(MPI_Comm_split(comm_, color, key, &sub), "Comm_split");
    return std::make_unique<MpiComm>(rt_, sub, true);
  }

  // Answers a peer's "which collective are you in?" (from any wait loop).
  void serve_queries() {
    for (;;) {
      int done = 0;
      MPI_Status st;
      if (MPI_Test(&query_req_, &done, &st) != MPI_SUCCESS || !done) return;
      // Each answer keeps its own buffer: a freed send request may still read it.
      replies_.push_back({seq_, in_collective_ ? 1 : 0});
      MPI_Request r;
      if (MPI_Isend(replies_.back().data(), 2, MPI_INT64_T, st.MPI_SOURCE, kReplyTag, diag_, &r) == MPI_SUCCESS)
        MPI_Request_free(&r);
      post_query_recv();
    }
  }

 private:
  void begin(const char* what) {
    what_ = what;
    ++seq_;
  }

  // Every rank must pass the same count; the check is itself a collective of
  // a fixed size, so it cannot mismatch.
  void agree(size_t count) {
    int64_t v[2] = {-static_cast<int64_t>(count), static_cast<int64_t>(count)};
    MPI_Request r;
    check(MPI_Iallreduce(MPI_IN_PLACE, v, 2, MPI_INT64_T, MPI_MIN, comm_, &r), "Iallreduce (size check)");
    wait(r);
    const int64_t max = -v[0], min = v[1];
    if (min != max)
      fail("{}: ranks passed different sizes (min {}, max {} elements; rank {} passed {}) across {} ranks", what_, min,
           max, rank_, count, size_);
  }

  // MPI_Test until done; past the deadline, find out who is missing and fail.
  void wait(MPI_Request& r) {
    const auto start = Clock::now();
    const auto deadline = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
    in_collective_ = true;
    for (uint64_t spins = 0;; ++spins) {
      int done = 0;
      check(MPI_Test(&r, &done, MPI_STATUS_IGNORE), what_);
      if (done) break;
      for (MpiComm* c : live_comms()) c->serve_queries();
      const auto now = Clock::now();
      if (now > deadline) diagnose_and_fail();
      // Spin briefly (most waits are short), then yield, then sleep: ranks
      // oversubscribing the cores must not starve the one being waited for.
      if (spins > 64) {
        if (now - start > std::chrono::milliseconds(20))
          std::this_thread::sleep_for(std::chrono::microseconds(50));
        else
          sched_yield();
      }
    }
    in_collective_ = false;
    g_wait_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
  }

  void post_query_recv() {
    query_req_ = MPI_REQUEST_NULL;
    if (MPI_Irecv(query_in_, 2, MPI_INT64_T, MPI_ANY_SOURCE, kQueryTag, diag_, &query_req_) != MPI_SUCCESS)
      query_req_ = MPI_REQUEST_NULL;
  }

  // Asks every peer which collective it is in and waits a grace period for
  // the answers: the silent peers are dead or stuck outside MPI.
  [[noreturn]] void diagnose_and_fail() {
    replies_.push_back({seq_, 1});
    const int64_t* mine = replies_.back().data();
    std::vector<int64_t> answers(2 * static_cast<size_t>(size_), -1);
    std::vector<MPI_Request> recvs;
    std::vector<int> peer;
    for (int p = 0; p < size_; ++p) {
      if (p == rank_) continue;
      MPI_Request s;
      if (MPI_Isend(mine, 2, MPI_INT64_T, p, kQueryTag, diag_, &s) == MPI_SUCCESS) MPI_Request_free(&s);
      MPI_Request rr;
      if (MPI_Irecv(&answers[2 * static_cast<size_t>(p)], 2, MPI_INT64_T, p, kReplyTag, diag_, &rr) == MPI_SUCCESS) {
        recvs.push_back(rr);
        peer.push_back(p);
      }
    }
    const double grace_s = std::clamp(timeout_s_ / 4, 1.0, 10.0);
    const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(grace_s));
    std::vector<bool> answered(recvs.size(), false);
    while (Clock::now() < until) {
      bool all = true;
      for (size_t i = 0; i < recvs.size(); ++i) {
        if (answered[i]) continue;
        int done = 0;
        if (MPI_Test(&recvs[i], &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done) answered[i] = true;
        all = all && answered[i];
      }
      if (all) break;
      for (MpiComm* c : live_comms()) c->serve_queries();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::vector<std::string> silent, elsewhere;
    for (size_t i = 0; i < recvs.size(); ++i) {
      const int p = peer[i];
      const std::string who = fmt::format("{}", world_rank_[static_cast<size_t>(p)]);
      if (!answered[i]) {
        MPI_Cancel(&recvs[i]);
        MPI_Request_free(&recvs[i]);
        silent.push_back(who);
      } else if (answers[2 * static_cast<size_t>(p)] != seq_ || answers[2 * static_cast<size_t>(p) + 1] == 0) {
        elsewhere.push_back(fmt::format("{} (at collective #{})", who, answers[2 * static_cast<size_t>(p)]));
      }
    }
    auto list = [](const std::vector<std::string>& v) {
      std::string s;
      const size_t shown = std::min<size_t>(v.size(), 8);
      for (size_t i = 0; i < shown; ++i) s += (i ? ", " : "") + v[i];
      if (v.size() > shown) s += fmt::format(" and {} more", v.size() - shown);
      return s;
    };
    std::string why;
    if (!silent.empty())
      why = fmt::format("rank{} {} did not answer (dead, or stuck outside MPI)", silent.size() > 1 ? "s" : "",
                        list(silent));
    else if (!elsewhere.empty())
      why = fmt::format("rank{} {} {} not waiting in it (the ranks disagree on the order of collectives)",
                        elsewhere.size() > 1 ? "s" : "", list(elsewhere), elsewhere.size() > 1 ? "are" : "is");
    else
      why = "every rank is waiting in it (a network or MPI failure?)";
    in_collective_ = false;  // this collective is abandoned
    fail("rank {}: MPI {} (collective #{}) did not complete within {} s (KVS_COLLECTIVE_TIMEOUT_S): {}",
         world_rank_[static_cast<size_t>(rank_)], what_, seq_, timeout_s_, why);
  }

  void check_root(int root) const {
    KVS_CHECK(root >= 0 && root < size_, "broadcast: root {} outside a world of {} ranks", root, size_);
  }
  static int as_int(size_t count) {
    KVS_CHECK(count <= static_cast<size_t>(INT32_MAX), "MPI collective: {} elements exceed the int count limit", count);
    return static_cast<int>(count);
  }
  void scale(void* buf, size_t count, DType t) const {
    if (t == DType::F32) {
      auto* p = static_cast<float*>(buf);
      const float s = 1.0f / static_cast<float>(size_);
      for (size_t i = 0; i < count; ++i) p[i] *= s;
    } else {
      auto* p = static_cast<double*>(buf);
      const double s = 1.0 / size_;
      for (size_t i = 0; i < count; ++i) p[i] *= s;
    }
  }

  static constexpr int kSendRecvTag = 17;
  struct PendingSend {
    MPI_Request request;
    int error;  // of a test by the progress thread
  };
  std::map<int, PendingSend> requests_;  // isend's, until waited for
  int next_request_ = 0;
  std::shared_ptr<MpiRuntime> rt_;
  MPI_Comm comm_;
  MPI_Comm diag_ = MPI_COMM_NULL;  // queries and answers about who is missing, apart from the collectives
  bool owned_;
  double timeout_s_;
  int rank_ = 0, size_ = 1;
  std::vector<int> world_rank_;
  const char* what_ = "";
  int64_t seq_ = 0;  // collectives started on this communicator (the same on every rank)
  bool in_collective_ = false;
  MPI_Request query_req_ = MPI_REQUEST_NULL;
  int64_t query_in_[2] = {0, 0};
  std::deque<std::array<int64_t, 2>> replies_;  // grows only when peers ask, i.e. when something is wrong
};

bool progress_sends_of_live_comms() {
  bool pending = false;
  for (MpiComm* c : live_comms()) pending = c->progress_sends() || pending;
  return pending;
}

}  // namespace

MpiRuntime::MpiRuntime() {
  MpiLock lock(mpi_mutex());
  int inited = 0, provided = 0;
  check(MPI_Initialized(&inited), "Initialized");
  if (inited) {
    check(MPI_Query_thread(&provided), "Query_thread");
  } else {
    // SERIALIZED for the progress thread; FUNNELED (the caller's thread alone) is enough without it.
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided), "Init_thread");
    owns_ = true;
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "Comm_set_errhandler");
    KVS_CHECK(provided >= MPI_THREAD_FUNNELED, "MPI: the library gives thread level {}, need MPI_THREAD_FUNNELED",
              provided);
  }
  SendProgress::get().enable(provided >= MPI_THREAD_SERIALIZED);
}

MpiRuntime::~MpiRuntime() {
  SendProgress::get().stop();  // before MPI_Finalize: the thread calls into MPI
  MpiLock lock(mpi_mutex());
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

std::unique_ptr<Communicator> make_mpi_world() { return std::make_unique<MpiComm>(runtime(), MPI_COMM_WORLD, false); }

double collective_wait_seconds() { return static_cast<double>(g_wait_ns.load()) * 1e-9; }

void mpi_abort_if_running(int code) {
  MpiLock lock(mpi_mutex());  // the progress thread's test, if one is running, ends first
  int inited = 0, finalized = 0;
  MPI_Initialized(&inited);
  MPI_Finalized(&finalized);
  if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace kvs::dist
