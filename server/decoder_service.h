// The decoded.v1.Decoder service (callback API): Generate streams plus the
// unary Tokenize, Detokenize and GetModelInfo.
//
// The service exists before the engine: until AttachEngine, and again once
// StartDraining is called, every new RPC answers UNAVAILABLE; StartDraining
// also asks every open Generate stream to finish (see GenerateReactor).
#ifndef DECODED_SERVER_DECODER_SERVICE_H_
#define DECODED_SERVER_DECODER_SERVICE_H_

#include <atomic>
#include <string>
#include <utility>

#include "engine/serving/engine.h"
#include "proto/decoded.grpc.pb.h"
#include "server/metrics.h"
#include "server/stream_registry.h"

namespace decoded::server {

class DecoderService final : public v1::Decoder::CallbackService {
 public:
  // `auth_token` non-empty: every RPC must carry the metadata
  // "authorization: Bearer <auth_token>", else UNAUTHENTICATED.
  DecoderService(ServerMetrics* metrics, std::string auth_token)
      : metrics_(metrics), auth_token_(std::move(auth_token)) {}

  // `engine` must outlive every RPC (the server shuts down before it goes).
  void AttachEngine(serving::Engine* engine) { engine_.store(engine); }
  void StartDraining() {
    draining_.store(true);
    streams_.StartDrain();
  }
  // The open Generate streams.
  StreamRegistry& streams() { return streams_; }

  grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context, const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* Detokenize(grpc::CallbackServerContext* context, const v1::DetokenizeRequest* request,
                                       v1::DetokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::GetModelInfoRequest* request, v1::ModelInfo* response) override;

 private:
  // The engine, or null with the UNAVAILABLE status to answer.
  serving::Engine* Ready(const grpc::CallbackServerContext& context, absl::Status* refuse) const;

  ServerMetrics* const metrics_;
  const std::string auth_token_;
  std::atomic<serving::Engine*> engine_{nullptr};
  std::atomic<bool> draining_{false};
  StreamRegistry streams_;
};

}  // namespace decoded::server

#endif  // DECODED_SERVER_DECODER_SERVICE_H_
