// Protocol (all integers big-endian uint32):
//   rank r -> 0 : HELLO  magic, r, world_size
//   0 -> rank r : REPLY  magic, status (0 ok | 1 error), n, n bytes (blob | error text)
//   rank r -> 0 : ACK    magic              (the blob arrived)
//   0 -> rank r : GO     magic              (every rank has it: proceed)
// Rank 0 replies only when all ranks said hello, and sends GO only when all
// acknowledged, so no rank leaves alone. Sockets are non-blocking and every
// wait is a poll() against a deadline.
#include "dist/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace kvs::dist {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kMagic = 0x4b565342;  // "KVSB"

// Owns one file descriptor.
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept { std::swap(fd, o.fd); return *this; }
  ~Fd() { if (fd >= 0) ::close(fd); }
};

std::string err() { return std::strerror(errno); }

Clock::time_point after(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

int ms_left(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return ms < 0 ? 0 : static_cast<int>(std::min<long long>(ms, 1000000));
}

// Waits for `events` on fd; false on timeout.
bool wait_fd(int fd, short events, Clock::time_point deadline, const std::string& who) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, ms_left(deadline));
    if (r > 0) return true;
    if (r == 0) return false;
    KVS_CHECK(errno == EINTR, "{}: poll failed: {}", who, err());
  }
}

void set_nonblocking(int fd, const std::string& who) {
  const int fl = ::fcntl(fd, F_GETFL);
  KVS_CHECK(fl >= 0 && ::fcntl(fd, F_SETFL, fl | O_NONBLOCK) == 0, "{}: fcntl failed: {}", who, err());
}

// Reads or writes exactly n bytes before the deadline; `what` names the peer in errors.
void io_exact(int fd, void* buf, size_t n, bool write, Clock::time_point deadline, const std::string& who,
              const std::string& what) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    const ssize_t k = write ? ::send(fd, p, n, MSG_NOSIGNAL) : ::recv(fd, p, n, 0);
    if (k > 0) { p += k; n -= static_cast<size_t>(k); continue; }
    KVS_CHECK(k != 0, "{}: connection closed while {}", who, what);
    if (errno == EINTR) continue;
    KVS_CHECK(errno == EAGAIN || errno == EWOULDBLOCK, "{}: error while {}: {}", who, what, err());
    KVS_CHECK(wait_fd(fd, write ? POLLOUT : POLLIN, deadline, who), "{}: timed out while {}", who, what);
  }
}

void send_u32s(int fd, std::vector<uint32_t> v, Clock::time_point dl, const std::string& who, const std::string& what) {
  for (auto& x : v) x = htonl(x);
  io_exact(fd, v.data(), v.size() * 4, true, dl, who, what);
}

std::vector<uint32_t> recv_u32s(int fd, size_t n, Clock::time_point dl, const std::string& who, const std::string& what) {
  std::vector<uint32_t> v(n);
  io_exact(fd, v.data(), n * 4, false, dl, who, what);
  for (auto& x : v) x = ntohl(x);
  KVS_CHECK(v[0] == kMagic, "{}: not a kvshift bootstrap peer (bad magic) while {}", who, what);
  return v;
}

double env_double(const char* name, double def) {
  const char* v = std::getenv(name);
  if (!v) return def;
  char* end = nullptr;
  const double x = std::strtod(v, &end);
  KVS_CHECK(*v && end && *end == '\0' && x > 0, "{}='{}' is not a positive number of seconds", name, v);
  return x;
}

// ---- rank 0 ----

