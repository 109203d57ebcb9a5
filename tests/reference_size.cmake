# The readable forward pass stays readable: src/model/reference.cpp, the file README and
# docs/architecture.md tell a learner to read first, holds the whole decode with a KV cache in at most
# 200 lines (issue 52). Run: cmake -DFILE=<repo>/src/model/reference.cpp -P reference_size.cmake
file(READ "${FILE}" text)
string(REGEX REPLACE "[^\n]" "" newlines "${text}")
string(LENGTH "${newlines}" n)
if(n GREATER 200)
  message(FATAL_ERROR "${FILE}: ${n} lines; the reference forward must stay within 200 (split the fast path, not this)")
endif()
message(STATUS "reference forward: ${n} lines")
