# Kernel tiers (engine/cpu_isa.h). Everything is compiled for the baseline
# -march (DECODED_BASELINE_ARCH); the kernel sources are compiled once more
# per tier, with that tier's flags appended (a later -march wins) and
# -DDECODED_ISA_NS=<tier>, which puts each copy in its own namespace. The
# process picks one tier at run time from CPUID, so one binary runs on any
# x86-64 CPU and uses AVX-512 where the CPU has it. A tier's flags must match
# what CpuSupports() checks for it in engine/cpu_isa.cc.
set(DECODED_ISA_TIERS scalar avx2 avx512vnni)
set(DECODED_ISA_FLAGS_scalar "")
set(DECODED_ISA_FLAGS_avx2 -march=x86-64-v3)
set(DECODED_ISA_FLAGS_avx512vnni -march=x86-64-v4 -mavx512vnni)

# decoded_add_isa_objects(<target> SOURCES <files> [LIBRARIES <libs>])
# Adds to <target> one copy of SOURCES per tier: OBJECT libraries
# <target>_<tier> compiled with the tier's flags, using LIBRARIES' usage
# requirements (include directories). Those of the non-baseline tiers are
# recorded in the global property DECODED_ISA_OBJECT_LIBRARIES for the symbol
# check (tests/isa_symbols_check.cmake).
function(decoded_add_isa_objects target)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBRARIES" ${ARGN})
  foreach(tier IN LISTS DECODED_ISA_TIERS)
    set(obj ${target}_${tier})
    add_library(${obj} OBJECT ${ARG_SOURCES})
    target_compile_definitions(${obj} PRIVATE DECODED_ISA_NS=${tier})
    target_compile_options(${obj} PRIVATE ${DECODED_ISA_FLAGS_${tier}})
    target_link_libraries(${obj} PRIVATE ${ARG_LIBRARIES})
    target_sources(${target} PRIVATE $<TARGET_OBJECTS:${obj}>)
    if(NOT tier STREQUAL "scalar")
      set_property(GLOBAL APPEND PROPERTY DECODED_ISA_OBJECT_LIBRARIES ${obj})
    endif()
  endforeach()
endfunction()
