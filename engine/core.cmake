# decoded_core: graph IR, optimizer, CPU backend, KV cache, the shared decode
# driver and the family registry. The model runtime (runtime.cc, which adds
# the tokenizer) is decoded_runtime in models/CMakeLists.txt, beside the families.
add_library(decoded_core
  ${CMAKE_CURRENT_LIST_DIR}/graph/graph.cc
  ${CMAKE_CURRENT_LIST_DIR}/graph/optimizer.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cpu_executor.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/kernels.cc
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cpu_backend.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_cache.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_groups.cc
  ${CMAKE_CURRENT_LIST_DIR}/kv_pool.cc
  ${CMAKE_CURRENT_LIST_DIR}/engine_counters.cc
  ${CMAKE_CURRENT_LIST_DIR}/rope_yarn.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_plans.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_token_host.cc
  ${CMAKE_CURRENT_LIST_DIR}/decode_driver.cc
  ${CMAKE_CURRENT_LIST_DIR}/weights.cc
  ${CMAKE_CURRENT_LIST_DIR}/hparams.cc
  ${CMAKE_CURRENT_LIST_DIR}/model_registry.cc
)
target_include_directories(decoded_core PUBLIC ${PROJECT_SOURCE_DIR})
target_link_libraries(decoded_core PUBLIC decoded_base decoded_gguf decoded_quant
  absl::status absl::statusor absl::strings absl::span absl::synchronization absl::flat_hash_map
  absl::node_hash_map absl::hash absl::function_ref Threads::Threads)
# The f32 op kernels, once per instruction-set tier (cmake/DecodedIsa.cmake);
# cpu/kernels.cc forwards to the tier selected at run time.
decoded_add_isa_objects(decoded_core
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cpu/kernels_isa.cc ${CMAKE_CURRENT_LIST_DIR}/cpu/attention_isa.cc
  LIBRARIES decoded_base absl::function_ref)
