// One turn of a conversation, as chat templates see it (Hugging Face's {"role": ..., "content": ...}).
#ifndef DECODED_ENGINE_CHAT_CHAT_MESSAGE_H_
#define DECODED_ENGINE_CHAT_CHAT_MESSAGE_H_

#include <string>

namespace decoded {

struct ChatMessage {
  std::string role;     // "system", "user", "assistant", "tool", ...: passed to the template as is
  std::string content;  // UTF-8
};

}  // namespace decoded

#endif  // DECODED_ENGINE_CHAT_CHAT_MESSAGE_H_
