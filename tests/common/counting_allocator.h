// Counts every global operator new in the process. Linking
// counting_allocator.cc replaces the global allocation functions, so only
// test and benchmark binaries link it (target decoded_alloc_counter).
#ifndef DECODED_TESTS_COMMON_COUNTING_ALLOCATOR_H_
#define DECODED_TESTS_COMMON_COUNTING_ALLOCATOR_H_

#include <cstdint>

namespace decoded::testing {

// operator new / new[] calls so far, from any thread.
int64_t HeapAllocations();

}  // namespace decoded::testing

#endif  // DECODED_TESTS_COMMON_COUNTING_ALLOCATOR_H_
