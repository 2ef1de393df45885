#include "server/decoder_service.h"

#include <string_view>
#include <vector>

#include "absl/strings/match.h"

#include "server/generate_reactor.h"
#include "server/request_parser.h"
#include "server/response_serializer.h"
#include "server/status_map.h"

namespace decoded::server {
namespace {

// "Bearer <token>" with the scheme matched case-insensitively (RFC 7235
// section 2.1) and the token exactly, in time independent of where it differs.
bool IsBearer(std::string_view header, std::string_view token) {
  constexpr std::string_view kScheme = "bearer ";
  if (header.size() != kScheme.size() + token.size()) return false;
  // Debian's Abseil has its own string_view type.
  if (!absl::EqualsIgnoreCase(absl::string_view(header.data(), kScheme.size()),
                              absl::string_view(kScheme.data(), kScheme.size()))) {
    return false;
  }
  unsigned char diff = 0;
  for (size_t i = 0; i < token.size(); ++i) diff |= header[kScheme.size() + i] ^ token[i];
  return diff == 0;
}

}  // namespace

serving::Engine* DecoderService::Ready(const grpc::CallbackServerContext& context, absl::Status* refuse) const {
  if (!auth_token_.empty()) {
    const auto& md = context.client_metadata();
    auto it = md.find("authorization");
    if (it == md.end() || !IsBearer(std::string_view(it->second.data(), it->second.size()), auth_token_)) {
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

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DecoderService::Generate(
    grpc::CallbackServerContext* context) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return new GenerateReactor(engine, metrics_, &streams_, refuse);
}

namespace {

// Finishes a raw unary RPC: with the refusal when the engine is not ready,
// else with the request's parse error, else with the status
// `body(engine, request, &response)` returns; the response is sent on OK only.
template <typename Request, typename Response, typename Body>
grpc::ServerUnaryReactor* RunUnary(grpc::CallbackServerContext* context, serving::Engine* engine,
                                   const absl::Status& refuse, const grpc::ByteBuffer& request_wire,
                                   grpc::ByteBuffer* response_wire, Body body) {
  absl::Status status = refuse;
  if (engine != nullptr) {
    Request request;
    Response response;
    status = ParseRequest(request_wire, &request);
    if (status.ok()) status = body(*engine, request, &response);
    if (status.ok()) status = SerializeResponse(response, response_wire);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

grpc::ServerUnaryReactor* DecoderService::Tokenize(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::TokenizeRequest, v1::TokenizeResponse>(
      context, engine, refuse, *request, response,
      [](serving::Engine& e, const v1::TokenizeRequest& req, v1::TokenizeResponse* resp) {
        std::vector<int32_t> ids = e.Tokenize(req.text(), req.add_bos(), req.parse_special());
        resp->mutable_ids()->Add(ids.begin(), ids.end());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* DecoderService::Detokenize(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::DetokenizeRequest, v1::DetokenizeResponse>(
      context, engine, refuse, *request, response,
      [](serving::Engine& e, const v1::DetokenizeRequest& req, v1::DetokenizeResponse* resp) {
        std::vector<int32_t> ids(req.ids().begin(), req.ids().end());
        absl::StatusOr<std::string> text = e.Detokenize(ids, req.render_special());
        if (text.ok()) resp->set_text(*text);
        return text.status();
      });
}

grpc::ServerUnaryReactor* DecoderService::GetModelInfo(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request, grpc::ByteBuffer* response) {
  absl::Status refuse;
  serving::Engine* engine = Ready(*context, &refuse);
  return RunUnary<v1::GetModelInfoRequest, v1::ModelInfo>(
      context, engine, refuse, *request, response,
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
        resp->set_device(info.device);
        resp->set_cpu_isa(info.cpu_isa);
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
