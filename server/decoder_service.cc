#include "server/decoder_service.h"

#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/bearer_token.h"
#include "server/generate_reactor.h"
#include "server/request_parser.h"
#include "server/response_serializer.h"
#include "server/status_map.h"

namespace decoded::server {

DecoderService::DecoderService(ServerMetrics* metrics, RequestPool* turn_pool, RequestPool* utility_pool,
                               ResetGuard* resets, ClientConnections* progress,
                               const DecoderServiceOptions& options)
    : metrics_(metrics),
      turn_pool_(turn_pool),
      utility_pool_(utility_pool),
      resets_(resets),
      progress_(progress),
      auth_token_(options.auth_token),
      max_metadata_bytes_(options.max_metadata_bytes),
      streams_(options.max_streams, options.max_streams_per_peer),
      peers_(options.max_sessions_per_peer) {}

bool DecoderService::Authorized(const grpc::CallbackServerContext& context) const {
  if (auth_token_.empty()) return true;
  const auto& md = context.client_metadata();
  auto it = md.find("authorization");
  return it != md.end() &&
         BearerTokenMatches(std::string_view(it->second.data(), it->second.size()), auth_token_);
}

serving::Engine* DecoderService::Ready(const grpc::CallbackServerContext& context, absl::Status* refuse) const {
  // A unary call starts once its request has arrived: progress either way.
  if (progress_ != nullptr) progress_->NoteProgress(context.peer());
  int64_t metadata_bytes = 0;
  for (const auto& [key, value] : context.client_metadata()) {
    metadata_bytes += static_cast<int64_t>(key.size() + value.size()) + 32;
  }
  if (metadata_bytes > max_metadata_bytes_) {
    *refuse = absl::ResourceExhaustedError(
        absl::StrCat("the request's metadata counts ", metadata_bytes, " bytes, over the server's limit of ",
                     max_metadata_bytes_, " (--max_metadata_bytes)"));
    return nullptr;
  }
  if (!Authorized(context)) {
    *refuse = absl::UnauthenticatedError("missing or wrong bearer token");
    return nullptr;
  }
  if (draining_.load()) {
    *refuse = absl::UnavailableError("the server is draining");
    return nullptr;
  }
  serving::Engine* engine = engine_.load();
  if (engine == nullptr) *refuse = absl::UnavailableError("the model is still loading");
  return engine;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecoderService::Generate(
    grpc::CallbackServerContext* context) {
  absl::Status refuse;
  StreamServices services;
  services.engine = Ready(*context, &refuse);
  services.metrics = metrics_;
  services.registry = &streams_;
  services.turn_pool = turn_pool_;
  services.peers = &peers_;
  services.resets = resets_;
  services.progress = progress_;
  return new GenerateReactor(context, services, refuse);
}

namespace {

// Finishes a raw unary RPC: with the refusal when the engine is not ready,
// else with the request's parse error, else with the status
// `body(engine, request, &response)` returns; the response is sent on OK only.
// With a `pool`, everything after the refusal runs on it (RESOURCE_EXHAUSTED
// when it is full); a call cancelled while it waited is not worked on.
template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, serving::Engine* engine,
                                   const absl::Status& refuse, const grpc::ByteBuffer* request_wire,
                                   grpc::ByteBuffer* response_wire, RequestPool* pool, ServerMetrics* metrics,
                                   Body body) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (engine == nullptr) {
    reactor->Finish(ToGrpcStatus(refuse));
    return reactor;
  }
  auto work = [context, engine, request_wire, response_wire, reactor, body]() {
    if (context->IsCancelled()) {
      reactor->Finish(grpc::Status::CANCELLED);
      return;
    }
    Request request;
    Response response;
    absl::Status status = ParseRequest(*request_wire, &request);
    if (status.ok()) status = body(*engine, request, &response);
    if (status.ok()) status = SerializeResponse(response, response_wire);
    reactor->Finish(ToGrpcStatus(status));
  };
  if (pool == nullptr) {
    work();
  } else if (absl::Status queued = pool->Submit(work); !queued.ok()) {
    metrics->AdmissionRejected();
    reactor->Finish(ToGrpcStatus(queued));
  }
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* DecoderService::Tokenize(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, engine, refuse, request, response, utility_pool_, metrics_,
      [](serving::Engine& e, const v1::TokenizeRequest& req, v1::TokenizeResponse* resp) {
        absl::StatusOr<std::vector<int32_t>> ids = e.Tokenize(req.text(), req.add_bos(), req.parse_special());
        if (!ids.ok()) return ids.status();
        resp->mutable_ids()->Add(ids->begin(), ids->end());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* DecoderService::Detokenize(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      context, engine, refuse, request, response, utility_pool_, metrics_,
      [](serving::Engine& e, const v1::DetokenizeRequest& req, v1::DetokenizeResponse* resp) {
        absl::StatusOr<std::string> text =
            e.Detokenize(absl::MakeConstSpan(req.ids().data(), req.ids().size()), req.render_special());
        if (text.ok()) resp->set_text(*std::move(text));
        return text.status();
      });
}

grpc::ServerUnaryReactor* DecoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::GetModelInfoRequest, v1::ModelInfo>(
      context, engine, refuse, request, response, /*pool=*/nullptr, metrics_,
      [](serving::Engine& e, const v1::GetModelInfoRequest&, v1::ModelInfo* resp) {
        const serving::EngineModelInfo& info = e.ModelInfo();
        resp->set_family(info.family);
        resp->set_name(info.name);
        resp->set_context_length(info.context_length);
        resp->set_vocab_size(info.vocab_size);
        resp->set_n_layers(info.n_layers);
        resp->set_hidden_size(info.hidden_size);
        resp->set_sliding_window(info.sliding_window);
        resp->set_weight_dtype(info.weight_dtype);
        resp->set_tensor_dtype(info.tensor_dtype);
        resp->set_device(info.device);
        resp->set_backend(info.backend);
        const serving::EngineStats stats = e.Stats();
        resp->set_device_memory_capacity_bytes(stats.device_memory_capacity_bytes);
        resp->set_device_memory_used_bytes(stats.device_memory_bytes);
        resp->set_cpu_isa(info.cpu_isa);
        resp->set_kv_type(info.kv_type);
        resp->set_session_context_length(info.session_context_length);
        resp->set_max_sessions(info.max_sessions);
        resp->set_bos_id(info.bos_id);
        resp->set_eos_id(info.eos_id);
        resp->set_tokenizer(info.tokenizer);
        resp->set_pre_tokenizer(info.pre_tokenizer);
        resp->set_chat_template(info.chat_template);
        resp->set_chat_template_error(info.chat_template_error);
        for (int32_t id : info.end_of_generation_ids) resp->add_end_of_generation_ids(id);
        return absl::OkStatus();
      });
}

}  // namespace decoded::server
