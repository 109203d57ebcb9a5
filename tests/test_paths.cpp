#include "test_paths.hpp"

namespace kvlab::test {

const char* const test_data_dir = KVLAB_TEST_DATA_DIR;
const char* const models_dir = KVLAB_MODELS_DIR;
const char* const docs_dir = KVLAB_DOCS_DIR;

}  // namespace kvlab::test
