#include "server/decoder_service.h"

#include <vector>

#include "server/generate_reactor.h"
#include "server/status_map.h"

namespace decoded::server {

serving::Engine* DecoderService::Ready(const grpc::CallbackServerContext& context, absl::Status* refuse) const {
  if (!auth_token_.empty()) {
    const auto& md = context.client_metadata();
    auto it = md.find("authorization");
    if (it == md.end() || std::string_view(it->second.data(), it->second.size()) != "Bearer " + auth_token_) {
      *refuse = absl::UnauthenticatedError("missing or wrong bearer token");
      return nullptr;
    }
  }
  if (draining_.load()) {
    *refuse = absl::UnavailableError("the server is draining");
    return nullptr;
  }
  serving::Engine* engine = engine_.load();
  if (engine == nullptr) *refuse = absl::UnavailableError("the model is still loading");
  return engine;
}

grpc::ServerBidiReactor<v1::GenerateRequest, v1::GenerateResponse>* DecoderService::Generate(
    grpc::CallbackServerContext* context) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return new GenerateReactor(engine, metrics_, &streams_, refuse);
}

namespace {

// Finishes a unary RPC: with the refusal when the engine is not ready,
// otherwise with the status `body(engine)` returns.
template <typename Body>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, serving::Engine* engine,
                                   const absl::Status& refuse, Body body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(engine == nullptr ? refuse : body(*engine)));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* DecoderService::Tokenize(grpc::CallbackServerContext* context,
                                                   const v1::TokenizeRequest* request,
                                                   v1::TokenizeResponse* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary(context, engine, refuse, [&](serving::Engine& e) {
    std::vector<int32_t> ids = e.Tokenize(request->text(), request->add_bos(), request->parse_special());
    response->mutable_ids()->Add(ids.begin(), ids.end());
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* DecoderService::Detokenize(grpc::CallbackServerContext* context,
                                                     const v1::DetokenizeRequest* request,
                                                     v1::DetokenizeResponse* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary(context, engine, refuse, [&](serving::Engine& e) {
    std::vector<int32_t> ids(request->ids().begin(), request->ids().end());
    absl::StatusOr<std::string> text = e.Detokenize(ids, request->render_special());
    if (text.ok()) response->set_text(*text);
    return text.status();
  });
}

grpc::ServerUnaryReactor* DecoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const v1::GetModelInfoRequest* request,
                                                       v1::ModelInfo* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary(context, engine, refuse, [&](serving::Engine& e) {
    const serving::EngineModelInfo& info = e.ModelInfo();
    response->set_family(info.family);
    response->set_name(info.name);
    response->set_context_length(info.context_length);
    response->set_vocab_size(info.vocab_size);
    response->set_n_layers(info.n_layers);
    response->set_hidden_size(info.hidden_size);
    response->set_sliding_window(info.sliding_window);
    response->set_weight_dtype(info.weight_dtype);
    response->set_device(info.device);
    response->set_session_context_length(info.session_context_length);
    response->set_max_sessions(info.max_sessions);
    response->set_bos_id(info.bos_id);
    response->set_eos_id(info.eos_id);
    return absl::OkStatus();
  });
}

}  // namespace decoded::server