std::string run_root(const LaunchInfo& l, const BootstrapOptions& o, const std::string& blob) {
  const std::string who = "rank 0";
  const std::string where = fmt::format("{}:{}", o.addr, o.port);
  // Listen on every interface: MASTER_ADDR may resolve to a loopback alias on
  // rank 0's own host (Debian's 127.0.1.1) while the others reach it by name.
  Fd lis(::socket(AF_INET, SOCK_STREAM, 0));
  KVS_CHECK(lis.fd >= 0, "{}: socket failed: {}", who, err());
  const int one = 1;
  KVS_CHECK(::setsockopt(lis.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "{}: setsockopt: {}", who, err());
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<uint16_t>(o.port));
  KVS_CHECK(::bind(lis.fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0,
            "{}: cannot listen on port {} for the bootstrap: {} (set KVS_BOOTSTRAP_PORT to a free port)", who,
            o.port, err());
  KVS_CHECK(::listen(lis.fd, l.world_size) == 0, "{}: listen failed: {}", who, err());
  set_nonblocking(lis.fd, who);

  // Every other rank says hello before the deadline.
  const auto deadline = after(o.timeout_s);
  std::vector<Fd> peers(l.world_size);
  std::vector<Fd> rejected;  // told why before we fail
  int joined = 1;
  std::string failure;
  while (joined < l.world_size && failure.empty()) {
    if (!wait_fd(lis.fd, POLLIN, deadline, who)) {
      std::vector<int> missing;
      for (int r = 1; r < l.world_size; ++r)
        if (peers[r].fd < 0) missing.push_back(r);
      failure = fmt::format("rank(s) {} of {} did not join the bootstrap at {} within {} s", fmt::join(missing, ", "),
                            l.world_size, where, o.timeout_s);
      break;
    }
    Fd c(::accept(lis.fd, nullptr, nullptr));
    if (c.fd < 0) {
      KVS_CHECK(errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED,
                "{}: accept failed: {}", who, err());
      continue;
    }
    set_nonblocking(c.fd, who);
    const auto h = recv_u32s(c.fd, 3, deadline, who, "reading a joining rank's hello");
    const int r = static_cast<int>(h[1]);
    const int w = static_cast<int>(h[2]);
    if (w != l.world_size) {
      failure = fmt::format("rank {} has world size {}, rank 0 has {}", r, w, l.world_size);
      rejected.push_back(std::move(c));
    } else if (r <= 0 || r >= l.world_size) {
      failure = fmt::format("a process joined as rank {}, outside 1..{}", r, l.world_size - 1);
      rejected.push_back(std::move(c));
    } else if (peers[r].fd >= 0) {
      failure = fmt::format("rank {} joined twice (two processes with the same RANK)", r);
      rejected.push_back(std::move(c));
    } else {
      peers[r] = std::move(c);
      ++joined;
    }
  }
  // Reply to everyone connected: the blob, or why the bootstrap failed.
  const std::string& body = failure.empty() ? blob : failure;
  const auto io_deadline = after(o.timeout_s);
  for (const std::vector<Fd>* group : {&peers, &rejected}) {
    for (const Fd& p : *group) {
      if (p.fd < 0) continue;
      try {
        const std::string what = "replying to a joined rank";
        send_u32s(p.fd, {kMagic, failure.empty() ? 0u : 1u, static_cast<uint32_t>(body.size())}, io_deadline, who,
                  what);
        io_exact(p.fd, const_cast<char*>(body.data()), body.size(), true, io_deadline, who, what);
      } catch (const Error&) {
        if (failure.empty()) throw;  // already failing: tell the others what we can
      }
    }
  }
  KVS_CHECK(failure.empty(), "{}: {}", who, failure);
  for (int r = 1; r < l.world_size; ++r)
    recv_u32s(peers[r].fd, 1, io_deadline, who, fmt::format("waiting for rank {}'s acknowledgement", r));
  for (int r = 1; r < l.world_size; ++r)
    send_u32s(peers[r].fd, {kMagic}, io_deadline, who, fmt::format("sending go to rank {}", r));
  return blob;
}

// ---- ranks 1.. ----

// Connects to rank 0, retrying (it may start later) until the deadline.
Fd connect_root(const LaunchInfo& l, const BootstrapOptions& o, Clock::time_point deadline, const std::string& who) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int g = ::getaddrinfo(o.addr.c_str(), std::to_string(o.port).c_str(), &hints, &res);
  KVS_CHECK(g == 0, "{}: cannot resolve MASTER_ADDR '{}': {}", who, o.addr, ::gai_strerror(g));
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> hold(res, ::freeaddrinfo);
  std::string last = "no address";
  while (Clock::now() < deadline) {
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      Fd s(::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol));
      KVS_CHECK(s.fd >= 0, "{}: socket failed: {}", who, err());
      set_nonblocking(s.fd, who);
      if (::connect(s.fd, ai->ai_addr, ai->ai_addrlen) == 0) return s;
      if (errno != EINPROGRESS) { last = err(); continue; }
      // A dead host may not answer at all: wait at most 2 s per attempt.
      const auto attempt = std::min(deadline, Clock::now() + std::chrono::seconds(2));
      if (!wait_fd(s.fd, POLLOUT, attempt, who)) { last = "connect timed out"; continue; }
      int e = 0;
      socklen_t len = sizeof e;
      KVS_CHECK(::getsockopt(s.fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0, "{}: getsockopt: {}", who, err());
      if (e == 0) return s;
      last = std::strerror(e);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(200, ms_left(deadline))));
  }
  fail("{}: no answer from rank 0 at {}:{} after {} s ({})", who, o.addr, o.port, o.timeout_s, last);
}

