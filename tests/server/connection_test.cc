#include "server/connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace kvq {
namespace {

// A real loopback connection: a listening socket, a client and the
// server's accepted end.
struct LoopbackPair {
  int listener = -1, client = -1, server = -1;
  ~LoopbackPair() {
    for (int fd : {listener, client, server}) {
      if (fd >= 0) close(fd);
    }
  }
};

void Open(LoopbackPair* p) {
  p->listener = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(p->listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(p->listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(p->listener, 4), 0);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(getsockname(p->listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  p->client = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_EQ(connect(p->client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  p->server = accept(p->listener, nullptr, nullptr);
  ASSERT_GE(p->server, 0);
}

TEST(ConnectionTest, PeerClosedSeesTheClientGo) {
  LoopbackPair p;
  Open(&p);
  EXPECT_FALSE(PeerClosed(p.server));
  // Bytes from the client (a pipelined request) mean it is still there,
  // and PeerClosed leaves them for the server to read.
  ASSERT_EQ(write(p.client, "GET", 3), 3);
  usleep(20 * 1000);
  EXPECT_FALSE(PeerClosed(p.server));
  char buffer[8];
  ASSERT_EQ(read(p.server, buffer, sizeof(buffer)), 3);
  close(p.client);
  p.client = -1;
  usleep(20 * 1000);  // loopback delivers the FIN at once; a margin for a busy core
  EXPECT_TRUE(PeerClosed(p.server));
  EXPECT_FALSE(PeerClosed(-1));
}

TEST(ConnectionTest, PeerClosedSeesAReset) {
  LoopbackPair p;
  Open(&p);
  linger abort_on_close{1, 0};  // close sends RST instead of FIN
  ASSERT_EQ(setsockopt(p.client, SOL_SOCKET, SO_LINGER, &abort_on_close, sizeof(abort_on_close)),
            0);
  close(p.client);
  p.client = -1;
  usleep(20 * 1000);
  EXPECT_TRUE(PeerClosed(p.server));
}

}  // namespace
}  // namespace kvq
