// grpc.health.v1 as served by HealthService: Check, Watch (updates, unknown
// services) and Shutdown, which must end every Watch call (gRPC's default
// service leaves them open, holding a drain until its cut point).
#include "server/health_service.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace decoded::server {
namespace {

using grpc::health::v1::Health;
using grpc::health::v1::HealthCheckRequest;
using grpc::health::v1::HealthCheckResponse;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = Health::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(port_), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status Check(const std::string& service, HealthCheckResponse::ServingStatus* status) {
    grpc::ClientContext ctx;
    HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    grpc::Status s = stub_->Check(&ctx, request, &response);
    *status = response.status();
    return s;
  }

  // A Watch call read on the test thread.
  struct WatchCall {
    grpc::ClientContext ctx;
    std::unique_ptr<grpc::ClientReader<HealthCheckResponse>> reader;
    int Next() {  // the next status, or -1 when the call ended
      HealthCheckResponse r;
      return reader->Read(&r) ? r.status() : -1;
    }
  };
  std::unique_ptr<WatchCall> Watch(const std::string& service) {
    auto call = std::make_unique<WatchCall>();
    call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    HealthCheckRequest request;
    request.set_service(service);
    call->reader = stub_->Watch(&call->ctx, request);
    return call;
  }

  HealthService health_{{"decoded.v1.Decoder"}};
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckReportsTheStatusOfKnownServicesOnly) {
  HealthCheckResponse::ServingStatus status;
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);  // until the model is loaded
  health_.SetServing(true);
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::SERVING);
  ASSERT_TRUE(Check("decoded.v1.Decoder", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::SERVING);
  EXPECT_EQ(Check("other.Service", &status).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(HealthServiceTest, WatchSendsTheCurrentStatusThenEachChange) {
  auto watch = Watch("decoded.v1.Decoder");
  EXPECT_EQ(watch->Next(), HealthCheckResponse::NOT_SERVING);
  health_.SetServing(true);
  EXPECT_EQ(watch->Next(), HealthCheckResponse::SERVING);
  health_.SetServing(false);
  EXPECT_EQ(watch->Next(), HealthCheckResponse::NOT_SERVING);
  // An unknown service is SERVICE_UNKNOWN and the call stays open.
  auto unknown = Watch("other.Service");
  EXPECT_EQ(unknown->Next(), HealthCheckResponse::SERVICE_UNKNOWN);
  watch->ctx.TryCancel();
  unknown->ctx.TryCancel();
  EXPECT_EQ(watch->Next(), -1);
  EXPECT_EQ(unknown->Next(), -1);
}

TEST_F(HealthServiceTest, ShutdownSendsNotServingAndEndsEveryWatch) {
  health_.SetServing(true);
  auto watch = Watch("");
  auto unknown = Watch("other.Service");
  EXPECT_EQ(watch->Next(), HealthCheckResponse::SERVING);
  EXPECT_EQ(unknown->Next(), HealthCheckResponse::SERVICE_UNKNOWN);

  const absl::Time start = absl::Now();
  health_.Shutdown();
  EXPECT_EQ(watch->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(watch->Next(), -1);
  EXPECT_EQ(watch->reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(unknown->Next(), -1);
  EXPECT_EQ(unknown->reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));

  // Later: NOT_SERVING for good, and a new Watch ends right after telling so.
  health_.SetServing(true);
  HealthCheckResponse::ServingStatus status;
  ASSERT_TRUE(Check("", &status).ok());
  EXPECT_EQ(status, HealthCheckResponse::NOT_SERVING);
  auto late = Watch("");
  EXPECT_EQ(late->Next(), HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(late->Next(), -1);
  EXPECT_EQ(late->reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace decoded::server
