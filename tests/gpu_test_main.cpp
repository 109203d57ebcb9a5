// doctest main for the GPU attention tests (kvlab_gpu_tests).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
