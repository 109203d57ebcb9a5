// Where the unit tests find the source tree's data: set by CMake on test_paths.cpp alone, so the other
// test sources carry no path of this clone in their flags (ccache then shares their objects across clones).
#pragma once

namespace kvlab::test {

extern const char* const test_data_dir;  // tests/data
extern const char* const models_dir;     // models/
extern const char* const docs_dir;       // docs/

}  // namespace kvlab::test
