# The real Gemma 3 270M architecture on the all-F32 copy of its weights against
# HF transformers (tools/make_f32_model.py, tools/gen_f32_hf_reference.py).
# Included from tests/models/CMakeLists.txt.
add_executable(gemma3_f32_reference_test ${CMAKE_CURRENT_LIST_DIR}/gemma3_f32_reference_test.cc)
target_link_libraries(gemma3_f32_reference_test PRIVATE decoded_families decoded_test_common nlohmann_json::nlohmann_json)
gtest_discover_tests(gemma3_f32_reference_test DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 600)
