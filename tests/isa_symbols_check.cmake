# Fails if a kernel object compiled for tier TIER defines an external symbol
# outside that tier's namespace (decoded::...::TIER::). Such a symbol (an
# inline function of a shared header, a template instance emitted out of line)
# is a weak definition the linker may keep from this object for every caller,
# so baseline code could run AVX-512 instructions: see engine/isa_namespace.h.
#   cmake -DNM=<nm> -DTIER=<tier> -DOBJECTS=<obj>|<obj>... -P isa_symbols_check.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(bad "")
set(checked 0)
foreach(obj IN LISTS objects)
  execute_process(COMMAND ${NM} --demangle --defined-only --extern-only ${obj}
                  OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${obj}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(line IN LISTS lines)
    # "<address> <type> <name>"; the name may contain spaces.
    if(NOT line MATCHES "^[0-9a-fA-F]* [A-Za-z] (.*)$")
      continue()
    endif()
    set(name "${CMAKE_MATCH_1}")
    math(EXPR checked "${checked} + 1")
    # Template functions demangle with their return type first.
    if(name MATCHES "^([^(]* )?decoded::([A-Za-z0-9_]+::)*${TIER}::")
      continue()
    endif()
    # DW.ref.__gxx_personality_v0: the compiler's weak *data* word pointing at
    # the C++ unwinder's personality routine (emitted where a function has a
    # cleanup landing pad, e.g. under the sanitizers); it holds an address, no
    # code of this tier.
    if(name MATCHES "^DW\\.ref\\.__gxx_personality_v0$")
      continue()
    endif()
    string(APPEND bad "\n  ${obj}: ${name}")
  endforeach()
endforeach()
if(checked EQUAL 0)
  message(FATAL_ERROR "no symbols found in ${OBJECTS}")
endif()
if(NOT bad STREQUAL "")
  message(FATAL_ERROR "symbols outside namespace ${TIER} in ${TIER} kernel objects:${bad}")
endif()
message(STATUS "${checked} external symbols, all in namespace ${TIER}")
