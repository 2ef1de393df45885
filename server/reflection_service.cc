#include "server/reflection_service.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"

namespace decoded::server {
namespace {

namespace pb = google::protobuf;

// One reflection stream: each request read is answered by one response,
// written before the next read starts. Request and Response are the v1 or
// v1alpha messages (the same fields).
template <typename Request, typename Response>
class ReflectionReactor final : public grpc::ServerBidiReactor<Request, Response> {
 public:
  ReflectionReactor(const std::vector<std::string>* services, bool authorized, ClientConnections* progress,
                    std::string peer)
      : services_(services), progress_(progress), peer_(std::move(peer)) {
    if (progress_ != nullptr) progress_->NoteProgress(peer_);
    if (!authorized) {
      this->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "missing or wrong bearer token"));
      return;
    }
    this->StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status::OK);  // the client half-closed, or the call is over
      return;
    }
    if (progress_ != nullptr) progress_->NoteProgress(peer_);
    Answer();
    this->StartWrite(&response_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      this->Finish(grpc::Status::CANCELLED);
      return;
    }
    this->StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  void Answer() {
    response_.Clear();
    response_.set_valid_host(request_.host());
    *response_.mutable_original_request() = request_;
    const pb::DescriptorPool* pool = pb::DescriptorPool::generated_pool();
    switch (request_.message_request_case()) {
      case Request::kListServices:
        for (const std::string& name : *services_) {
          response_.mutable_list_services_response()->add_service()->set_name(name);
        }
        break;
      case Request::kFileByFilename:
        SendFile(pool->FindFileByName(request_.file_by_filename()), request_.file_by_filename());
        break;
      case Request::kFileContainingSymbol:
        SendFile(pool->FindFileContainingSymbol(request_.file_containing_symbol()),
                 request_.file_containing_symbol());
        break;
      case Request::kFileContainingExtension: {
        const auto& ext = request_.file_containing_extension();
        const pb::Descriptor* type = pool->FindMessageTypeByName(ext.containing_type());
        const pb::FieldDescriptor* field =
            type == nullptr ? nullptr : pool->FindExtensionByNumber(type, ext.extension_number());
        SendFile(field == nullptr ? nullptr : field->file(),
                 absl::StrCat(ext.containing_type(), " extension ", ext.extension_number()));
        break;
      }
      case Request::kAllExtensionNumbersOfType: {
        const pb::Descriptor* type = pool->FindMessageTypeByName(request_.all_extension_numbers_of_type());
        if (type == nullptr) {
          Error(grpc::StatusCode::NOT_FOUND, absl::StrCat("type ", request_.all_extension_numbers_of_type()));
          break;
        }
        std::vector<const pb::FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        auto* out = response_.mutable_all_extension_numbers_response();
        out->set_base_type_name(type->full_name());
        for (const pb::FieldDescriptor* f : extensions) out->add_extension_number(f->number());
        break;
      }
      default:
        Error(grpc::StatusCode::UNIMPLEMENTED, "the request names no known reflection query");
    }
  }

  // `file` and every file it imports, each once (as gRPC's own reflection
  // does, per request: a client may not keep what an earlier answer held).
  void SendFile(const pb::FileDescriptor* file, const std::string& what) {
    if (file == nullptr) {
      Error(grpc::StatusCode::NOT_FOUND, absl::StrCat(what, " is not known to this server"));
      return;
    }
    auto* out = response_.mutable_file_descriptor_response();
    absl::flat_hash_set<std::string> sent;
    std::vector<const pb::FileDescriptor*> todo = {file};
    while (!todo.empty()) {
      const pb::FileDescriptor* f = todo.back();
      todo.pop_back();
      if (!sent.insert(f->name()).second) continue;
      pb::FileDescriptorProto proto;
      f->CopyTo(&proto);
      proto.SerializeToString(out->add_file_descriptor_proto());
      for (int i = 0; i < f->dependency_count(); ++i) todo.push_back(f->dependency(i));
    }
  }

  void Error(grpc::StatusCode code, const std::string& message) {
    auto* error = response_.mutable_error_response();
    error->set_error_code(static_cast<int32_t>(code));
    error->set_error_message(message);
  }

  const std::vector<std::string>* services_;
  ClientConnections* const progress_;
  const std::string peer_;
  Request request_;
  Response response_;
};

}  // namespace

grpc::ServerBidiReactor<grpc::reflection::v1::ServerReflectionRequest, grpc::reflection::v1::ServerReflectionResponse>*
ReflectionV1Service::ServerReflectionInfo(grpc::CallbackServerContext* context) {
  return new ReflectionReactor<grpc::reflection::v1::ServerReflectionRequest,
                               grpc::reflection::v1::ServerReflectionResponse>(&services_, authorized_(*context),
                                                                               progress_, context->peer());
}

grpc::ServerBidiReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                        grpc::reflection::v1alpha::ServerReflectionResponse>*
ReflectionV1AlphaService::ServerReflectionInfo(grpc::CallbackServerContext* context) {
  return new ReflectionReactor<grpc::reflection::v1alpha::ServerReflectionRequest,
                               grpc::reflection::v1alpha::ServerReflectionResponse>(
      &services_, authorized_(*context), progress_, context->peer());
}

}  // namespace decoded::server
