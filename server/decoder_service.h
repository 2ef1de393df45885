// The decoded.v1.Decoder service (callback API): Generate streams plus the
// unary Tokenize, Detokenize and GetModelInfo.
//
// All methods are raw (ByteBuffer in and out) and parse with ParseRequest
// (server/request_parser.h), so a request gRPC could not deserialize, such as
// a `string` field that is not UTF-8, is answered with INVALID_ARGUMENT naming
// the field instead of an empty UNIMPLEMENTED (unary) or a silent OK (stream).
//
// The service exists before the engine: until AttachEngine, and again once
// StartDraining is called, every new RPC answers UNAVAILABLE; StartDraining
// also asks every open Generate stream to finish (see GenerateReactor).
// Authentication and readiness are checked before a request is parsed.
//
// No request's work runs on gRPC's callback threads, which every call shares:
// Tokenize and Detokenize run on the utility pool, a stream's turns on the
// turn pool (server/request_pool.h); a full pool answers RESOURCE_EXHAUSTED.
// GetModelInfo, cancels and acks are cheap and answered in place.
#ifndef DECODED_SERVER_DECODER_SERVICE_H_
#define DECODED_SERVER_DECODER_SERVICE_H_

#include <atomic>
#include <string>
#include <utility>

#include "engine/serving/engine.h"
#include "proto/decoded.grpc.pb.h"
#include "server/client_connections.h"
#include "server/metrics.h"
#include "server/peer_sessions.h"
#include "server/request_pool.h"
#include "server/reset_guard.h"
#include "server/stream_registry.h"

namespace decoded::server {

// Every method is raw (ByteBuffer in and out) so that ParseRequest, not
// gRPC, parses requests. Composed from the generated templates, each
// registering its method's handler on v1::Decoder::Service.
using DecoderServiceBase = v1::Decoder::WithRawCallbackMethod_Generate<
    v1::Decoder::WithRawCallbackMethod_Tokenize<v1::Decoder::WithRawCallbackMethod_Detokenize<
        v1::Decoder::WithRawCallbackMethod_GetModelInfo<v1::Decoder::Service>>>>;

struct DecoderServiceOptions {
  // Non-empty: every RPC must carry "authorization: Bearer <auth_token>",
  // else UNAUTHENTICATED.
  std::string auth_token;
  int max_streams = 1024;         // open Generate streams (StreamRegistry)
  int max_sessions_per_peer = 0;  // PeerSessions; 0: no limit
  int max_streams_per_peer = 0;   // StreamRegistry; 0: no limit
  // Request metadata (names + values + 32 bytes per entry, as HPACK counts,
  // RFC 7541 section 4.1) beyond which a call is refused on its own with
  // RESOURCE_EXHAUSTED.
  int64_t max_metadata_bytes = 8192;
};

class DecoderService final : public DecoderServiceBase {
 public:
  // The pools must outlive the gRPC server (their tasks finish its calls).
  // `resets` may be null (no limit on the rate of client resets), as may
  // `progress` (no connection progress reported).
  DecoderService(ServerMetrics* metrics, RequestPool* turn_pool, RequestPool* utility_pool, ResetGuard* resets,
                 ClientConnections* progress, const DecoderServiceOptions& options);

  // `engine` must outlive every RPC (the server shuts down before it goes).
  void AttachEngine(serving::Engine* engine) { engine_.store(engine); }
  void StartDraining() {
    draining_.store(true);
    streams_.StartDrain();
  }
  // The open Generate streams.
  StreamRegistry& streams() { return streams_; }
  // Whether `context` carries the bearer token (always true without one).
  bool Authorized(const grpc::CallbackServerContext& context) const;

  // Each read is a serialized GenerateRequest, each write a serialized
  // GenerateResponse (see GenerateReactor).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context) override;
  // Raw unary methods: `request` holds the serialized TokenizeRequest,
  // DetokenizeRequest or GetModelInfoRequest, `response` receives the
  // serialized reply (sent only with OK); both are owned by gRPC.
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // The engine, or null with the status to answer (UNAUTHENTICATED, UNAVAILABLE).
  serving::Engine* Ready(const grpc::CallbackServerContext& context, absl::Status* refuse) const;

  ServerMetrics* const metrics_;
  RequestPool* const turn_pool_;
  RequestPool* const utility_pool_;
  ResetGuard* const resets_;
  ClientConnections* const progress_;
  const std::string auth_token_;
  const int64_t max_metadata_bytes_;
  std::atomic<serving::Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  StreamRegistry streams_;
  PeerSessions peers_;

 public:
  // Sessions per client address, shared with the HTTP front door.
  PeerSessions& peers() { return peers_; }
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_DECODER_SERVICE_H_
