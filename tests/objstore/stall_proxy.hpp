// SPDX-License-Identifier: Apache-2.0
// A TCP proxy between the S3 client and the test RGW that can stop answering the way a
// SIGSTOPped radosgw does, without stopping the RGW the other object-store tests share: once
// stalled, no byte moves in either direction on any connection and no new connection is
// accepted (the kernel's backlog still completes the handshake, as it does for a stopped
// process), until the proxy is destroyed. The client's own code path (libcurl, its timeouts,
// the retries, the abort of a drain that gives up) is the one a hung store exercises.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ckpt::test {

class StallProxy {
 public:
  /// Forwards 127.0.0.1:<a free port> to `endpoint` ("http://127.0.0.1:PORT").
  explicit StallProxy(const std::string& endpoint) {
    const auto colon = endpoint.rfind(':');
    target_port_ = std::stoi(endpoint.substr(colon + 1));
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (listener_ < 0 || ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener_, 128) != 0 ||
        ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("StallProxy: cannot listen");
    port_ = ntohs(a.sin_port);
    acceptor_ = std::thread([this] { accept_loop(); });
  }
  ~StallProxy() {
    stopping_ = true;
    acceptor_.join();
    std::vector<std::thread> relays;
    {
      std::lock_guard lk(mu_);
      relays.swap(relays_);
    }
    for (auto& t : relays) t.join();
    ::close(listener_);
  }
  StallProxy(const StallProxy&) = delete;
  StallProxy& operator=(const StallProxy&) = delete;

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// Stalls now.
  void stall() { stalled_ = true; }
  /// Stalls when a client sends bytes holding `needle` (e.g. "/step-0000000020/"), that
  /// request included: it never reaches the server.
  void stall_on(std::string needle) {
    std::lock_guard lk(mu_);
    needle_ = std::move(needle);
  }
  bool stalled() const { return stalled_; }

 private:
  void accept_loop() {
    while (!stopping_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0 || stalled_) continue;
      const int client = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      a.sin_port = htons(static_cast<std::uint16_t>(target_port_));
      if (server < 0 || ::connect(server, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
        ::close(client);
        if (server >= 0) ::close(server);
        continue;
      }
      std::lock_guard lk(mu_);
      relays_.emplace_back([this, client, server] { relay(client, server); });
    }
  }

  // Moves bytes both ways until either side closes, the proxy stalls (then holds both ends
  // open, moving nothing) or is destroyed.
  void relay(int client, int server) {
    char buf[65536];
    while (!stopping_) {
      if (stalled_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        continue;
      }
      pollfd p[2] = {{client, POLLIN, 0}, {server, POLLIN, 0}};
      if (::poll(p, 2, 50) <= 0) continue;
      bool closed = false;
      for (int i = 0; i < 2 && !closed && !stalled_; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const ssize_t n = ::read(p[i].fd, buf, sizeof buf);
        if (n <= 0) {
          closed = true;
          break;
        }
        if (i == 0) {
          std::lock_guard lk(mu_);
          if (!needle_.empty() && std::string_view(buf, static_cast<std::size_t>(n)).find(needle_) != std::string_view::npos) {
            stalled_ = true;
            break;
          }
        }
        const int to = i == 0 ? server : client;
        for (ssize_t done = 0; done < n;) {
          const ssize_t w = ::write(to, buf + done, static_cast<std::size_t>(n - done));
          if (w <= 0) {
            closed = true;
            break;
          }
          done += w;
        }
      }
      if (closed) break;
    }
    ::close(client);
    ::close(server);
  }

  int listener_ = -1, port_ = 0, target_port_ = 0;
  std::atomic<bool> stopping_{false}, stalled_{false};
  std::mutex mu_;
  std::string needle_;
  std::vector<std::thread> relays_;
  std::thread acceptor_;
};

}  // namespace ckpt::test