std::string run_peer(const LaunchInfo& l, const BootstrapOptions& o) {
  const std::string who = fmt::format("rank {}", l.rank);
  const std::string where = fmt::format("rank 0 at {}:{}", o.addr, o.port);
  Fd s = connect_root(l, o, after(o.timeout_s), who);
  // Rank 0 may wait a whole timeout for the slowest rank after we connected.
  const auto deadline = after(o.timeout_s + 10);
  send_u32s(s.fd, {kMagic, static_cast<uint32_t>(l.rank), static_cast<uint32_t>(l.world_size)}, deadline, who,
            "sending hello to " + where);
  const auto h = recv_u32s(s.fd, 3, deadline, who, "waiting for " + where + " (it may have failed: see its error)");
  KVS_CHECK(h[2] <= (1u << 20), "{}: {} announced a {}-byte message", who, where, h[2]);
  std::string body(h[2], '\0');
  io_exact(s.fd, body.data(), body.size(), false, deadline, who, "reading from " + where);
  KVS_CHECK(h[1] == 0, "{}: the bootstrap failed on rank 0: {}", who, body);
  send_u32s(s.fd, {kMagic}, deadline, who, "acknowledging to " + where);
  recv_u32s(s.fd, 1, deadline, who, "waiting for the go from " + where + " (another rank failed?)");
  return body;
}

}  // namespace

BootstrapOptions bootstrap_options(const LaunchInfo& l) {
  BootstrapOptions o;
  o.addr = l.master_addr;
  o.timeout_s = env_double("KVS_BOOTSTRAP_TIMEOUT_S", 120);
  o.collective_timeout_s = std::max(o.timeout_s, env_double("KVS_COLLECTIVE_TIMEOUT_S", 1800));
  if (l.world_size == 1) return o;
  KVS_CHECK(!o.addr.empty(), "rank {}: the bootstrap needs MASTER_ADDR (rank 0's host) and MASTER_PORT ({} launch)",
            l.rank, l.launcher);
  if (const char* p = std::getenv("KVS_BOOTSTRAP_PORT")) {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    KVS_CHECK(*p && *end == '\0' && x >= 1 && x <= 65535, "KVS_BOOTSTRAP_PORT='{}' is not a port in 1..65535", p);
    o.port = static_cast<int>(x);
  } else {
    KVS_CHECK(l.master_port >= 1, "rank {}: the bootstrap needs MASTER_PORT or KVS_BOOTSTRAP_PORT", l.rank);
    KVS_CHECK(l.master_port < 65535, "MASTER_PORT={} leaves no room for the bootstrap port MASTER_PORT+1 "
              "(set KVS_BOOTSTRAP_PORT)", l.master_port);
    o.port = l.master_port + 1;
  }
  return o;
}

std::string bootstrap_exchange(const LaunchInfo& l, const BootstrapOptions& o, const std::string& blob) {
  if (l.world_size == 1) return blob;
  return l.rank == 0 ? run_root(l, o, blob) : run_peer(l, o);
}

}  // namespace kvs::dist
