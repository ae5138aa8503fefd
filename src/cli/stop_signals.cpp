// stop_signals_install: a command's graceful stop on SIGINT/SIGTERM/SIGHUP; see commands.h.
#include <signal.h>
#include <unistd.h>

#include <cstring>

#include "cli/commands.h"

namespace stratum {

namespace {
volatile std::sig_atomic_t g_stop_requested = 0;
const char* g_notice = "";

extern "C" void on_stop_signal(int) {
  g_stop_requested = 1;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &dfl, nullptr);
  [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, g_notice, std::strlen(g_notice));
}
}  // namespace

const volatile std::sig_atomic_t* stop_signals_install(const char* notice) {
  g_notice = notice;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  ::sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(sig, &sa, nullptr);
  return &g_stop_requested;
}

}  // namespace stratum
