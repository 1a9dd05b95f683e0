#include "server/connection.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netdb.h>
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

// The addresses as httplib puts them in a Request: numeric IP and port.
void Address(int fd, bool peer, std::string* ip, int* port) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  ASSERT_EQ(peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len)
                 : getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len),
            0);
  char host[NI_MAXHOST];
  ASSERT_EQ(getnameinfo(reinterpret_cast<sockaddr*>(&addr), len, host, sizeof(host), nullptr, 0,
                        NI_NUMERICHOST),
            0);
  *ip = host;
  *port = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

TEST(ConnectionTest, FindsTheServerSideSocketByItsAddresses) {
  LoopbackPair a, b;
  Open(&a);
  Open(&b);
  std::string local_ip, remote_ip;
  int local_port = -1, remote_port = -1;
  Address(a.server, false, &local_ip, &local_port);
  Address(a.server, true, &remote_ip, &remote_port);
  // Not the client end (the same pair of addresses, swapped), not b.
  EXPECT_EQ(FindConnectionSocket(local_ip, local_port, remote_ip, remote_port), a.server);
  EXPECT_EQ(FindConnectionSocket(remote_ip, remote_port, local_ip, local_port), a.client);
  Address(b.server, false, &local_ip, &local_port);
  Address(b.server, true, &remote_ip, &remote_port);
  EXPECT_EQ(FindConnectionSocket(local_ip, local_port, remote_ip, remote_port), b.server);
  EXPECT_EQ(FindConnectionSocket(local_ip, local_port, "127.0.0.2", remote_port), -1);
  EXPECT_EQ(FindConnectionSocket(local_ip, local_port, remote_ip, -1), -1);
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
