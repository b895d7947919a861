// Alternate signal stacks (core/signal_stack.h): handlers others installed
// without SA_ONSTACK are moved onto them, keeping everything else they set.
#include <gtest/gtest.h>
#include <signal.h>

#include "core/signal_stack.h"

namespace kvs {
namespace {

extern "C" void count_signal(int) {}
extern "C" void count_signal_info(int, siginfo_t*, void*) {}

struct SavedAction {
  int sig;
  struct sigaction old {};
  explicit SavedAction(int s) : sig(s) { ::sigaction(sig, nullptr, &old); }
  ~SavedAction() { ::sigaction(sig, &old, nullptr); }
};

struct sigaction read_action(int sig) {
  struct sigaction a {};
  ::sigaction(sig, nullptr, &a);
  return a;
}

TEST(SignalStack, HandlersWithoutOnStackAreMovedAndKeepTheRest) {
  const SavedAction s1(SIGUSR1), s2(SIGPROF), s3(SIGWINCH), s4(SIGURG);
  struct sigaction plain {};
  plain.sa_handler = count_signal;
  plain.sa_flags = SA_RESTART;
  sigemptyset(&plain.sa_mask);
  sigaddset(&plain.sa_mask, SIGTERM);
  ASSERT_EQ(::sigaction(SIGUSR1, &plain, nullptr), 0);
  struct sigaction info {};
  info.sa_sigaction = count_signal_info;
  info.sa_flags = SA_SIGINFO;
  sigemptyset(&info.sa_mask);
  ASSERT_EQ(::sigaction(SIGPROF, &info, nullptr), 0);
  struct sigaction ign {};
  ign.sa_handler = SIG_IGN;
  ASSERT_EQ(::sigaction(SIGWINCH, &ign, nullptr), 0);
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  ASSERT_EQ(::sigaction(SIGURG, &dfl, nullptr), 0);

  EXPECT_GE(move_signal_handlers_to_alternate_stacks(), 2);

  const struct sigaction u = read_action(SIGUSR1), p = read_action(SIGPROF);
  EXPECT_EQ(u.sa_handler, &count_signal);
  EXPECT_TRUE(u.sa_flags & SA_ONSTACK);
  EXPECT_TRUE(u.sa_flags & SA_RESTART);
  EXPECT_FALSE(u.sa_flags & SA_SIGINFO);
  EXPECT_TRUE(sigismember(&u.sa_mask, SIGTERM));
  EXPECT_EQ(p.sa_sigaction, &count_signal_info);
  EXPECT_TRUE(p.sa_flags & SA_ONSTACK);
  EXPECT_TRUE(p.sa_flags & SA_SIGINFO);
  EXPECT_FALSE(read_action(SIGWINCH).sa_flags & SA_ONSTACK);  // ignored: nothing runs
  EXPECT_EQ(read_action(SIGWINCH).sa_handler, SIG_IGN);
  EXPECT_FALSE(read_action(SIGURG).sa_flags & SA_ONSTACK);
  EXPECT_EQ(read_action(SIGURG).sa_handler, SIG_DFL);

  EXPECT_EQ(move_signal_handlers_to_alternate_stacks(), 0);  // nothing left to move
}

}  // namespace
}  // namespace kvs
