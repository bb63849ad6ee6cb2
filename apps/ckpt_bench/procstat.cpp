// SPDX-License-Identifier: Apache-2.0
// Process probes: resident memory from /proc/self/status, CPU time from the POSIX clocks,
// page faults from getrusage, the machine's busy and idle CPU from /proc/stat, storage reads
// from /proc/self/io.
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <ctime>
#include <fstream>
#include <string>

#include "bench.hpp"

namespace bench {

namespace {
std::uint64_t status_kb(const char* key) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(in, line))
    if (line.rfind(k, 0) == 0) return std::stoull(line.substr(k.size())) * 1024;
  return 0;
}

double clock_s(clockid_t id) {
  timespec ts{};
  clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}
}  // namespace

std::uint64_t rss_bytes() { return status_kb("VmRSS"); }
std::uint64_t hwm_bytes() { return status_kb("VmHWM"); }

bool reset_hwm() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

MachineCpu machine_cpu_s() {
  std::ifstream in("/proc/stat");
  std::string cpu;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
  in >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  if (cpu != "cpu") return {};
  const double hz = static_cast<double>(sysconf(_SC_CLK_TCK));
  return {static_cast<double>(user + nice + system + irq + softirq + steal) / hz, static_cast<double>(idle + iowait) / hz};
}

std::uint64_t process_read_bytes() {
  std::ifstream in("/proc/self/io");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("read_bytes:", 0) == 0) return std::stoull(line.substr(11));
  return 0;
}

double process_cpu_s() { return clock_s(CLOCK_PROCESS_CPUTIME_ID); }
double thread_cpu_s() { return clock_s(CLOCK_THREAD_CPUTIME_ID); }

std::uint64_t minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<std::uint64_t>(u.ru_minflt);
}

void drop_file_cache(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

}  // namespace bench
