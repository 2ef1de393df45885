// Bounds-checked little-endian reads over an immutable byte range.
//
// The GGUF parser reads every header, metadata and tensor-info field through
// this cursor, so a truncated or corrupted file yields an INVALID_ARGUMENT that
// names the byte offset of the failed read instead of reading past the end.
// Callers prefix the message with what they were parsing (key, tensor).
//
// Views are absl::string_view: the packaged Abseil's string_view is its own
// type, and absl::StrCat and the metadata maps take it directly.
//
// A ByteCursor never owns its bytes; the range must outlive it. A failed read
// leaves the position unchanged. Not thread-safe (one parser, one cursor).
#ifndef DECODED_ENGINE_GGUF_BYTE_CURSOR_H_
#define DECODED_ENGINE_GGUF_BYTE_CURSOR_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace decoded {

// GGUF files are little-endian by default; values are memcpy'd as-is, which is
// only correct on a little-endian host.
static_assert(std::endian::native == std::endian::little,
              "the GGUF reader assumes a little-endian host");

class ByteCursor {
 public:
  // `data` may be null only when `size` is 0.
  ByteCursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  // Reads one trivially copyable little-endian value of type T. `what` names
  // the field for the error message.
  template <typename T>
  absl::StatusOr<T> Read(absl::string_view what) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (absl::Status s = Need(sizeof(T), what); !s.ok()) return s;
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  // Returns a view of the next `n` bytes (into the underlying range).
  absl::StatusOr<absl::string_view> ReadBytes(uint64_t n, absl::string_view what) {
    if (absl::Status s = Need(n, what); !s.ok()) return s;
    absl::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return v;
  }

  // Reads a GGUF string: uint64 byte length, then that many bytes (no NUL).
  // On failure the position is unchanged.
  absl::StatusOr<absl::string_view> ReadString(absl::string_view what) {
    const size_t start = pos_;
    absl::StatusOr<uint64_t> len = Read<uint64_t>(what);
    if (!len.ok()) return len.status();
    absl::StatusOr<absl::string_view> bytes = ReadBytes(*len, what);
    if (!bytes.ok()) pos_ = start;
    return bytes;
  }

 private:
  absl::Status Need(uint64_t n, absl::string_view what) const {
    if (n <= remaining()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "truncated at byte offset ", pos_, ": ", what, " needs ", n, " bytes, ",
        remaining(), " remain"));
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

}  // namespace decoded

#endif  // DECODED_ENGINE_GGUF_BYTE_CURSOR_H_
